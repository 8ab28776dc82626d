"""Objects a store client wrote into its own segment: what it re-reports after a master change."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sortedcontainers import SortedDict

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

    Pure and thread-safe. Bounded by the segment: adding a range drops every older entry
    overlapping it -- the master only hands out free ranges, so an overlapped entry was
    evicted/removed meanwhile and its bytes are gone. That keeps the index at most one entry
    per live range however many objects were evicted behind our back.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, OwnedEntry] = {}
        self._by_addr: SortedDict[int, OwnedEntry] = SortedDict()  # start address -> entry
        self._seq = 0

    def __len__(self) -> int:
        return len(self._by_key)

    def _drop(self, e: OwnedEntry) -> None:
        if self._by_key.get(e.key) is e:
            del self._by_key[e.key]
        if self._by_addr.get(e.replica.addr) is e:
            del self._by_addr[e.replica.addr]

    def add(self, key: str, replica: ReplicaDesc, fingerprint: bytes, version: int = 0) -> None:
        lo, hi = replica.addr, replica.addr + max(replica.size, 1)
        with self._lock:
            old = self._by_key.get(key)
            if old is not None:
                self._drop(old)
            i = self._by_addr.bisect_left(lo)
            if i > 0:
                i -= 1
            overlapped = []
            for start in self._by_addr.islice(i):
                if start >= hi:
                    break
                e = self._by_addr[start]
                if start + max(e.replica.size, 1) > lo:
                    overlapped.append(e)
            for e in overlapped:
                self._drop(e)
            self._seq += 1
            e = OwnedEntry(key, replica, fingerprint, self._seq, version)
            self._by_key[key] = e
            self._by_addr[lo] = e

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
            return [e for k, e in self._by_key.items() if pred is None or pred(k)]

    def discard_entries(self, entries: Iterable[OwnedEntry]) -> None:
        with self._lock:
            for e in entries:
                self._drop(e)

    def clear(self) -> None:
        with self._lock:
            self._by_key.clear()
            self._by_addr.clear()

    def newest_first(self) -> list[OwnedEntry]:
        with self._lock:
            return sorted(self._by_key.values(), key=lambda e: e.seq, reverse=True)
