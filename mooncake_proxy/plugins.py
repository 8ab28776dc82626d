"""The proxy's built-in hand-off protocols and scheduling policies, as mooncake_core plugins.

They go through the same plugin manager as third-party ones (``mooncake_handoff_protocols``,
``mooncake_scheduler_policies``; docs/plugins.md), so ``--handoff`` / ``--policy`` accept a
name a distribution adds with an entry point. mooncake_core never imports this package: the
proxy hands its built-ins to the manager with ``add_builtins`` the first time it needs them.
"""

from __future__ import annotations

import threading

import pluggy

from mooncake_core.plugins import NamedFactory, add_builtins, handoff_protocols, hookimpl, scheduler_policies

__all__ = ["ensure_registered", "handoff_names", "handoffs", "policies", "policy_names"]


class BuiltinHandoffs:
    @hookimpl
    def mooncake_handoff_protocols(self) -> list[NamedFactory]:
        from .handoff import BUILTIN_HANDOFFS
        return [NamedFactory(cls.name, cls, (cls.__doc__ or "").strip().split("\n")[0])
                for cls in BUILTIN_HANDOFFS]


class BuiltinPolicies:
    @hookimpl
    def mooncake_scheduler_policies(self) -> list[NamedFactory]:
        from .scheduling.policies import BUILTIN_SCHEDULERS
        return [NamedFactory(cls.policy, cls, (cls.__doc__ or "").strip().split("\n")[0])
                for cls in BUILTIN_SCHEDULERS]


_BUILTINS = (("mooncake_proxy.handoff", BuiltinHandoffs()), ("mooncake_proxy.policies", BuiltinPolicies()))
_done = threading.Event()
_lock = threading.Lock()


def _register(pm: pluggy.PluginManager) -> None:
    for name, plugin in _BUILTINS:
        if pm.get_plugin(name) is None and not pm.is_blocked(name):
            pm.register(plugin, name=name)


def ensure_registered() -> None:
    """Hand the built-ins to the plugin manager (once per process)."""
    if _done.is_set():
        return
    with _lock:
        if not _done.is_set():
            add_builtins(_register)
            _done.set()


def handoffs() -> dict[str, NamedFactory]:
    ensure_registered()
    return handoff_protocols()


def policies() -> dict[str, NamedFactory]:
    ensure_registered()
    return scheduler_policies()


def handoff_names() -> tuple[str, ...]:
    return tuple(handoffs())


def policy_names() -> tuple[str, ...]:
    return tuple(policies())
