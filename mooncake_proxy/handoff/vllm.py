"""vLLM NixlConnector-style hand-off (also what our vLLM connector speaks).

Prefill first with ``max_tokens=1`` and ``do_remote_decode``; the prefill's JSON answer carries
``kv_transfer_params`` (remote engine id, host, port, block ids) which the decode request then
carries so the decode engine pulls the KV instead of recomputing it.
"""

from __future__ import annotations

from typing import Any

from .base import HandoffProtocol, InstanceAddr, missing_kv_params, remote_decode_prefill


class VllmHandoff(HandoffProtocol):
    name = "vllm"
    concurrent = False

    def prefill_payload(self, body: dict[str, Any], route: str, prefill: InstanceAddr,
                        ctx: dict[str, Any]) -> dict[str, Any]:
        return remote_decode_prefill(body, route, remote_engine_id=None, remote_block_ids=None,
                                     remote_host=None, remote_port=None)

    def recompute_reason(self, prefill_response: dict[str, Any]) -> str | None:
        return missing_kv_params(prefill_response)

    def decode_payload(self, body: dict[str, Any], route: str, prefill: InstanceAddr,
                       ctx: dict[str, Any], prefill_response: dict[str, Any] | None) -> dict[str, Any]:
        out = dict(body)
        params = (prefill_response or {}).get("kv_transfer_params")
        if params is not None:
            out["kv_transfer_params"] = params
        return out
