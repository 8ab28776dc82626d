"""Single puts in one master round trip, through a reservation (client side).

Why: a ``put`` of one object used to cost two master round trips -- ``put_start`` (where to
write), the write, ``put_end`` (publish) -- and on a loaded host each round trip is a wake-up
of the master and one of the client, most of a small put's time (issue 18: ~60 of ~200 us,
plus the waits for a core). Now ``put_commit`` publishes a put *and* hands out a
reservation: the range the next ``put_start`` would have allocated, placed by the same
rules (``MasterState.put_commit``). The next put of the same size and placement writes
into it and needs only ``put_commit``: one round trip. Without a fitting reservation a put
is ``put_start``, write, ``put_commit`` (asking for the next reservation).

Safety: a reservation is an in-flight put to the master (unmount, client expiry, release
timeouts cover it). We write into one only while it is young (``RESERVATION_MAX_AGE_S``,
counted from before the master granted it) and granted by the master our segment is mounted
at: a master that restarted meanwhile answers -704 and keeps re-mounted segments free of new
allocations for its recovery hold (1 s by default), longer than such a late write. A
reservation the master does not know (-704) or that does not fit (-600) sends the put down
the ``put_start`` path; codes are those of ``StoreCore.finish_puts`` (an existing key is
success and keeps its old value, a failed write -800). One reservation per client, used by
one put at a time (``ReservationSlot``); concurrent single puts of other threads take the
two-round-trip path meanwhile.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from mooncake_core.errors import MooncakeError
from mooncake_core.store.codes import EXISTS, INVALID, NOT_FOUND, OK, TRANSFER_FAIL
from mooncake_core.store.internals import Parts
from mooncake_core.store.master_records import RESERVATION_MAX_AGE_S
from mooncake_core.store.protocol import ReplicaDesc, ReplicateConfigMsg
from mooncake_core.store.space_wait import start_put
from mooncake_core.utils.log import get_logger

if TYPE_CHECKING:
    from mooncake_core.store.core import StoreCore

__all__ = ["RESERVATION_MAX_AGE_S", "Reservation", "ReservationSlot", "put"]

log = get_logger("mooncake.store.client")

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


class ReservationSlot:
    """The one reservation of a client and who uses it (thread-safe). ``take`` hands it to
    one put at a time; that put ``give``s back the next one (or None)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current: Reservation | None = None
        self._busy = False
        #: the reservation the slot's owner took and did not use (see ``unused``)
        self._dropped: Any = None
        #: False once the master turned ``put_commit`` down (an older master): two round trips
        self.enabled = True

    def take(self, size: Any, msg: ReplicateConfigMsg, epoch: int, now: float) -> tuple[Any, bool]:
        """(the reservation if it fits a put of ``size`` bytes placed by ``msg`` -- the same
        message object, young at ``now``, granted in ``epoch`` (0: not known) -- else None;
        whether the caller now owns the slot and must ``give``). The slot is emptied either
        way: a reservation that does not fit is dropped (the master replaces it when the
        next one is asked for). The same slot keeps a batch's reservation
        (``batch_path.BatchReservation``: ``size`` is then the list of sizes)."""
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


def put(core: StoreCore, key: str, parts: Parts, size: int, msg: ReplicateConfigMsg, op: str, t0: float) -> int:
    """One ``put`` (not upsert) of ``size`` bytes from ``parts``: its code (see module docstring)."""
    slot = core.single
    resv, owner = slot.take(size, msg, core.master_epoch, time.monotonic())
    keep: Reservation | None = None
    try:
        rc: int | None = None
        if resv is not None:
            rc, keep = _put_reserved(core, key, parts, size, msg, resv)
        if rc is None:
            rc, keep = _put_started(core, key, parts, size, msg, op, owner)
        core.count(op, rc, size if rc == OK else 0, t0)
        return rc
    finally:
        if owner:
            slot.give(keep)


def _commit(core: StoreCore, key: str, size: int, msg: ReplicateConfigMsg, reserved: bool,
            want_next: bool) -> tuple[int, Reservation | None]:
    """``put_commit``: (version, the next reservation or None). Raises MooncakeError."""
    t = time.monotonic()  # before the grant: a reservation's age is never under-counted
    got = core.master.put_commit(core.client_id, key, size, msg, reserved=reserved,
                                 next_size=size if want_next else 0)
    return got.version, (Reservation(got.reservation, size, msg, t, got.epoch) if got.reservation else None)


def _put_reserved(core: StoreCore, key: str, parts: Parts, size: int, msg: ReplicateConfigMsg,
                  r: Reservation) -> tuple[int | None, Reservation | None]:
    """Write into ``r`` and commit it as ``key``: (code, reservation to keep); code None when
    the master does not know ``r`` or it does not fit (the caller takes put_start)."""
    try:
        core.write_replicas([(parts, size, rep) for rep in r.reps])
    except MooncakeError as e:
        log.warning("put of %r: %s", key, e)
        return TRANSFER_FAIL, None  # the master replaces the reservation when we ask for the next
    try:
        version, nxt = _commit(core, key, size, msg, True, True)
    except MooncakeError as e:
        if e.code == EXISTS:  # the old value stays (success, as for put_start); r is still ours
            return OK, r
        if e.code in (NOT_FOUND, INVALID):
            log.debug("put of %r: reservation refused (%s); taking the put_start path", key, e)
            return None, None
        log.warning("%s", e)
        return e.code, None
    core.remember_owned(key, r.reps, version)
    return OK, nxt


def _put_started(core: StoreCore, key: str, parts: Parts, size: int, msg: ReplicateConfigMsg, op: str,
                 want_next: bool) -> tuple[int, Reservation | None]:
    """put_start, write, put_commit (put_revoke when the write failed)."""
    master = core.master
    release = core.single.unused() if want_next else []
    try:
        reps = start_put(lambda: master.put_start(core.client_id, key, size, msg, release=release))
    except MooncakeError as e:
        if e.code != EXISTS:
            log.warning("%s", e)
        return (OK if e.code == EXISTS else e.code), None
    try:
        core.write_replicas([(parts, size, rep) for rep in reps])
    except MooncakeError as e:
        log.warning("%s: %s", op, e)
        try:
            master.put_revoke(core.client_id, key)
        except MooncakeError as e2:
            log.warning("put_revoke after failed write: %s", e2)
        return TRANSFER_FAIL, None
    nxt = None
    try:
        version, nxt = _commit(core, key, size, msg, False, want_next)
    except MooncakeError as e:
        if e.code != INVALID or "malformed request" not in str(e):
            log.warning("%s", e)
            return e.code, None
        # a master without put_commit (an older release): put_end, and two round trips from now on
        core.single.enabled = False
        log.info("master has no put_commit (%s); single puts take two round trips", e)
        try:
            version = master.put_end(core.client_id, key)
        except MooncakeError as e2:
            log.warning("%s", e2)
            return e2.code, None
    core.remember_owned(key, reps, version)
    return OK, nxt
