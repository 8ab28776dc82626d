"""Typed inputs and outputs of the scheduler (plain dataclasses, no I/O).

These are the contract between the live proxy, the simulator and the scheduling policies:
the proxy/simulator describe a request (:class:`RequestInfo`) and the instances
(:class:`InstanceInfo`); a policy answers with a :class:`Decision` or a :class:`Rejection`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Role", "ROLES", "RequestInfo", "InstanceInfo", "Decision", "Rejection", "SloConfig"]

Role = Literal["prefill", "decode"]
ROLES: tuple[str, ...] = ("prefill", "decode")


@dataclass(slots=True)
class RequestInfo:
    """What the scheduler needs to know about one request.

    ``prompt_tokens``: prompt length in tokens (exact or approximated, see
    :meth:`BlockHasher.approx_tokens`). ``block_hashes``: chained prefix keys of its full
    blocks (:class:`BlockHasher`, or a trace's ``hash_ids``). ``max_output_tokens`` drives the
    decode load estimate; ``arrival`` is the caller's clock (seconds) at arrival.
    """

    request_id: str
    prompt_tokens: int
    block_hashes: list[int] = field(default_factory=list)
    max_output_tokens: int = 128
    arrival: float = 0.0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0:
            raise ValueError(f"request {self.request_id!r}: prompt_tokens must be >= 0, got {self.prompt_tokens}")
        if self.max_output_tokens < 0:
            raise ValueError(
                f"request {self.request_id!r}: max_output_tokens must be >= 0, got {self.max_output_tokens}")


@dataclass(slots=True)
class InstanceInfo:
    """One serving instance as the scheduler sees it.

    ``cache_capacity_blocks``: for a prefill instance, how many prefix blocks its KV cache
    keeps (LRU beyond that); for a decode instance, how many blocks of KV it can hold for
    running requests (admission limit). 0 means unlimited.
    """

    instance_id: str
    role: Role
    cache_capacity_blocks: int = 0
    healthy: bool = True

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"instance {self.instance_id!r}: role must be one of {ROLES}, got {self.role!r}")
        if self.cache_capacity_blocks < 0:
            raise ValueError(
                f"instance {self.instance_id!r}: cache_capacity_blocks must be >= 0 (0 = unlimited), "
                f"got {self.cache_capacity_blocks}")


@dataclass(frozen=True, slots=True)
class Decision:
    """Where to run a request, and what the scheduler expects to happen.

    ``cached_blocks``: leading prompt blocks the prefill will NOT recompute (held locally plus
    those fetched from ``remote_source``). ``remote_source``: an instance id, ``"store"`` or
    None; ``remote_blocks``: how many blocks to fetch from it before prefilling (the caller
    should make the prefill instance load them — Mooncake Store / Transfer Engine).
    ``est_queue_s``: predicted wait before the prefill starts. ``replicate_blocks``: when hot
    prefix replication is on, how many leading blocks the caller should copy into the store.
    ``est_first_token_s``: when a TTFT SLO is checked, the predicted time to the client's first
    token (prefill, hand-off; no safety margin) that the check used -- the caller feeds the
    observed TTFT back against it (``ClusterState.ttft_errors``); -1 when not predicted.
    ``waits_behind``: the prefill instance had other requests when this one was admitted (the
    TTFT errors of such requests are also learned as a class of their own, ttft_error.py).
    """

    prefill_id: str
    decode_id: str
    est_ttft_s: float
    est_tbt_s: float
    cached_blocks: int = 0
    remote_source: str | None = None
    remote_blocks: int = 0
    est_queue_s: float = 0.0
    replicate_blocks: int = 0
    est_first_token_s: float = -1.0
    waits_behind: bool = False


@dataclass(frozen=True, slots=True)
class Rejection:
    """Early rejection: serve HTTP 429 with ``Retry-After: retry_after_s`` (or 503 when no
    instance is healthy) instead of admitting a request that would break its SLO and slow
    everyone else down. ``reason`` is human-readable and names the instance and numbers."""

    reason: str
    retry_after_s: float
    est_ttft_s: float | None = None
    est_tbt_s: float | None = None


@dataclass(frozen=True, slots=True)
class SloConfig:
    """Service-level objectives. None = no limit.

    ``prediction_horizon_s`` turns on the paper's prediction-based early rejection: the TBT
    check uses the decode load projected to the moment this request would join the decode
    instance (now + predicted TTFT, at most this far ahead) — counting requests still in
    prefill that are headed there and dropping decodes expected to have finished — instead
    of the load right now, which lags by a whole prefill and causes admit/reject oscillation.
    """

    ttft_s: float | None = None
    tbt_s: float | None = None
    retry_after_s: float = 1.0
    prediction_horizon_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tbt_s", "prediction_horizon_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"SloConfig.{name} must be > 0 or None, got {v!r}")
        if not self.retry_after_s >= 0:
            raise ValueError(f"SloConfig.retry_after_s must be >= 0, got {self.retry_after_s!r}")
