"""One plugin system for mooncake-core, on pluggy (see docs/plugins.md).

Extension points (hook specifications in :mod:`mooncake_core.plugins.hookspecs`):

* ``mooncake_transports``        -- Transfer Engine transports (priority + capabilities);
* ``mooncake_metadata_backends`` -- metadata services by connection-string scheme;
* ``mooncake_handoff_protocols`` -- PD proxy prefill→decode hand-off protocols;
* ``mooncake_scheduler_policies``-- PD proxy / simulator scheduling policies.

A third-party distribution declares ``[project.entry-points.mooncake_core] name = "module"``
and marks its hook functions with :data:`hookimpl`; no file of ours changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mooncake_core.plugins.hookspecs import hookimpl, hookspec
from mooncake_core.plugins.manager import ENTRY_POINT_GROUP, PluginError, add_builtins, collect, get_plugin_manager
from mooncake_core.plugins.specs import MetadataBackendPlugin, NamedFactory

if TYPE_CHECKING:
    from mooncake_core.transfer.base import Transport

__all__ = ["ENTRY_POINT_GROUP", "MetadataBackendPlugin", "NamedFactory", "PluginError", "add_builtins",
           "get_plugin_manager", "handoff_protocols", "hookimpl", "hookspec", "metadata_backends",
           "scheduler_policies", "transport_classes"]


def transport_classes() -> "list[type[Transport]]":
    """Every registered transport class, most preferred first (``priority`` descending; ties
    keep registration order)."""
    classes = collect("mooncake_transports", lambda c: [c.name])
    return sorted(classes, key=lambda c: -int(c.priority))


def metadata_backends() -> dict[str, MetadataBackendPlugin]:
    """Registered metadata backends by (lower-case) scheme."""
    out: dict[str, MetadataBackendPlugin] = {}
    for b in collect("mooncake_metadata_backends", lambda b: [s.lower() for s in b.schemes]):
        for s in b.schemes:
            out[s.lower()] = b
    return out


def handoff_protocols() -> dict[str, NamedFactory]:
    """Registered PD hand-off protocols by name."""
    return {f.name: f for f in collect("mooncake_handoff_protocols", lambda f: [f.name])}


def scheduler_policies() -> dict[str, NamedFactory]:
    """Registered scheduling policies by name (registration order: built-ins first)."""
    return {f.name: f for f in collect("mooncake_scheduler_policies", lambda f: [f.name])}
