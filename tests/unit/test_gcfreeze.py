"""The master's GC hook: survivors of a full collection are frozen, later garbage still freed."""

from __future__ import annotations

import gc

from mooncake_core.utils.gcfreeze import _on_gc, freeze_after_full_collections


def test_full_collection_freezes_survivors_and_young_cycles_are_still_collected() -> None:
    gc.unfreeze()
    try:
        freeze_after_full_collections()
        freeze_after_full_collections()
        assert gc.callbacks.count(_on_gc) == 1, "idempotent"
        keep = [[i] for i in range(1000)]
        gc.collect()
        assert gc.get_freeze_count() >= len(keep), "survivors of a full collection are frozen"

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle made after the freeze
        del a, b
        assert gc.collect() >= 2, "a new cycle is still collected"
    finally:
        gc.callbacks.remove(_on_gc)
        gc.unfreeze()
