"""Objects a store client wrote into its own segment: what it re-reports after a master change."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mooncake_core.store.protocol import ReplicaDesc

__all__ = ["OwnedEntry", "OwnedIndex"]


@dataclass(slots=True)
class OwnedEntry:
    """An object whose replica lives in our segment and which we wrote (for re-reporting)."""

    key: str
    replica: ReplicaDesc
    fingerprint: bytes
    seq: int
    version: int = 0  # what put_end returned: the highest version of a key wins a re-report


class OwnedIndex:
    """Objects this client wrote into its own segment, for re-reporting after a master change.

    Pure and thread-safe. Bounded by the segment: an entry whose range a *newer* entry overlaps
    is dropped -- the master only hands out free ranges, so the older one was evicted/removed
    meanwhile and its bytes are gone. That keeps the index at most one entry per live range
    however many objects were evicted behind our back.

    Adding is O(1): a dict per key and per start address (a range reused at the same start,
    the common case with few object sizes, replaces its old entry at once). Overlaps at other
    starts are dropped by a sweep over the entries sorted by address (``_prune``), run when the
    index has doubled since the last sweep and before anything reads the entries, so its cost
    is amortised O(log n) per add at C-sort speed -- a sorted map updated on every add cost
    more than the rest of a small put. Entries dropped since the last sweep are kept as
    tombstones for it: an overlap by an entry that is gone again still drops the older one.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, OwnedEntry] = {}
        self._by_addr: dict[int, OwnedEntry] = {}  # start address -> newest entry starting there
        self._seq = 0
        self._swept_seq = 0  # entries up to this seq were checked against each other
        self._tombs: list[OwnedEntry] = []  # dropped since the last sweep, newer than _swept_seq
        self._sweep_at = _FIRST_SWEEP

    def __len__(self) -> int:
        with self._lock:
            self._prune()
            return len(self._by_key)

    def _drop(self, e: OwnedEntry) -> None:
        if self._by_key.get(e.key) is e:
            del self._by_key[e.key]
        if self._by_addr.get(e.replica.addr) is e:
            del self._by_addr[e.replica.addr]
        if e.seq > self._swept_seq:
            self._tombs.append(e)

    def _add(self, key: str, replica: ReplicaDesc, fingerprint: bytes, version: int) -> None:
        old = self._by_key.get(key)
        if old is not None:
            self._drop(old)
        lo = replica.addr
        prev = self._by_addr.get(lo)
        if prev is not None:  # same start: overlapped (sizes are > 0 or counted as 1)
            self._drop(prev)
        self._seq += 1
        e = OwnedEntry(key, replica, fingerprint, self._seq, version)
        self._by_key[key] = e
        self._by_addr[lo] = e

    def _prune(self) -> None:
        """Drop every entry that a newer one (live or tombstone) overlaps."""
        if self._seq == self._swept_seq:
            return
        items = sorted([*self._by_addr.values(), *self._tombs], key=_start)
        active: list[OwnedEntry] = []  # entries whose range reaches past the current start
        dead: list[OwnedEntry] = []
        for e in items:
            lo = e.replica.addr
            active = [a for a in active if a.replica.addr + max(a.replica.size, 1) > lo]
            for a in active:  # a starts at or before lo and ends after it: they overlap
                dead.append(a if a.seq < e.seq else e)
            active.append(e)
        self._tombs = []
        self._swept_seq = self._seq
        for e in dead:
            self._drop(e)
        self._tombs = []
        self._sweep_at = max(_FIRST_SWEEP, 2 * len(self._by_key))

    def add(self, key: str, replica: ReplicaDesc, fingerprint: bytes, version: int = 0) -> None:
        self.add_many([(key, replica, fingerprint, version)])

    def add_many(self, items: Iterable[tuple[str, ReplicaDesc, bytes, int]]) -> None:
        """``add`` of every ``(key, replica, fingerprint, version)``, under one lock."""
        with self._lock:
            add = self._add
            for key, replica, fp, version in items:
                add(key, replica, fp, version)
            if len(self._by_key) + len(self._tombs) >= self._sweep_at:
                self._prune()

    def discard(self, keys: Iterable[str]) -> None:
        with self._lock:
            for k in keys:
                e = self._by_key.get(k)
                if e is not None:
                    self._drop(e)

    def discard_removed(self, removed: Iterable[tuple[str, int]], all_before: int = 0) -> None:
        """Drop entries the master reported removed/overwritten: ``(key, stamp)`` drops that
        key's entry if it is not newer than the removal; ``all_before`` drops every entry at
        or below it. A newer write of the same key (higher version) stays."""
        with self._lock:
            for k, stamp in removed:
                e = self._by_key.get(k)
                if e is not None and e.version <= stamp:
                    self._drop(e)
            if all_before:
                for e in [e for e in self._by_key.values() if e.version <= all_before]:
                    self._drop(e)

    def entries(self, pred: Callable[[str], bool] | None = None) -> list[OwnedEntry]:
        """A snapshot of the entries whose key satisfies ``pred`` (all when None)."""
        with self._lock:
            self._prune()
            return [e for k, e in self._by_key.items() if pred is None or pred(k)]

    def discard_entries(self, entries: Iterable[OwnedEntry]) -> None:
        with self._lock:
            for e in entries:
                self._drop(e)

    def clear(self) -> None:
        with self._lock:
            self._by_key.clear()
            self._by_addr.clear()
            self._tombs = []
            self._swept_seq = self._seq
            self._sweep_at = _FIRST_SWEEP

    def newest_first(self) -> list[OwnedEntry]:
        with self._lock:
            self._prune()
            return sorted(self._by_key.values(), key=lambda e: e.seq, reverse=True)


#: index size at which the first overlap sweep runs (then at every doubling)
_FIRST_SWEEP = 4096


def _start(e: OwnedEntry) -> int:
    return e.replica.addr
