"""Common shape of a hand-off protocol."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class InstanceAddr:
    """What a protocol may need to know about an instance: where it is and its bootstrap port."""

    url: str
    host: str
    port: int
    bootstrap_port: int | None = None


class HandoffProtocol(abc.ABC):
    """Builds the prefill and decode payloads for one request.

    ``concurrent`` says whether the server sends both at once (Mooncake-vLLM, SGLang: the decode
    side pulls KV through a bootstrap rendezvous) or prefill first and then decode with what the
    prefill answered (vLLM NixlConnector convention).
    """

    name: str = "base"
    concurrent: bool = False
    #: the server must look up the prefill's engine ids (bootstrap ``/query``) before building
    #: the payloads and put ``dp_rank`` / ``remote_engine_id`` into the context.
    needs_engine_id: bool = False

    def prefill_headers(self, ctx: dict[str, Any]) -> dict[str, str]:
        """Extra HTTP headers for the prefill request."""
        return {}

    def is_concurrent(self, prefill: InstanceAddr) -> bool:
        """Whether this request to ``prefill`` goes concurrently (default: ``concurrent``)."""
        return self.concurrent

    def on_prefill_answer(self, prefill: InstanceAddr, answer: dict[str, Any]) -> None:
        """Called with every successful prefill answer (a protocol may learn from it)."""

    def new_context(self, request_id: str) -> dict[str, Any]:
        """Per-request values shared by both payloads (transfer id, bootstrap room...)."""
        return {}

    def recompute_reason(self, prefill_response: dict[str, Any]) -> str | None:
        """Why the decode will recompute the prompt instead of loading its KV, judged from the
        prefill's answer (sequential hand-off), or None when the hand-off carries KV. The proxy
        counts these (``mooncake_proxy_decode_recomputes_total``): the request still succeeds,
        only slower, so nothing else would show it."""
        return None

    @abc.abstractmethod
    def prefill_payload(self, body: dict[str, Any], route: str, prefill: InstanceAddr,
                        ctx: dict[str, Any]) -> dict[str, Any]:
        """JSON body sent to the prefill instance."""

    @abc.abstractmethod
    def decode_payload(self, body: dict[str, Any], route: str, prefill: InstanceAddr,
                       ctx: dict[str, Any], prefill_response: dict[str, Any] | None) -> dict[str, Any]:
        """JSON body sent to the decode instance (``prefill_response`` is None when concurrent)."""


def missing_kv_params(prefill_response: dict[str, Any]) -> str | None:
    """``recompute_reason`` of the protocols whose prefill answer carries ``kv_transfer_params``."""
    params = prefill_response.get("kv_transfer_params") if isinstance(prefill_response, dict) else None
    return None if isinstance(params, dict) and params else "no_kv_transfer_params"


def one_token_prefill(body: dict[str, Any], route: str) -> dict[str, Any]:
    """Copy of the client's request that makes the engine stop after the first token.

    Streaming is off (the proxy only needs the final JSON) and ``stream_options`` is dropped
    because engines reject it without ``stream``.
    """
    out = dict(body)
    out["stream"] = False
    out["max_tokens"] = 1
    if route.endswith("/chat/completions") or "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out.pop("stream_options", None)
    return out


def remote_decode_prefill(body: dict[str, Any], route: str, **params: Any) -> dict[str, Any]:
    """:func:`one_token_prefill` plus vLLM's ``kv_transfer_params`` for "prefill here, decode
    elsewhere" (``do_remote_decode``), extended by the protocol's own ``params``."""
    out = one_token_prefill(body, route)
    out["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False, **params}
    return out
