"""A bounded LRU set of block keys — the model of one KV cache (instance or store tier).

Kept separate from the cluster bookkeeping so the eviction rule is testable on its own and the
simulator's "global LRU" hit-ratio mode uses the very same code.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Iterator, Sequence

__all__ = ["LruBlockCache"]


class LruBlockCache:
    """LRU set of block hashes with capacity in blocks (0 = unlimited)."""

    __slots__ = ("_capacity", "_d")

    def __init__(self, capacity: int = 0) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0 blocks (0 = unlimited), got {capacity}")
        self._capacity = capacity
        self._d: OrderedDict[int, None] = OrderedDict()

    @property
    def capacity(self) -> int:
        return self._capacity

    def set_capacity(self, capacity: int) -> list[int]:
        """Change capacity; returns keys evicted to fit."""
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0 blocks (0 = unlimited), got {capacity}")
        self._capacity = capacity
        return self._trim()

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __iter__(self) -> Iterator[int]:
        return iter(self._d)

    def prefix_len(self, keys: Sequence[int]) -> int:
        """Number of leading ``keys`` present (stops at the first miss). Does not touch LRU order."""
        d = self._d
        n = 0
        for k in keys:
            if k not in d:
                break
            n += 1
        return n

    def insert(self, keys: Iterable[int]) -> list[int]:
        """Insert/touch ``keys`` in order (the last becomes most recent); returns evicted keys.

        Eviction happens after all keys are inserted, so a request larger than the cache
        keeps its *last* blocks — as an engine that fills its cache front to back would.
        """
        d = self._d
        move = d.move_to_end
        for k in keys:
            if k in d:
                move(k)
            else:
                d[k] = None
        return self._trim()

    def remove(self, keys: Iterable[int]) -> list[int]:
        """Drop ``keys`` that are present; returns those actually removed."""
        d = self._d
        out = []
        for k in keys:
            if k in d:
                del d[k]
                out.append(k)
        return out

    def clear(self) -> list[int]:
        keys = list(self._d)
        self._d.clear()
        return keys

    def _trim(self) -> list[int]:
        cap = self._capacity
        d = self._d
        if not cap or len(d) <= cap:
            return []
        out = []
        pop = d.popitem
        while len(d) > cap:
            out.append(pop(last=False)[0])
        return out
