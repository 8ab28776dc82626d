"""SGLang PD hand-off (as SGLang's mini load balancer does it).

The same request goes to prefill and decode concurrently, both carrying ``bootstrap_host`` and
``bootstrap_port`` of the prefill instance's bootstrap server and a random 63-bit
``bootstrap_room`` that pairs the two sides. The client sees the decode instance's answer.
"""

from __future__ import annotations

import random
from typing import Any

from .base import HandoffProtocol, InstanceAddr

DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang --disaggregation-bootstrap-port default


class SglangHandoff(HandoffProtocol):
    name = "sglang"
    concurrent = True

    def __init__(self) -> None:
        self._rng = random.SystemRandom()

    def new_context(self, request_id: str) -> dict[str, Any]:
        return {"bootstrap_room": self._rng.getrandbits(63)}

    def _with_bootstrap(self, body: dict[str, Any], prefill: InstanceAddr, ctx: dict[str, Any]) -> dict[str, Any]:
        out = dict(body)
        out["bootstrap_host"] = prefill.host
        out["bootstrap_port"] = prefill.bootstrap_port or DEFAULT_BOOTSTRAP_PORT
        out["bootstrap_room"] = ctx["bootstrap_room"]
        return out

    def prefill_payload(self, body: dict[str, Any], route: str, prefill: InstanceAddr,
                        ctx: dict[str, Any]) -> dict[str, Any]:
        return self._with_bootstrap(body, prefill, ctx)

    def decode_payload(self, body: dict[str, Any], route: str, prefill: InstanceAddr,
                       ctx: dict[str, Any], prefill_response: dict[str, Any] | None) -> dict[str, Any]:
        return self._with_bootstrap(body, prefill, ctx)
