"""Mooncake-vLLM style hand-off (vLLM's MooncakeConnector proxy convention).

Prefill and decode are sent at the same time, both carrying the same ``transfer_id``
(``xfer-<request id>``), which is what the two connectors pair on. The decode side also gets
the prefill's bootstrap address (``remote_bootstrap_addr``) and engine id (``remote_engine_id``
of the chosen data-parallel rank, which the server learns from the bootstrap server's
``/query``); the prefill request is pinned to that rank with ``X-data-parallel-rank``.
``bootstrap_server_host``/``bootstrap_server_port`` are sent too: earlier connector versions
read those instead, newer ones ignore them.
"""

from __future__ import annotations

from typing import Any

from .base import HandoffProtocol, InstanceAddr, remote_decode_prefill

DEFAULT_BOOTSTRAP_PORT = 8998  # VLLM_MOONCAKE_BOOTSTRAP_PORT default


def bootstrap_url(prefill: InstanceAddr) -> str:
    host = f"[{prefill.host}]" if ":" in prefill.host else prefill.host
    return f"http://{host}:{prefill.bootstrap_port or DEFAULT_BOOTSTRAP_PORT}"


class MooncakeHandoff(HandoffProtocol):
    name = "mooncake"
    concurrent = True
    needs_engine_id = True

    def new_context(self, request_id: str) -> dict[str, Any]:
        return {"transfer_id": f"xfer-{request_id}", "dp_rank": None, "remote_engine_id": None}

    def prefill_headers(self, ctx: dict[str, Any]) -> dict[str, str]:
        return {} if ctx.get("dp_rank") is None else {"X-data-parallel-rank": str(ctx["dp_rank"])}

    def prefill_payload(self, body: dict[str, Any], route: str, prefill: InstanceAddr,
                        ctx: dict[str, Any]) -> dict[str, Any]:
        return remote_decode_prefill(body, route, transfer_id=ctx["transfer_id"])

    def decode_payload(self, body: dict[str, Any], route: str, prefill: InstanceAddr,
                       ctx: dict[str, Any], prefill_response: dict[str, Any] | None) -> dict[str, Any]:
        out = dict(body)
        params: dict[str, Any] = {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "transfer_id": ctx["transfer_id"],
            "remote_bootstrap_addr": bootstrap_url(prefill),
            "bootstrap_server_host": prefill.host,
            "bootstrap_server_port": prefill.bootstrap_port or DEFAULT_BOOTSTRAP_PORT,
        }
        if ctx.get("remote_engine_id") is not None:
            params["remote_engine_id"] = ctx["remote_engine_id"]
        out["kv_transfer_params"] = params
        return out
