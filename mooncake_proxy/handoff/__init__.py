"""Prefill→decode hand-off protocols, one module each.

A protocol only *builds* the payloads each instance receives (pure functions of the client's
request and the chosen pair); the server does the I/O. Keeping this pure lets tests assert the
exact fields without sockets, and lets a new framework's convention be added as one module --
here, or in another distribution as a ``mooncake_handoff_protocols`` plugin (docs/plugins.md).
"""

from __future__ import annotations

from mooncake_core.plugins import NamedFactory, handoff_protocols, hookimpl

from ..builtin_plugin import BuiltinPlugin
from .base import HandoffProtocol, InstanceAddr
from .mooncake import MooncakeHandoff
from .mooncake_core import MooncakeCoreHandoff
from .sglang import SglangHandoff
from .vllm import VllmHandoff

#: the built-in protocols, registered with the plugin manager as the first plugin
BUILTIN_HANDOFFS: tuple[type[HandoffProtocol], ...] = (VllmHandoff, MooncakeHandoff, SglangHandoff,
                                                         MooncakeCoreHandoff)
HANDOFFS: dict[str, type[HandoffProtocol]] = {c.name: c for c in BUILTIN_HANDOFFS}


class _BuiltinHandoffs:
    @hookimpl
    def mooncake_handoff_protocols(self) -> list[NamedFactory]:
        return [NamedFactory(cls.name, cls, (cls.__doc__ or "").strip().split("\n")[0])
                for cls in BUILTIN_HANDOFFS]


_BUILTIN = BuiltinPlugin("mooncake_proxy.handoff", _BuiltinHandoffs())


def handoffs() -> dict[str, NamedFactory]:
    """Every registered protocol by ``--handoff`` name: the built-ins, then plugins'."""
    _BUILTIN.ensure()
    return handoff_protocols()


def make_handoff(name: str) -> HandoffProtocol:
    """Instantiate a protocol by its ``--handoff`` name (built-in or a plugin's, see
    docs/plugins.md); ValueError lists the registered ones."""
    table = handoffs()
    f = table.get(name)
    if f is None:
        raise ValueError(f"unknown hand-off protocol {name!r}; choose one of {sorted(table)}")
    proto = f.factory()
    if not isinstance(proto, HandoffProtocol):
        raise TypeError(f"hand-off plugin {name!r} built a {type(proto).__name__}, not a HandoffProtocol")
    return proto


__all__ = ["BUILTIN_HANDOFFS", "HANDOFFS", "HandoffProtocol", "InstanceAddr", "MooncakeCoreHandoff", "MooncakeHandoff",
           "SglangHandoff", "VllmHandoff", "handoffs", "make_handoff"]
