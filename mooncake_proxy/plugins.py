"""The proxy's hand-off protocols and scheduling policies by name, built-ins and plugins'.

Each built-in registers itself beside the classes it lists (``handoff/``,
``scheduling/registry.py``) through the plugin manager, as third-party plugins do
(``mooncake_handoff_protocols``, ``mooncake_scheduler_policies``; docs/plugins.md), so
``--handoff`` / ``--policy`` accept a name a distribution adds with an entry point.
"""

from __future__ import annotations

from .handoff import handoffs
from .scheduling.registry import policies, policy_names

__all__ = ["handoff_names", "handoffs", "policies", "policy_names"]


def handoff_names() -> tuple[str, ...]:
    return tuple(handoffs())
