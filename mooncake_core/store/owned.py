"""Objects a store client wrote into its own segment: what it re-reports after a master change."""

from __future__ import annotations

import itertools
import threading
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from mooncake_core.store.protocol import ReplicaDesc

__all__ = ["OwnedEntry", "OwnedIndex"]


@dataclass(slots=True)
class OwnedEntry:
    """An object whose replica lives in our segment and which we wrote (for re-reporting).
    A snapshot: the index itself keeps its entries in columns."""

    key: str
    replica: ReplicaDesc
    fingerprint: int
    seq: int
    version: int = 0  # what put_end returned: the highest version of a key wins a re-report


class OwnedIndex:
    """Objects this client wrote into its own segment, for re-reporting after a master change.

    Pure and thread-safe. Bounded by the segment: an entry whose range a *newer* entry overlaps
    is dropped -- the master only hands out free ranges, so the older one was evicted/removed
    meanwhile and its bytes are gone. That keeps the index at most one entry per live range
    however many objects were evicted behind our back.

    Storage is columnar (why: a batch of 1,000 small puts used to build 1,000 entry objects
    and replica descriptors, a large share of the client's CPU per put): entry ``p`` is
    position ``p`` of parallel columns (key, address, size, fingerprint, version, segment),
    and positions order the entries by age. A batch of fresh keys is added with one dict
    update and a few byte appends, at C speed; one entry in O(1). Overlapped entries (a
    range reused, at the same start or not) are dropped by a sweep over the entries sorted by
    address (``_prune``, numpy; only clusters of overlapping entries are looked at one by
    one), run when as many entries were added as there were live ones at the last sweep and
    before anything reads the entries, so its cost is amortised; the sweep also compacts the
    columns once half of them are dead. Entries dropped since the last sweep are kept as
    tombstones for it: an overlap by an entry that is gone again still drops the older one.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._by_key: dict[str, int] = {}
        self._keys: list[str] = []
        # 64-bit columns: batches arrive as numpy arrays and are appended as bytes, and the
        # sweep reads them in place
        self._addr = array("q")
        self._size = array("q")
        self._fp = array("Q")
        self._ver = array("q")
        self._seg: list[str] = []
        self._swept = 0  # positions below this were checked against each other
        self._tombs: list[int] = []  # dropped since the last sweep, at positions >= _swept
        self._sweep_at = _FIRST_SWEEP

    def __len__(self) -> int:
        with self._lock:
            self._prune()
            return len(self._by_key)

    def _drop(self, p: int) -> None:
        k = self._keys[p]
        if self._by_key.get(k) == p:
            del self._by_key[k]
        if p >= self._swept:
            self._tombs.append(p)

    def _add(self, key: str, segment: str, addr: int, size: int, fingerprint: int, version: int) -> None:
        old = self._by_key.get(key)
        if old is not None:
            self._drop(old)
        p = len(self._keys)
        self._keys.append(key)
        self._addr.append(addr)
        self._size.append(size)
        self._fp.append(fingerprint)
        self._ver.append(version)
        self._seg.append(segment)
        self._by_key[key] = p

    def _maybe_prune(self) -> None:
        if len(self._keys) - self._swept >= self._sweep_at:
            self._prune()

    def _prune(self) -> None:
        """Drop every entry that a newer one (live or tombstone) overlaps; compact the columns
        once at least half of them are dead."""
        if len(self._keys) == self._swept and not self._tombs:
            return
        addr, size = self._addr, self._size
        dead: list[int] = []
        items = np.fromiter(itertools.chain(self._by_key.values(), self._tombs), np.int64)
        if len(items) > 1:
            # sorted by start (stable), a cluster starts where no earlier entry reaches: only
            # clusters of several entries (overlaps, rare) are resolved entry by entry
            a_all = np.frombuffer(addr, np.int64)
            starts = a_all[items]
            order = np.argsort(starts, kind="stable")
            items, starts = items[order], starts[order]
            ends = starts + np.maximum(np.frombuffer(size, np.int64)[items], 1)
            del a_all  # no view may outlive the sweep: the columns must stay resizable
            first = np.empty(len(items), bool)
            first[0] = True
            first[1:] = starts[1:] >= np.maximum.accumulate(ends)[:-1]
            bounds = np.append(np.flatnonzero(first), len(items))
            for k in np.flatnonzero(np.diff(bounds) > 1).tolist():
                dead.extend(_overlapped(items[bounds[k]:bounds[k + 1]].tolist(), addr, size))
        self._tombs = []
        self._swept = len(self._keys)
        for p in dead:
            self._drop(p)
        self._tombs = []
        live = len(self._by_key)
        if 2 * live <= len(self._keys):
            self._compact()
        self._sweep_at = max(_FIRST_SWEEP, live)

    def _compact(self) -> None:
        """Keep only the live positions (in order): dead ones hold key strings alive."""
        keep = sorted(self._by_key.values())
        self._keys, self._seg = [self._keys[p] for p in keep], [self._seg[p] for p in keep]
        ix = np.array(keep, np.int64)
        for name in ("_addr", "_size", "_fp", "_ver"):
            old = getattr(self, name)
            col = array(old.typecode)
            col.frombytes(np.frombuffer(old, np.dtype(old.typecode))[ix].tobytes())
            setattr(self, name, col)
        self._by_key = dict(zip(self._keys, range(len(keep))))
        self._swept = len(keep)

    def add(self, key: str, replica: ReplicaDesc, fingerprint: int, version: int = 0) -> None:
        self.add_many([(key, replica, fingerprint, version)])

    def add_many(self, items: Iterable[tuple[str, ReplicaDesc, int, int]]) -> None:
        """``add`` of every ``(key, replica, fingerprint, version)``, under one lock."""
        with self._lock:
            for key, r, fp, version in items:
                self._add(key, r.segment_name, r.addr, r.size, fp, version)
            self._maybe_prune()

    def add_batch(self, segment: str, keys: Sequence[str], addrs: np.ndarray, sizes: np.ndarray,
                  fingerprints: np.ndarray, versions: np.ndarray) -> None:
        """``add`` of a batch of objects in ``segment`` given as columns (distinct keys, as a
        batch put has; 64-bit arrays). Fresh keys -- a store filling up -- cost one dict
        update and a few byte appends, at C speed; keys already listed take the per-entry path."""
        with self._lock:
            bk = self._by_key
            if bk and any(map(bk.__contains__, keys)):
                for key, a, n, fp, v in zip(keys, addrs.tolist(), sizes.tolist(), fingerprints.tolist(),
                                            versions.tolist()):
                    self._add(key, segment, a, n, fp, v)
            else:
                p0 = len(self._keys)
                self._keys.extend(keys)
                for col, arr in ((self._addr, addrs), (self._size, sizes), (self._fp, fingerprints),
                                 (self._ver, versions)):
                    col.frombytes(np.ascontiguousarray(arr, np.dtype(col.typecode)).tobytes())
                self._seg.extend([segment] * len(keys))
                bk.update(zip(keys, range(p0, len(self._keys))))
            self._maybe_prune()

    def discard(self, keys: Iterable[str]) -> None:
        with self._lock:
            bk = self._by_key
            if not bk:
                return
            for k in keys:
                p = bk.get(k)
                if p is not None:
                    self._drop(p)

    def discard_removed(self, removed: Iterable[tuple[str, int]], all_before: int = 0) -> None:
        """Drop entries the master reported removed/overwritten: ``(key, stamp)`` drops that
        key's entry if it is not newer than the removal; ``all_before`` drops every entry at
        or below it. A newer write of the same key (higher version) stays."""
        with self._lock:
            ver = self._ver
            for k, stamp in removed:
                p = self._by_key.get(k)
                if p is not None and ver[p] <= stamp:
                    self._drop(p)
            if all_before:
                for p in [p for p in self._by_key.values() if ver[p] <= all_before]:
                    self._drop(p)

    def _entry(self, p: int) -> OwnedEntry:
        return OwnedEntry(self._keys[p], ReplicaDesc(self._seg[p], self._addr[p], self._size[p]), self._fp[p], p,
                          self._ver[p])

    def entries(self, pred: Callable[[str], bool] | None = None) -> list[OwnedEntry]:
        """A snapshot of the entries whose key satisfies ``pred`` (all when None)."""
        with self._lock:
            self._prune()
            return [self._entry(p) for k, p in self._by_key.items() if pred is None or pred(k)]

    def discard_entries(self, entries: Iterable[OwnedEntry]) -> None:
        """Drop the entries of a snapshot that are still there (not replaced by a newer write
        of their key meanwhile)."""
        with self._lock:
            for e in entries:
                p = self._by_key.get(e.key)
                if p is not None and self._addr[p] == e.replica.addr and self._ver[p] == e.version:
                    self._drop(p)

    def clear(self) -> None:
        with self._lock:
            self._reset()

    def newest_first(self) -> list[OwnedEntry]:
        with self._lock:
            self._prune()
            return [self._entry(p) for p in sorted(self._by_key.values(), reverse=True)]


#: entries added at which the first overlap sweep runs (then after as many adds as were live)
_FIRST_SWEEP = 4096


def _overlapped(cluster: list[int], addr: Sequence[int], size: Sequence[int]) -> list[int]:
    """The older entry of every overlapping pair in ``cluster`` (positions sorted by start;
    a higher position is newer)."""
    active: list[int] = []  # entries whose range reaches past the current start
    dead: list[int] = []
    for p in cluster:
        lo = addr[p]
        active = [a for a in active if addr[a] + max(size[a], 1) > lo]
        for a in active:  # a starts at or before lo and ends after it: they overlap
            dead.append(a if a < p else p)
        active.append(p)
    return dead
