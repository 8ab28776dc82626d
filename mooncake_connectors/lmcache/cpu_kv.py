"""``ContiguousCpuKV``: LMCache's KV copy interface over one contiguous CPU tensor.

LMCache moves KV between its memory objects and the serving engine through a
``GPUConnectorInterface``; it ships none for CPU memory (``CreateGPUConnector`` raises
"No supported cpu connector found"), so an ``LMCacheEngine`` on a CPU host needs one. This
one serves a ``[2, num_layers, num_tokens, hidden]`` tensor (LMCache's ``KV_2LTD`` chunk
layout), token ``t`` at index ``t``: enough to drive ``LMCacheEngine.store / lookup /
retrieve`` in tests, benchmarks and standalone tools. It is not vLLM's paged CPU layout
(see docs/lmcache.md for why that cannot be plugged into vLLM's LMCacheConnectorV1).
"""

from __future__ import annotations

from typing import Any

import torch
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface

__all__ = ["ContiguousCpuKV"]


class ContiguousCpuKV(GPUConnectorInterface):
    """Copies ``kv[:, :, start:end, :]`` to/from LMCache memory objects."""

    def __init__(self, kv: torch.Tensor):
        if kv.dim() != 4 or kv.shape[0] != 2 or kv.device.type != "cpu":
            raise ValueError(f"ContiguousCpuKV: expected a CPU tensor [2, layers, tokens, hidden], got "
                             f"{tuple(kv.shape)} on {kv.device}")
        self.kv = kv
        self.kvcaches = None

    def _span(self, start: int, end: int) -> torch.Tensor:
        if not 0 <= start <= end <= self.kv.shape[2]:
            raise ValueError(f"ContiguousCpuKV: tokens [{start}, {end}) outside [0, {self.kv.shape[2]})")
        return self.kv[:, :, start:end, :]

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        memory_obj.tensor.copy_(self._span(start, end))

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        self._span(start, end).copy_(memory_obj.tensor)

    def batched_from_gpu(self, memory_objs: Any, starts: Any, ends: Any, **kwargs: Any) -> None:
        for obj, s, e in zip(memory_objs, starts, ends):
            self.from_gpu(obj, s, e)

    def batched_to_gpu(self, memory_objs: Any, starts: Any, ends: Any, **kwargs: Any) -> None:
        for obj, s, e in zip(memory_objs, starts, ends):
            self.to_gpu(obj, s, e)

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, self.kv.shape[1], num_tokens, self.kv.shape[3]])
