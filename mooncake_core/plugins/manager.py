"""The one plugin manager of mooncake-core (pluggy, the plugin library pytest is built on).

Why pluggy: hook specifications give plugins a checked contract (a misspelt hook or argument
is an error at registration, not a silent no-op), entry-point loading finds third-party
distributions without any edit of ours, and built-ins go through exactly the same path as
outside plugins, so "add a transport / a metadata backend" is one module plus one entry point.

The manager is created on first use: the built-ins are registered, then every entry point of
the ``mooncake_core`` group is loaded once per process. Helper functions collect what the
plugins provide and refuse duplicate names with a message naming both plugins.
"""

from __future__ import annotations

import importlib.metadata
import threading
from typing import Any, Callable

import pluggy

from mooncake_core.plugins import hookspecs
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.plugins")

#: entry-point group third-party distributions use: ``[project.entry-points.mooncake_core]``
ENTRY_POINT_GROUP = "mooncake_core"

#: plugin names of the built-ins (listed before third-party plugins, whenever registered)
BUILTIN_PREFIXES = ("mooncake_core.", "mooncake_proxy.")

_PM: pluggy.PluginManager | None = None
_LOCK = threading.Lock()
_EXTRA_BUILTINS: list[Callable[[pluggy.PluginManager], None]] = []


class PluginError(RuntimeError):
    """A plugin could not be loaded, or two plugins claim the same name."""


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    """Register every ``mooncake_core`` entry point (pluggy's loader, with errors that name
    the distribution and the entry point instead of a bare ImportError)."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
            continue
        dist = getattr(getattr(ep, "dist", None), "name", "?")
        try:
            plugin = ep.load()
            pm.register(plugin, name=ep.name)
        except Exception as e:
            raise PluginError(f"mooncake_core plugin {ep.name!r} ({ep.value}, distribution {dist!r}) "
                              f"failed to load: {type(e).__name__}: {e}") from e
        log.info("plugin loaded", extra={"plugin": ep.name, "value": ep.value, "distribution": dist})


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide manager (built-ins and entry points registered on first call)."""
    global _PM
    if _PM is not None:
        return _PM
    with _LOCK:
        if _PM is None:
            from mooncake_core.plugins import builtin

            pm = pluggy.PluginManager(hookspecs.PROJECT)
            pm.add_hookspecs(hookspecs)
            builtin.register_builtins(pm)
            for add in _EXTRA_BUILTINS:
                add(pm)
            _load_entry_points(pm)
            _PM = pm
    return _PM


def add_builtins(register: Callable[[pluggy.PluginManager], None]) -> None:
    """Let a package above mooncake_core (the proxy) register its built-in plugins without
    mooncake_core importing it: ``register(pm)`` runs now if the manager exists, else when
    it is created. Registering the same plugin name twice is skipped."""
    with _LOCK:
        _EXTRA_BUILTINS.append(register)
        pm = _PM
    if pm is not None:
        register(pm)


def collect(hook_name: str, key: Callable[[Any], Any]) -> list[Any]:
    """Everything the plugins return from ``hook_name``, in registration order (built-ins
    first), refusing two items that share a name: ``key(item)`` lists an item's names."""
    pm = get_plugin_manager()
    hook = getattr(pm.hook, hook_name)
    seen: dict[Any, str] = {}
    out: list[Any] = []
    impls = sorted(hook.get_hookimpls(), key=lambda i: not i.plugin_name.startswith(BUILTIN_PREFIXES))
    for impl in impls:
        items = impl.function() or []
        for item in items:
            for k in key(item):
                if k in seen:
                    raise PluginError(f"{hook_name}: {k!r} is provided by both plugin {seen[k]!r} and plugin "
                                      f"{impl.plugin_name!r}; uninstall one (or block it with "
                                      f"get_plugin_manager().set_blocked(name))")
                seen[k] = impl.plugin_name
            out.append(item)
    return out

