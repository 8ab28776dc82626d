"""The scheduling policies a name selects: the built-ins, registered with mooncake_core's plugin
manager as its first scheduler-policy plugin, then those of plugins (docs/plugins.md).

Kept apart from ``policies.py`` so the policies stay pure (no plugin manager, no entry points);
``make_scheduler`` checks what a plugin's factory accepts before it builds.
"""

from __future__ import annotations

import inspect
from typing import Iterable

from mooncake_core.plugins import NamedFactory, hookimpl, scheduler_policies

from ..builtin_plugin import BuiltinPlugin
from .cluster import ClusterState
from .cost import CostModel
from .datatypes import SloConfig
from .latency import LatencyBoard, SchedulerSettings
from .policies import BUILTIN_SCHEDULERS, Scheduler


class _BuiltinPolicies:
    @hookimpl
    def mooncake_scheduler_policies(self) -> list[NamedFactory]:
        return [NamedFactory(cls.policy, cls, (cls.__doc__ or "").strip().split("\n")[0])
                for cls in BUILTIN_SCHEDULERS]


_BUILTIN = BuiltinPlugin("mooncake_proxy.policies", _BuiltinPolicies())


def policies() -> dict[str, NamedFactory]:
    """Every registered policy by ``--policy`` name: the built-ins, then plugins'."""
    _BUILTIN.ensure()
    return scheduler_policies()


def policy_names() -> tuple[str, ...]:
    """Every registered policy: the built-ins, then those of plugins (docs/plugins.md)."""
    return tuple(policies())


def make_scheduler(policy: str, cluster: ClusterState, cost: CostModel | None = None,
                   slo: SloConfig | None = None, seed: int = 0, *, settings: SchedulerSettings | None = None,
                   latency: LatencyBoard | None = None, **options: object) -> Scheduler:
    """Build the scheduler for ``policy`` (a built-in of :data:`POLICIES` or a plugin's).
    ``options`` go to the policy class (``conductor``: ``replicate_hot``, ``hot_threshold``);
    ``settings`` and ``latency`` (``Scheduler.__init__``) too, when given -- a plugin's factory
    that takes neither still builds schedulers with the defaults."""
    table = policies()
    f = table.get(policy)
    if f is None:
        raise ValueError(f"unknown scheduling policy {policy!r}; choose one of {', '.join(table)}")
    allowed = getattr(f.factory, "options", ())
    bad = sorted(set(options) - set(allowed))
    if bad:
        raise ValueError(f"policy {policy!r} takes no options {bad}"
                         + (f" (it takes: {', '.join(allowed)})" if allowed else ""))
    given: dict[str, object] = {}
    if settings is not None and not settings.is_default():
        given["settings"] = settings
    if latency is not None:
        given["latency"] = latency
    if given and not _takes(f.factory, given):
        raise ValueError(f"policy {policy!r}: its factory takes no {' / '.join(given)} keyword (the proxy's "
                         f"scheduler settings, --calibrate's latency model); accept them and pass them on to "
                         f"Scheduler.__init__")
    sched = f.factory(cluster, cost, slo, seed, **given, **options)
    if not isinstance(sched, Scheduler):
        raise TypeError(f"scheduling plugin {policy!r} built a {type(sched).__name__}, not a Scheduler")
    return sched


def _takes(factory: object, keywords: Iterable[str]) -> bool:
    """Whether ``factory`` accepts every one of ``keywords`` (by name, or through ``**kwargs``)."""
    try:
        params = inspect.signature(factory).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True  # not introspectable: let the call say
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return all(k in params for k in keywords)
