"""Space the master set aside for a client's next put (client side): one round trip per put.

Why: a ``put`` of one object used to cost two master round trips -- ``put_start`` (where to
write), the write, ``put_end`` (publish) -- and on a loaded host each round trip is a wake-up
of the master and one of the client, most of a small put's time. ``put_commit`` publishes a
put *and* hands out a reservation: the range the next ``put_start`` would have allocated,
placed by the same rules (``MasterState.put_commit``). The next put of the same size and
placement writes into it and needs only ``put_commit``: one round trip. Batches do the same
with ``batch_put_commit`` (one range per object of the batch).

Safety: a reservation is an in-flight put to the master (unmount, client expiry, release
timeouts cover it). We write into one only while it is young (``RESERVATION_MAX_AGE_S``,
counted from before the master granted it) and granted by the master our segment is mounted
at: a master that restarted meanwhile answers -704 and keeps re-mounted segments free of new
allocations for its recovery hold (1 s by default), longer than such a late write. One
reservation per client and kind (single, batch), used by one put at a time
(``ReservationSlot``); concurrent puts of other threads take the two-round-trip path meanwhile.
The puts themselves are ``write_path.WritePath``'s.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from mooncake_core.store.master_records import RESERVATION_MAX_AGE_S
from mooncake_core.store.protocol import ReplicaDesc, ReplicateConfigMsg

__all__ = ["RESERVATION_MAX_AGE_S", "BatchReservation", "Reservation", "ReservationSlot", "sizes_blob"]

# RESERVATION_MAX_AGE_S (master_records): a reservation older than this is not written into
# (see the module docstring); well within the master's recovery hold (1 s by default), and
# the contract that lets the master take an unused one back (MasterConfig.reservation_reclaim_s)


class Reservation:
    """Space the master set aside for our next single put: where (``reps``), for what
    (``size``, placement ``msg``), asked for at ``t`` (monotonic) from the master of ``epoch``."""

    __slots__ = ("epoch", "msg", "reps", "size", "t")

    def __init__(self, reps: list[ReplicaDesc], size: int, msg: ReplicateConfigMsg, t: float, epoch: int):
        self.reps = reps
        self.size = size
        self.msg = msg
        self.t = t
        self.epoch = epoch

    @property
    def addr(self) -> int:
        """Where its first range starts: how the master is told which one we let go of."""
        return self.reps[0].addr


class BatchReservation:
    """Space the master set aside for our next batch put (``master_batch.put_commits``): one
    range per object of ``size`` (the sizes, in order) at ``addrs`` in ``segment``, for
    placement ``msg``, asked for at ``t`` (monotonic) from the master of ``epoch``; ``blob``:
    the sizes as the master takes them (``sizes_blob``). Used through a ``ReservationSlot``
    by one batch at a time, under the same rules as a single put's reservation."""

    __slots__ = ("addrs", "blob", "epoch", "msg", "segment", "size", "t")

    def __init__(self, segment: str, addrs: np.ndarray, size: list[int], blob: bytes, msg: ReplicateConfigMsg,
                 t: float, epoch: int):
        self.segment = segment
        self.addrs = addrs
        self.size = size
        self.blob = blob
        self.msg = msg
        self.t = t
        self.epoch = epoch

    @property
    def addr(self) -> int:
        """Where its range starts: how the master is told which one we let go of."""
        return int(self.addrs[0])


def sizes_blob(sizes: list[int]) -> bytes:
    """Object sizes as ``batch_put_commit`` takes them (u64 each)."""
    return np.fromiter(sizes, np.uint64, len(sizes)).tobytes()


class ReservationSlot:
    """The one reservation of a client (of one kind) and who uses it (thread-safe). ``take``
    hands it to one put at a time; that put ``give``s back the next one (or None)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current: Any = None  # Reservation or BatchReservation
        self._busy = False
        #: the reservation the slot's owner took and did not use (see ``unused``)
        self._dropped: Any = None
        #: False once the master turned the commit RPC down (an older master): two round trips
        self.enabled = True

    def take(self, size: Any, msg: ReplicateConfigMsg, epoch: int, now: float) -> tuple[Any, bool]:
        """(the reservation if it fits a put of ``size`` bytes placed by ``msg`` -- the same
        message object, young at ``now``, granted in ``epoch`` (0: not known) -- else None;
        whether the caller now owns the slot and must ``give``). The slot is emptied either
        way: a reservation that does not fit is dropped (the master replaces it when the
        next one is asked for). For a batch reservation ``size`` is the list of sizes."""
        with self._lock:
            if self._busy:
                return None, False  # another thread's put holds it
            self._busy = True
            r, self.current = self.current, None
            self._dropped = None
        if r is not None and r.size == size and r.msg is msg and now - r.t < RESERVATION_MAX_AGE_S \
                and epoch in (0, r.epoch):
            return r, True
        self._dropped = r
        return None, True

    def unused(self) -> list[int]:
        """For the slot's owner (after ``take``): the address of the reservation it dropped
        unused, [] if none. No write of ours into it can land (a reservation a write failed
        into is not kept), so the master frees it at once (``release`` of put_start). A
        master that does not hold it under that address for us (it changed) ignores it."""
        r, self._dropped = self._dropped, None
        return [r.addr] if r is not None else []

    def release_stale(self, now: float) -> list[int]:
        """For the heartbeat: the address of the reservation held unused past its age, if the
        slot is idle (dropped here: no put writes into it any more); [] otherwise."""
        with self._lock:
            r = self.current
            if self._busy or r is None or now - r.t < RESERVATION_MAX_AGE_S:
                return []
            self.current = None
        return [r.addr]

    def give(self, r: Any) -> None:
        with self._lock:
            self.current = r
            self._busy = False

    def clear(self) -> None:
        with self._lock:
            self.current = None
