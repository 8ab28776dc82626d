"""Prefill→decode hand-off protocols, one module each.

A protocol only *builds* the payloads each instance receives (pure functions of the client's
request and the chosen pair); the server does the I/O. Keeping this pure lets tests assert the
exact fields without sockets, and lets a new framework's convention be added as one module.
"""

from __future__ import annotations

from .base import HandoffProtocol, InstanceAddr
from .mooncake import MooncakeHandoff
from .sglang import SglangHandoff
from .vllm import VllmHandoff

HANDOFFS: dict[str, type[HandoffProtocol]] = {
    "vllm": VllmHandoff,
    "mooncake": MooncakeHandoff,
    "sglang": SglangHandoff,
}


def make_handoff(name: str) -> HandoffProtocol:
    """Instantiate a protocol by its ``--handoff`` name; ValueError lists the valid ones."""
    try:
        return HANDOFFS[name]()
    except KeyError:
        raise ValueError(f"unknown hand-off protocol {name!r}; choose one of {sorted(HANDOFFS)}") from None


__all__ = ["HANDOFFS", "HandoffProtocol", "InstanceAddr", "MooncakeHandoff", "SglangHandoff",
           "VllmHandoff", "make_handoff"]
