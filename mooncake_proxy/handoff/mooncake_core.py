"""Concurrent hand-off for our vLLM ``MooncakeCoreConnector`` (``--handoff mooncake-core``).

The prefill and the decode request are sent at the same time, sharing a transfer id the proxy
picks: the decode's engine allocates its blocks and asks the prefill's worker for the KV while
the prefill still computes, and reads it the moment the prefill's worker announces the blocks
(a Transfer Engine ``ready`` notification) -- instead of waiting for the prefill's HTTP answer
to travel back through the proxy and the decode's API server first.

The decode has to know the prefill worker's Transfer Engine segment, which only the prefill's
answer tells. So the first request to each prefill instance goes sequentially (exactly the
``vllm`` hand-off) and every answer refreshes the segment kept for that instance; a restarted
prefill (new segment) costs the requests sent meanwhile a recompute on the decode, then the
next answer corrects it.
"""

from __future__ import annotations

import uuid
from typing import Any

from mooncake_core.pd.params import concurrent_decode_params, concurrent_prefill_params

from .base import HandoffProtocol, InstanceAddr, missing_kv_params, one_token_prefill, remote_decode_prefill


class MooncakeCoreHandoff(HandoffProtocol):
    """Prefill and decode at once for MooncakeCoreConnector (after one sequential request per prefill)."""

    name = "mooncake-core"
    concurrent = True

    def __init__(self) -> None:
        self._segments: dict[str, str] = {}  # prefill url -> its worker's segment (from its last answer)

    def new_context(self, request_id: str) -> dict[str, Any]:
        return {"transfer_id": f"mc-{uuid.uuid4().hex}"}

    def is_concurrent(self, prefill: InstanceAddr) -> bool:
        return prefill.url in self._segments

    def on_prefill_answer(self, prefill: InstanceAddr, answer: dict[str, Any]) -> None:
        params = answer.get("kv_transfer_params")
        seg = params.get("mooncake_segment") if isinstance(params, dict) else None
        if isinstance(seg, str) and seg:
            self._segments[prefill.url] = seg

    def prefill_payload(self, body: dict[str, Any], route: str, prefill: InstanceAddr,
                        ctx: dict[str, Any]) -> dict[str, Any]:
        if not self.is_concurrent(prefill):
            return remote_decode_prefill(body, route)
        out = one_token_prefill(body, route)
        out["kv_transfer_params"] = concurrent_prefill_params(ctx["transfer_id"])
        return out

    def recompute_reason(self, prefill_response: dict[str, Any]) -> str | None:
        return missing_kv_params(prefill_response)

    def decode_payload(self, body: dict[str, Any], route: str, prefill: InstanceAddr,
                       ctx: dict[str, Any], prefill_response: dict[str, Any] | None) -> dict[str, Any]:
        out = dict(body)
        if prefill_response is not None:  # sequential (first request to this prefill)
            params = prefill_response.get("kv_transfer_params")
            if params is not None:
                out["kv_transfer_params"] = params
            return out
        out["kv_transfer_params"] = concurrent_decode_params(ctx["transfer_id"], self._segments[prefill.url])
        return out
