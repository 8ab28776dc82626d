"""The hooks a mooncake-core plugin may implement (pluggy hook specifications).

A plugin is any object or module with functions marked ``@hookimpl`` whose names match the
specs below. Built-in transports, metadata backends, proxy hand-off protocols and scheduler
policies are plugins too (``mooncake_core/plugins/builtin.py``, ``mooncake_proxy/plugins.py``);
a third-party distribution adds its own with an entry point in the ``mooncake_core`` group
(see docs/plugins.md). Every hook returns a list: one plugin may contribute several items.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from mooncake_core.plugins.specs import MetadataBackendPlugin, NamedFactory
    from mooncake_core.transfer.base import Transport

PROJECT = "mooncake_core"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def mooncake_transports() -> "list[type[Transport]]":
    """Transport classes this plugin provides.

    Each class names itself (``name``), says how much it is preferred (``priority``: higher
    wins among the transports that can reach a peer, so local > same-host > rdma > tcp is
    data) and what it can do (``capabilities``: memory locations served, array batches,
    notifications). The engine builds one instance per engine with a ``TransportContext``.
    """
    return []


@hookspec
def mooncake_metadata_backends() -> "list[MetadataBackendPlugin]":
    """Metadata backends, each selected by the scheme of a connection string (``scheme://``)."""
    return []


@hookspec
def mooncake_handoff_protocols() -> "list[NamedFactory]":
    """Prefill→decode hand-off protocols of the PD proxy (``--handoff NAME``); the factory
    takes no arguments and returns a ``mooncake_proxy.handoff.HandoffProtocol``."""
    return []


@hookspec
def mooncake_scheduler_policies() -> "list[NamedFactory]":
    """Scheduling policies of the PD proxy and simulator (``--policy NAME``); the factory is
    called as ``factory(cluster, cost, slo, seed, **options)`` -- plus ``settings=`` and
    ``latency=`` (``Scheduler.__init__``) when the proxy has non-default ones, which a subclass of
    ``Scheduler`` accepts -- and returns a ``mooncake_proxy.scheduling.Scheduler``."""
    return []


__all__ = ["PROJECT", "hookimpl", "hookspec", "mooncake_handoff_protocols", "mooncake_metadata_backends",
           "mooncake_scheduler_policies", "mooncake_transports"]

