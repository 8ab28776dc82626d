"""Prefill→decode hand-off protocols, one module each.

A protocol only *builds* the payloads each instance receives (pure functions of the client's
request and the chosen pair); the server does the I/O. Keeping this pure lets tests assert the
exact fields without sockets, and lets a new framework's convention be added as one module --
here, or in another distribution as a ``mooncake_handoff_protocols`` plugin (docs/plugins.md).
"""

from __future__ import annotations

from .base import HandoffProtocol, InstanceAddr
from .mooncake import MooncakeHandoff
from .mooncake_core import MooncakeCoreHandoff
from .sglang import SglangHandoff
from .vllm import VllmHandoff

#: the built-in protocols, registered as a plugin by mooncake_proxy.plugins
BUILTIN_HANDOFFS: tuple[type[HandoffProtocol], ...] = (VllmHandoff, MooncakeHandoff, SglangHandoff,
                                                         MooncakeCoreHandoff)
HANDOFFS: dict[str, type[HandoffProtocol]] = {c.name: c for c in BUILTIN_HANDOFFS}


def make_handoff(name: str) -> HandoffProtocol:
    """Instantiate a protocol by its ``--handoff`` name (built-in or a plugin's, see
    docs/plugins.md); ValueError lists the registered ones."""
    from mooncake_proxy.plugins import handoffs

    table = handoffs()
    f = table.get(name)
    if f is None:
        raise ValueError(f"unknown hand-off protocol {name!r}; choose one of {sorted(table)}")
    proto = f.factory()
    if not isinstance(proto, HandoffProtocol):
        raise TypeError(f"hand-off plugin {name!r} built a {type(proto).__name__}, not a HandoffProtocol")
    return proto


__all__ = ["BUILTIN_HANDOFFS", "HANDOFFS", "HandoffProtocol", "InstanceAddr", "MooncakeCoreHandoff", "MooncakeHandoff",
           "SglangHandoff", "VllmHandoff", "make_handoff"]
