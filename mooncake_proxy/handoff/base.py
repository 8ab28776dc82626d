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

    @abc.abstractmethod
    def prefill_payload(self, body: dict[str, Any], route: str, prefill: InstanceAddr,
                        ctx: dict[str, Any]) -> dict[str, Any]:
        """JSON body sent to the prefill instance."""

    @abc.abstractmethod
    def decode_payload(self, body: dict[str, Any], route: str, prefill: InstanceAddr,
                       ctx: dict[str, Any], prefill_response: dict[str, Any] | None) -> dict[str, Any]:
        """JSON body sent to the decode instance (``prefill_response`` is None when concurrent)."""


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
