"""What holds a segment's memory, and the words of a refused put (pure, like MasterState).

Why a module of its own: a put refused for space must say what holds it -- stored objects
(and how many of them readers lease), puts being written, the clients' reservations,
quarantined ranges, memory kept for readers of removed objects -- per segment, or the
operator cannot tell a full pool from one the master failed to reclaim. And the client must
tell "full" from "space is being reclaimed, ask again shortly": the words of that answer are
a contract between the master and its clients (``reclaim_wait`` reads them), kept here next
to the code that writes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store.master_records import RESERVATION_PREFIX, ClientInfo, ObjectMeta, PendingPut, Segment

__all__ = ["Holdings", "SpaceReclaiming", "holdings", "no_space_message", "reclaim_pending", "reclaim_wait",
           "reclaimable"]

#: a refused put's account walks the objects only up to this many (the walk is on the failure
#: path, but a full pool may refuse every put: it must stay cheap there)
MAX_COUNTED_OBJECTS = 200_000

_WAIT = re.compile(r"\(space being reclaimed: retry in (\d+(?:\.\d+)?)s\)")


@dataclass
class Holdings:
    """Bytes of one segment by what holds them (``objects`` includes ``leased``)."""

    size: int = 0
    free: int = 0
    largest_free: int = 0
    objects: int = 0
    leased: int = 0
    writing: int = 0
    reserved: int = 0
    quarantined: int = 0
    readers: int = 0  # ranges of removed objects kept until their readers' leases end

    def describe(self) -> str:
        parts = [f"{self.free} free of {self.size} (largest free range {self.largest_free})",
                 f"objects {self.objects} ({self.leased} leased)"]
        for name, n in (("puts being written", self.writing), ("reservations", self.reserved),
                        ("quarantined", self.quarantined), ("kept for readers of removed objects", self.readers)):
            if n:
                parts.append(f"{name} {n}")
        return ", ".join(parts)


def holdings(segments: Iterable[Segment], objects: dict[str, ObjectMeta], inflight: dict[str, PendingPut],
             clients: Iterable[ClientInfo], graveyard: Iterable[tuple[float, int, Segment, int, int]],
             now: float) -> tuple[dict[str, Holdings], bool]:
    """Per segment (its key), what holds its bytes; and whether every object was counted (a very
    large table is counted only up to ``MAX_COUNTED_OBJECTS``)."""
    out: dict[str, Holdings] = {}
    by_seg: dict[int, Holdings] = {}
    for seg in segments:
        h = out[seg.key] = Holdings(seg.size, seg.alloc.free_bytes, seg.alloc.largest_free)
        by_seg[id(seg)] = h
    complete = True
    for i, meta in enumerate(objects.values()):
        if i >= MAX_COUNTED_OBJECTS:
            complete = False
            break
        for seg, _ in meta.reps():
            ho = by_seg.get(id(seg))
            if ho is not None:
                ho.objects += meta.size
                if meta.lease > now:
                    ho.leased += meta.size
    for key, p in inflight.items():
        for seg, _ in p.reps:
            hp = by_seg.get(id(seg))
            if hp is not None:
                if key.startswith(RESERVATION_PREFIX):
                    hp.reserved += p.size
                else:
                    hp.writing += p.size
    for c in clients:
        for _, seg, _, size in c.quarantine:
            hq = by_seg.get(id(seg))
            if hq is not None:
                hq.quarantined += size
    for _, _, seg, _, size in graveyard:
        hg = by_seg.get(id(seg))
        if hg is not None:
            hg.readers += size
    return out, complete


def reclaimable(inflight: dict[str, PendingPut], clients: Iterable[ClientInfo]) -> dict[Segment, int]:
    """Bytes per segment held by reservations and quarantined ranges: space that becomes
    free without evicting anyone's object (``MasterState._reclaim``, the owners' next
    heartbeats, or the holders letting go). O(puts in flight + quarantined ranges)."""
    out: dict[Segment, int] = {}
    for key, p in inflight.items():
        if key.startswith(RESERVATION_PREFIX):
            for seg, _ in p.reps:
                out[seg] = out.get(seg, 0) + p.size
    for c in clients:
        for _, seg, _, size in c.quarantine:
            out[seg] = out.get(seg, 0) + size
    return out


def reclaim_pending(inflight: dict[str, PendingPut], clients: Iterable[ClientInfo], segs: dict[str, Segment],
                    size: int, want: int, now: float, reclaim_s: float) -> tuple[int, float] | None:
    """(bytes held, the wait to suggest) when reservations and quarantined ranges could serve
    a put of ``want`` replicas of ``size`` bytes once taken back -- the put then waits
    instead of evicting or failing -- else None. Counted in free bytes (a segment whose free
    ranges are scattered may still not fit it: the client then finds -200 again and, out of
    patience, reports it)."""
    clients = list(clients)
    held = reclaimable(inflight, clients)
    if not held:
        return None
    fits = [s for s in segs.values() if s.alloc.free_bytes + held.get(s, 0) >= size]
    if len(fits) < want or not any(held.get(s, 0) for s in fits):
        return None
    soonest = reclaim_s  # a reservation is taken back then; a quarantine at its owner's next beat
    for key, p in inflight.items():
        if key.startswith(RESERVATION_PREFIX):
            soonest = min(soonest, max(0.0, p.start + reclaim_s - now))
    for c in clients:
        if c.quarantine:
            soonest = min(soonest, max(0.05, c.beat_at[1] - c.beat_at[0]) if c.beat_at[0] >= 0 else 0.5)
    return sum(held.get(s, 0) for s in fits), min(max(soonest, 0.05), 0.5)


def no_space_message(key: str, want: int, size: int, used: int, capacity: int,
                     held: tuple[dict[str, Holdings], bool]) -> str:
    """A refused put's error: nothing evictable remains, and what holds each segment."""
    per, complete = held
    segs = "; ".join(f"{name}: {h.describe()}" for name, h in per.items())
    note = "" if complete else f" (objects counted up to {MAX_COUNTED_OBJECTS})"
    return (f"put {key!r}: no space for {want} replica(s) of {size} bytes (used {used} of {capacity}; "
            f"nothing evictable) -- held per segment{note}: {segs}")


class SpaceReclaiming(MooncakeError):
    """-200 for a put the master asks to be repeated after ``wait_s``: the space it needs is
    held by reservations or quarantined ranges being taken back (its words are what
    ``reclaim_wait`` reads on the client's side)."""

    def __init__(self, key: str, want: int, size: int, held: int, wait_s: float):
        super().__init__(ErrorCode.NO_AVAILABLE_HANDLE,
                         f"put {key!r}: no space now for {want} replica(s) of {size} bytes; {held} bytes held by "
                         f"reservations and quarantined ranges are being taken back "
                         f"(space being reclaimed: retry in {wait_s:.2f}s)")
        self.wait_s = wait_s


def reclaim_wait(message: str) -> float | None:
    """The wait a -200 answer asks for before the put is repeated, or None for a pool that is
    really full (see ``reclaiming_message``)."""
    m = _WAIT.search(message)
    return float(m.group(1)) if m else None
