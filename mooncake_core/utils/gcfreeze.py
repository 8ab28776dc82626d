"""Keep Python's full garbage collections short in a process holding millions of objects.

Why: the store master keeps one record per object (1M objects: a few million tracked
objects). CPython runs a full (generation 2) collection whenever the long-lived objects grew
by a quarter, and each one walks *all* of them: 11 full collections of up to ~200 ms while
filling 1M objects here, each a stall of every request in flight (issue 18: put p99). After
each full collection the survivors are moved to the permanent generation (``gc.freeze``),
so the next one walks only what was allocated since (~15-50 ms at 1M objects here).

The cost: a cycle of frozen objects that later becomes garbage is never collected (plain
reference counting still frees everything else, frozen or not). The master's records hold no
cycles; a leak would be confined to rare cyclic structures created before a freeze.
"""

from __future__ import annotations

import gc
from typing import Any

__all__ = ["freeze_after_full_collections"]


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


def freeze_after_full_collections() -> None:
    """Install the freeze-after-full-collection hook (idempotent)."""
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)
