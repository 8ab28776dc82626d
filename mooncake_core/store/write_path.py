"""The write path of one store client: every put, from placement to publication.

A put: the master places it (``put_start``, or a reservation it handed out with the last
put -- see ``reservations``), the bytes go straight from the caller's memory into the placed
ranges (a memcpy into our own segment, one vectored ``batch_transfer_sync_write`` per remote
segment), then the master publishes it (``put_commit`` / ``put_end``), or takes it back
(``put_revoke``) when the write failed. Codes per key: an existing key is success for put
(the old value stays), a failed write -800, a master error its code.

Three routes, one set of rules:

* a single put goes through the single reservation when one fits (one round trip), else
  ``put_start`` + ``put_commit`` (asking for the next reservation);
* a batch of one-piece (or piece-table) objects goes as arrays (``batch_arrays``): one
  ``batch_put_start``, the replicas grouped by target segment, one copy or vectored write
  per group, one ``batch_put_commit`` / ``batch_put_end``; a batch reservation when one
  fits. Why: with per-key Python objects a batch of 1,000 x 1 KiB puts cost ~12 us of client
  CPU per object (the original C++ client: ~5 us);
* anything else (upserts of one key, several replicas per key, a reply the arrays do not
  cover) goes key by key through ``finish_puts``.

A failed write is retried key by key so one bad peer fails only its keys, and a peer that
did not answer for half a timeout is not asked again in the same call. The rules every
route shares exist once here: revoke after a failed write (``_revoke``), the put a master
lost during the write (``_unpublished``), the fallback to ``put_end`` for an older master
without the commit RPCs (``_publish``).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, TypeVar

import msgspec
import numpy as np

from mooncake_core.errors import MooncakeError
from mooncake_core.store.batch_arrays import part_offsets, parts_arrays, pieces, placement_arrays
from mooncake_core.store.client_metrics import ClientMetrics
from mooncake_core.store.codes import EXISTS, INTERNAL, INVALID, NO_HANDLE, NOT_FOUND, OK, TRANSFER_FAIL
from mooncake_core.store.internals import EngineLike, Parts
from mooncake_core.store.local_view import SegmentView
from mooncake_core.store.master_client import MasterClient
from mooncake_core.store.memory import fingerprint, fingerprint_in, fingerprints, memmove, spans
from mooncake_core.store.owned import OwnedIndex
from mooncake_core.store.packing import expand_placements
from mooncake_core.store.peer_timeout import unresponsive
from mooncake_core.store.protocol import Placements, ReplicaDesc, ReplicateConfigMsg
from mooncake_core.store.reservations import BatchReservation, Reservation, ReservationSlot, sizes_blob
from mooncake_core.store.segment import StoreSegment
from mooncake_core.store.space_wait import SpaceWait, start_put
from mooncake_core.store.types import ReplicateConfig
from mooncake_core.utils.log import get_logger

__all__ = ["WritePath"]

log = get_logger("mooncake.store.client")

T = TypeVar("T")

#: (source parts, object size, replica): one replica of one object to write
Job = tuple[Parts, int, ReplicaDesc]


def _older_master(e: MooncakeError) -> bool:
    """A master of an older release answers an RPC it does not know as a malformed request."""
    return e.code == INVALID and "malformed request" in str(e)


class _Batch:
    """One batch put as the array route sees it: ``keys[i]`` is the ``sizes[i]`` bytes at
    ``src[i]`` (``values``: the bytes objects themselves, when they are), or, for objects of
    several pieces, ``table`` = (the per-key pieces, then per piece: its key, its offset in
    the object, address and length)."""

    __slots__ = ("keys", "msg", "op", "sizes", "src", "t0", "table", "upsert", "values")

    def __init__(self, keys: list[str], sizes: list[int], msg: ReplicateConfigMsg, upsert: bool, op: str, *,
                 src: list[int] | None = None, values: list[Any] | None = None,
                 table: tuple[list[Parts], np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None):
        self.t0 = time.perf_counter()
        self.keys = keys
        self.sizes = sizes
        self.msg = msg
        self.upsert = upsert
        self.op = op
        self.src = src
        self.values = values
        self.table = table

    @classmethod
    def of_parts(cls, keys: list[str], parts: list[Parts], msg: ReplicateConfigMsg, upsert: bool,
                 op: str) -> _Batch:
        counts, pa, pl = parts_arrays(parts)
        key, off = part_offsets(counts, pl)
        sizes = np.bincount(key, pl, len(keys)).astype(np.int64).tolist() if len(pl) else [0] * len(keys)
        return cls(keys, sizes, msg, upsert, op, table=(parts, key, off, pa, pl))

    def srcs(self) -> list[Parts]:
        """The per-key source pieces (for the per-key route)."""
        if self.table is not None:
            return self.table[0]
        assert self.src is not None
        return [[(a, s)] for a, s in zip(self.src, self.sizes)]


class _Placed(NamedTuple):
    """The placed objects of a batch: their key indices, sources (one-piece objects; else
    unused), destinations and sizes."""

    pos: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    ln: np.ndarray


class WritePath:
    """Puts of one store client (thread-safe: the reservation slots serialise their users;
    everything else is per call). Built at setup from the client's master stub, engine,
    segment view, owned index and metrics; dropped at close."""

    def __init__(self, client_id: str, master: MasterClient, engine: EngineLike, local: SegmentView,
                 owned: OwnedIndex, metrics: ClientMetrics):
        self.client_id = client_id
        self.master = master
        self.engine = engine
        self.local = local
        self.owned = owned
        self.metrics = metrics
        self.single = ReservationSlot()  # our next single put's reservation
        self.batch = ReservationSlot()  # our next batch put's (a BatchReservation)
        self._msgs: dict[tuple, ReplicateConfigMsg] = {}  # see placement()

    # ================================================================== entry
    def put(self, keys: list[str], srcs: list[Parts] | None, cfg: ReplicateConfig, *, upsert: bool, op: str,
            flat: tuple[list[int], list[int], list[Any] | None] | None = None) -> list[int]:
        """One code per key (``StoreCore.put_many`` after its checks). ``srcs[i]``: the
        (address, size) parts whose concatenation is object i; or ``flat`` = (addresses,
        sizes, the bytes objects or None) when every object is one piece (``srcs`` may then
        be None). A batch goes the array route either way."""
        msg = self.placement(cfg)
        t0 = time.monotonic()
        if len(keys) > 1:
            if flat is not None:
                batch = _Batch(keys, flat[1], msg, upsert, op, src=flat[0], values=flat[2])
            else:
                assert srcs is not None
                batch = _Batch.of_parts(keys, srcs, msg, upsert, op)
            codes = self._put_batch(batch)
        else:
            if srcs is None:
                assert flat is not None
                srcs = [[(a, s)] for a, s in zip(flat[0], flat[1])]
            codes = self._put_keys(keys, srcs, msg, upsert=upsert, op=op)
        if TRANSFER_FAIL in codes:
            self._retry_elsewhere(keys, srcs, flat, msg, codes, t0, upsert=upsert, op=op)
        return codes

    def _retry_elsewhere(self, keys: list[str], srcs: list[Parts] | None,
                         flat: tuple[list[int], list[int], list[Any] | None] | None, msg: ReplicateConfigMsg,
                         codes: list[int], t0: float, *, upsert: bool, op: str) -> None:
        """Put once more, placed away from them, the keys whose write failed (-800, revoked)
        when segments stopped answering during the call (``unreachable_since``: a refused
        connection, a reset, a timeout -- not a refused request): a segment whose owner died
        stays mounted at the master until its client_ttl, and without this every put placed
        there in the meantime fails. Once, and only when the first try ended within 1.5
        transfer timeouts (a write that waited out one timeout is retried; the retry's writes
        are bounded by one more): a put never takes longer than 2.5 timeouts. A key the retry
        cannot place (nothing else fits: the master answers -200, never the avoided segment)
        stays -800."""
        unreachable = getattr(self.engine, "unreachable_since", None)
        timeout = float(getattr(self.engine, "timeout", 30.0) or 30.0)
        if unreachable is None or time.monotonic() - t0 > 1.5 * timeout:
            return
        down = sorted(unreachable(t0))
        if not down:
            return
        idx = [i for i, c in enumerate(codes) if c == TRANSFER_FAIL]
        if srcs is None:
            assert flat is not None
            srcs = [[(flat[0][i], flat[1][i])] for i in range(len(keys))]
        retry = msgspec.structs.replace(msg, avoid_segments=sorted(set(msg.avoid_segments) | set(down)))
        log.info("%s: %d put(s) failed writing to unreachable segment(s) %s; placing them elsewhere",
                 op, len(idx), ", ".join(down))
        again = self._put_keys([keys[i] for i in idx], [srcs[i] for i in idx], retry, upsert=upsert, op=op,
                               reserve=False)
        for i, c in zip(idx, again):
            if c == OK:
                codes[i] = OK
            elif c != TRANSFER_FAIL:
                log.warning("%s of %r: retry away from %s failed (%d); the put stays failed",
                            op, keys[i], ", ".join(down), c)

    def placement(self, cfg: ReplicateConfig) -> ReplicateConfigMsg:
        """The placement message of ``cfg`` (validated by the caller), built once per distinct
        config: a fresh one (``to_msg`` validates again) costs ~10 us, a share of every single
        put -- and a reservation is used only by a put of the same message object. The cached
        messages are shared: nothing below mutates them (they are encoded)."""
        local = self.local
        segs = cfg.preferred_segments
        ck: tuple | None = (cfg.replica_num, cfg.soft_pin_action, cfg.soft_pin_ttl_ms, bool(cfg.with_hard_pin),
                            cfg.preferred_segment, tuple(segs) if isinstance(segs, (list, tuple)) else segs,
                            bool(cfg.prefer_alloc_in_same_node) and local.segment is not None, local.name,
                            tuple(cfg.group_ids) if isinstance(cfg.group_ids, (list, tuple)) else cfg.group_ids)
        try:
            msg = self._msgs.get(ck) if ck is not None else None
        except TypeError:  # an unhashable field: build it every time
            msg, ck = None, None
        if msg is not None:
            return msg
        msg = cfg.to_msg()
        if cfg.prefer_alloc_in_same_node and local.segment is not None \
                and local.name not in msg.preferred_segments:
            msg.preferred_segments.insert(0, local.name)  # local first: a memcpy
        if ck is not None and len(self._msgs) < 256:
            self._msgs[ck] = msg
        return msg

    def stale_reservations(self) -> list[int]:
        """Addresses of our reservations held unused past their age, dropped here: the
        heartbeat lets the master free them (``ReservationSlot.release_stale``)."""
        now = time.monotonic()
        return self.single.release_stale(now) + self.batch.release_stale(now)

    # ================================================================== shared rules
    def _revoke(self, keys: list[str]) -> None:
        """``put_revoke`` of puts whose write failed: the master frees their ranges (an old
        value of the key stays)."""
        try:
            if len(keys) == 1:
                self.master.put_revoke(self.client_id, keys[0])
            else:
                self.master.batch_put_revoke(self.client_id, keys)
        except MooncakeError as e:
            log.warning("put_revoke after failed write: %s", e)

    def _unpublished(self, version: Any, upsert: bool, op: str, key: str) -> int | None:
        """The code of a put whose publication answered ``version`` when it published nothing,
        else None. A negative version is the master's error. 0 for an upsert: the master no
        longer knew this put (it changed during the write) and the key is back with another
        value; 0 would tell the caller its value replaced the old one while every reader keeps
        the old one. (0 for a put: it lost to an existing value, which is success.)"""
        if isinstance(version, int) and version < 0:
            return version
        if upsert and version == 0:
            log.warning("%s of %r: the master lost the put in progress (restart or failover "
                        "during the write); the value was not published", op, key)
            return NOT_FOUND
        return None

    def _publish(self, slot: ReservationSlot, commit: Callable[[], T], end: Callable[[], T], rpc: str,
                 what: str) -> T:
        """``commit`` (publish and ask for the next reservation); against a master without
        that RPC (an older release) ``end`` instead, and ``slot``'s puts take two round trips
        from now on. Raises MooncakeError."""
        try:
            return commit()
        except MooncakeError as e:
            if not _older_master(e):
                raise
            slot.enabled = False
            log.info("master has no %s (%s); %s take two round trips", rpc, e, what)
        return end()

    # ================================================================== writing replicas
    def write_replicas(self, jobs: list[Job], skip: set[str] | None = None) -> None:
        """Write ``(source parts, object size, replica)`` jobs: memcpy into our own segment,
        one ``batch_transfer_sync_write`` per remote segment. Raises MooncakeError(-800).
        ``skip``: segments that just timed out (not tried again; a failing one that took that
        long is added), so one dead peer costs a batch one timeout, not one per key."""
        skip = set() if skip is None else skip
        remote: dict[str, tuple[list[int], list[int], list[int]]] = {}
        mine = self.local.name if self.local.segment is not None else None
        for parts, total, rep in jobs:
            own = rep.segment_name == mine
            if own and len(parts) == 1 and parts[0][1] >= total:  # one piece into our memory
                if total:
                    memmove(rep.addr, parts[0][0], total)
                continue
            for src, dst, n in spans(parts, rep.addr, total):
                if own:
                    memmove(dst, src, n)
                else:
                    lists = remote.setdefault(rep.segment_name, ([], [], []))
                    lists[0].append(src)
                    lists[1].append(dst)
                    lists[2].append(n)
        for seg_name, (srcs, dsts, lens) in remote.items():
            if seg_name in skip:
                raise MooncakeError(TRANSFER_FAIL, f"segment {seg_name} did not answer a moment ago; not retried")
            t0 = time.monotonic()
            rc = self.engine.batch_transfer_sync_write(seg_name, srcs, dsts, lens)
            if rc is None or rc < 0:
                if unresponsive(self.engine, t0):
                    skip.add(seg_name)
                raise MooncakeError(TRANSFER_FAIL, f"write of {sum(lens)} bytes to segment {seg_name} failed ({rc})")

    def _vectored_write(self, name: str, s: np.ndarray, d: np.ndarray, m: np.ndarray, dead: set[str]) -> bool:
        """One ``batch_transfer_sync_write`` of pieces to segment ``name``: True if it worked. A
        segment that failed after half a timeout is added to ``dead`` (not asked again, neither
        by the key-by-key retry that follows nor by the rest of the batch)."""
        t0 = time.monotonic()
        rc = self.engine.batch_transfer_sync_write(name, s.tolist(), d.tolist(), m.tolist())
        if rc is not None and rc >= 0:
            return True
        if unresponsive(self.engine, t0):
            dead.add(name)
        return False

    # ================================================================== key by key
    def _put_keys(self, keys: list[str], srcs: list[Parts], msg: ReplicateConfigMsg, *, upsert: bool,
                  op: str, reserve: bool = True) -> list[int]:
        """put_start (one key: through the single reservation when ``reserve``) or
        batch_put_start, then ``finish_puts``."""
        t0 = time.perf_counter()
        master = self.master
        n = len(keys)
        sizes = [parts[0][1] if len(parts) == 1 else sum(sz for _, sz in parts) for parts in srcs]
        if n == 1 and not upsert and reserve and self.single.enabled:
            return [self._put_one(keys[0], srcs[0], sizes[0], msg, op, t0)]
        allocs: list[list[ReplicaDesc] | int]
        try:
            if n == 1:
                try:
                    allocs = [start_put(lambda: master.upsert_start(self.client_id, keys[0], sizes[0], msg) if upsert
                                        else master.put_start(self.client_id, keys[0], sizes[0], msg))]
                except MooncakeError as e:
                    allocs = [e.code]
            elif upsert:
                allocs = list(master.batch_upsert_start(self.client_id, keys, sizes, msg))
            else:
                allocs = list(master.batch_put_start(self.client_id, keys, sizes, msg))
        except MooncakeError as e:
            return [e.code] * n
        return self.finish_puts(keys, srcs, sizes, allocs, upsert=upsert, op=op, t0=t0)

    def finish_puts(self, keys: list[str], srcs: list[Parts], sizes: list[int], allocs: list[list[ReplicaDesc] | int],
                    *, upsert: bool, op: str, t0: float) -> list[int]:
        """The per-key rest of a put once the master placed it: write, then end/revoke."""
        n = len(keys)
        results = [OK] * n
        started: list[int] = []
        reps: dict[int, list[ReplicaDesc]] = {}
        for i, a in enumerate(allocs):
            if isinstance(a, int):
                # put of an existing key keeps the old value and counts as success
                results[i] = OK if (a == EXISTS and not upsert) else a
            else:
                started.append(i)
                reps[i] = a
        done: list[int] = []
        failed: list[int] = []
        if started:
            dead: set[str] = set()
            try:
                self.write_replicas([(srcs[i], sizes[i], rep) for i in started for rep in reps[i]], dead)
                done = started
            except MooncakeError as e:
                # retry key by key so one bad peer fails only its keys (and a peer that timed
                # out is not waited for again)
                if len(started) == 1:
                    failed = started
                    log.warning("%s: %s", op, e)
                else:
                    for i in started:
                        try:
                            self.write_replicas([(srcs[i], sizes[i], rep) for rep in reps[i]], dead)
                            done.append(i)
                        except MooncakeError as e2:
                            log.warning("%s of %r: %s", op, keys[i], e2)
                            failed.append(i)
        if failed:
            self._revoke([keys[i] for i in failed])
            for i in failed:
                results[i] = TRANSFER_FAIL
        if done:
            dk = [keys[i] for i in done]
            master = self.master
            try:
                end_rcs: list[int | None]
                if len(dk) == 1:
                    end_rcs = [master.put_end(self.client_id, dk[0])]
                else:
                    end_rcs = [*master.batch_put_end(self.client_id, dk)] or [None] * len(dk)
            except MooncakeError as e:
                end_rcs = [e.code] * len(dk)
            published = []
            for i, rc in zip(done, end_rcs):
                code = self._unpublished(rc, upsert, op, keys[i])
                if code is None:
                    published.append((keys[i], reps[i], rc))
                    continue
                results[i] = code
                if not (isinstance(rc, int) and rc < 0):  # lost by the master: not ours either
                    self.owned.discard([keys[i]])
            self.remember_owned_many(published)
        total = sum(sizes[i] for i in range(n) if results[i] == OK)
        self.metrics.count(op, min(results) if results else OK, total, t0)
        return results

    # ================================================================== a single put
    def _put_one(self, key: str, parts: Parts, size: int, msg: ReplicateConfigMsg, op: str, t0: float) -> int:
        """One ``put`` (not upsert) of ``size`` bytes from ``parts``: into the single
        reservation when it fits, else put_start first (see ``reservations``)."""
        slot = self.single
        resv, owner = slot.take(size, msg, self.local.epoch, time.monotonic())
        keep: Reservation | None = None
        try:
            rc: int | None = None
            if resv is not None:
                rc, keep = self._put_one_reserved(key, parts, size, msg, resv)
            if rc is None:
                rc, keep = self._put_one_started(key, parts, size, msg, op, owner)
            self.metrics.count(op, rc, size if rc == OK else 0, t0)
            return rc
        finally:
            if owner:
                slot.give(keep)

    def _commit_one(self, key: str, size: int, msg: ReplicateConfigMsg, reserved: bool,
                    want_next: bool) -> tuple[int, Reservation | None]:
        """``put_commit``: (version, the next reservation or None). Raises MooncakeError."""
        t = time.monotonic()  # before the grant: a reservation's age is never under-counted
        got = self.master.put_commit(self.client_id, key, size, msg, reserved=reserved,
                                     next_size=size if want_next else 0)
        return got.version, (Reservation(got.reservation, size, msg, t, got.epoch) if got.reservation else None)

    def _put_one_reserved(self, key: str, parts: Parts, size: int, msg: ReplicateConfigMsg,
                          r: Reservation) -> tuple[int | None, Reservation | None]:
        """Write into ``r`` and commit it as ``key``: (code, reservation to keep); code None when
        the master does not know ``r`` (-704) or it does not fit (-600): the caller takes
        put_start."""
        try:
            self.write_replicas([(parts, size, rep) for rep in r.reps])
        except MooncakeError as e:
            log.warning("put of %r: %s", key, e)
            return TRANSFER_FAIL, None  # the master replaces the reservation when we ask for the next
        try:
            version, nxt = self._commit_one(key, size, msg, True, True)
        except MooncakeError as e:
            if e.code == EXISTS:  # the old value stays (success, as for put_start); r is still ours
                return OK, r
            if e.code in (NOT_FOUND, INVALID):
                log.debug("put of %r: reservation refused (%s); taking the put_start path", key, e)
                return None, None
            log.warning("%s", e)
            return e.code, None
        self.remember_owned(key, r.reps, version)
        return OK, nxt

    def _put_one_started(self, key: str, parts: Parts, size: int, msg: ReplicateConfigMsg, op: str,
                         want_next: bool) -> tuple[int, Reservation | None]:
        """put_start, write, put_commit (put_revoke when the write failed)."""
        master = self.master
        release = self.single.unused() if want_next else []
        try:
            reps = start_put(lambda: master.put_start(self.client_id, key, size, msg, release=release))
        except MooncakeError as e:
            if e.code != EXISTS:
                log.warning("%s", e)
            return (OK if e.code == EXISTS else e.code), None
        try:
            self.write_replicas([(parts, size, rep) for rep in reps])
        except MooncakeError as e:
            log.warning("%s: %s", op, e)
            self._revoke([key])
            return TRANSFER_FAIL, None
        try:
            version, nxt = self._publish(self.single, lambda: self._commit_one(key, size, msg, False, want_next),
                                         lambda: (master.put_end(self.client_id, key), None),
                                         "put_commit", "single puts")
        except MooncakeError as e:
            log.warning("%s", e)
            return e.code, None
        self.remember_owned(key, reps, version)
        return OK, nxt

    # ================================================================== a batch as arrays
    def _put_batch(self, b: _Batch) -> list[int]:
        """One code per key. One-piece batches of put go through the batch reservation when
        it fits; a master's answer the arrays do not cover goes on key by key
        (``finish_puts`` takes over the same placements)."""
        slot = self.batch if b.table is None and not b.upsert and self.batch.enabled else None
        if slot is None:
            return self._put_batch_started(b, want_next=False)[0]
        resv, owner = slot.take(b.sizes, b.msg, self.local.epoch, time.monotonic())
        keep: BatchReservation | None = None
        try:
            if resv is not None:
                got, keep = self._put_batch_reserved(b, resv)
                if got is not None:
                    return got
            got, keep = self._put_batch_started(b, want_next=owner)
            return got
        finally:
            if owner:
                slot.give(keep)

    def _put_batch_started(self, b: _Batch, want_next: bool) -> tuple[list[int], BatchReservation | None]:
        """``_put_batch`` through batch_put_start: (codes, the next batch reservation
        when ``want_next`` asked for one and the master granted it)."""
        keys, n = b.keys, len(b.keys)
        release = self.batch.unused() if want_next else None
        try:
            pl = self.master.batch_put_start_packed(self.client_id, keys, b.sizes, b.msg, upsert=b.upsert,
                                                    release=release)
        except MooncakeError as e:
            return [e.code] * n, None
        got = None if pl.retry_after_ms else placement_arrays(pl, n)
        if got is None:
            allocs = self._wait_for_space(b, pl) if pl.retry_after_ms else expand_placements(pl, b.sizes)
            return self.finish_puts(keys, b.srcs(), b.sizes, allocs, upsert=b.upsert, op=b.op, t0=b.t0), None
        codes, seg, dst = got
        results = [OK] * n
        if len(dst) < n:
            pos = np.flatnonzero(codes == 0)
            for i in np.flatnonzero(codes).tolist():
                c = int(codes[i])
                # put of an existing key keeps the old value and counts as success
                results[i] = OK if (c == EXISTS and not b.upsert) else c
        else:
            pos = np.arange(n)
        ln = np.fromiter(b.sizes, np.int64, n)[pos]
        src = np.fromiter(b.src, np.int64, n)[pos] if b.src is not None else ln
        placed = _Placed(pos, src, dst, ln)
        ok = np.ones(len(pos), bool)
        groups = [0] if len(pl.segments) == 1 else np.unique(seg).tolist()
        dead: set[str] = set()
        if b.table is None:
            for g in groups:
                sel = None if len(groups) == 1 else np.flatnonzero(seg == g)
                failed = self._write_group(pl.segments[g], placed, sel, b, dead)
                if failed is not None:
                    ok[failed] = False
        else:
            pieces_of = pieces(n, pos, dst, *b.table[1:])
            for g in groups:
                psel = np.flatnonzero(seg[pieces_of[0]] == g) if len(groups) > 1 else None
                ksel = np.flatnonzero(seg == g) if len(groups) > 1 else None
                failed = self._write_pieces(pl.segments[g], placed, ksel, pieces_of, psel, b, dead)
                if failed is not None:
                    ok[failed] = False
        if not ok.all():
            bad = pos[~ok].tolist()
            self._revoke([keys[i] for i in bad])
            for i in bad:
                results[i] = TRANSFER_FAIL
        done = pos[ok]
        nxt = None
        if len(done):
            dk = keys if len(done) == n else [keys[i] for i in done.tolist()]
            vers, nxt = self._publish_batch(dk, b, want_next)
            if isinstance(vers, int):
                for i in done.tolist():
                    results[i] = vers
            else:
                bad_v = vers <= 0
                for j in np.flatnonzero(bad_v).tolist():
                    i = int(done[j])
                    code = self._unpublished(int(vers[j]), b.upsert, b.op, keys[i])
                    if code is not None:
                        results[i] = code
                self._own_placed(keys, dk, done, seg[ok], dst[ok], ln[ok], pl.segments, bad_v, vers)
        total = int(ln[ok].sum()) if len(ln) else 0
        self.metrics.count(b.op, min(results), total, b.t0)
        return results, nxt

    def _wait_for_space(self, b: _Batch, pl: Placements) -> list[list[ReplicaDesc] | int]:
        """The placements of ``pl``, with the keys the master answered -200 for while it takes
        back reservations and quarantine (``pl.retry_after_ms``) asked for again after that
        wait, within one ``SpaceWait`` (see space_wait)."""
        allocs = expand_placements(pl, b.sizes)
        patience = SpaceWait()
        wait_ms = pl.retry_after_ms
        while True:
            again = [i for i, a in enumerate(allocs) if isinstance(a, int) and a == NO_HANDLE]
            if not again or not patience.pause(wait_ms / 1000):
                return allocs
            ks, ss = [b.keys[i] for i in again], [b.sizes[i] for i in again]
            try:
                sub = self.master.batch_put_start_packed(self.client_id, ks, ss, b.msg, upsert=b.upsert)
            except MooncakeError as e:
                for i in again:
                    allocs[i] = e.code
                return allocs
            for i, a in zip(again, expand_placements(sub, ss)):
                allocs[i] = a
            wait_ms = sub.retry_after_ms

    def _outside_own(self, dst: np.ndarray, ln: np.ndarray, seg: StoreSegment, op: str, name: str) -> bool:
        """Whether the master placed any of these objects outside our own memory (the segment
        ``seg`` and memory mounted besides it; never expected: they are then not written)."""
        if not self.local.holds(dst, ln):
            log.warning("%s: the master placed %d object(s) outside our own memory %s; not written",
                        op, len(dst), name)
            return True
        return False

    def _write_group(self, name: str, placed: _Placed, sel: np.ndarray | None, b: _Batch,
                     dead: set[str]) -> np.ndarray | None:
        """Write the one-piece objects bound for segment ``name`` (``sel``: their indices among
        the placed ones, None = all). Returns the indices that failed, or None."""
        pos = placed.pos
        s, d, m = (placed.src, placed.dst, placed.ln) if sel is None \
            else (placed.src[sel], placed.dst[sel], placed.ln[sel])
        every = np.arange(len(pos)) if sel is None else sel
        seg = self.local.segment
        if seg is not None and name == self.local.name:
            if self._outside_own(d, m, seg, b.op, name):
                return every
            contiguous = len(d) < 2 or bool((d[1:] == d[:-1] + m[:-1]).all())
            values = b.values
            if values is not None and contiguous:
                if sel is None and len(values) == len(pos):
                    staged = b"".join(values)
                else:
                    idx = pos if sel is None else pos[sel]
                    staged = b"".join([values[i] for i in idx.tolist()])
                if staged:
                    ctypes.memmove(int(d[0]), staged, len(staged))  # bytes values into our segment: host only
            else:
                for a, src, c in zip(d.tolist(), s.tolist(), m.tolist()):
                    if c:
                        memmove(a, src, c)
            return None
        if name in dead:
            return every
        if self._vectored_write(name, s, d, m, dead):
            return None
        # retry key by key so one bad range fails only its key
        failed = []
        for j, (a, src, c) in enumerate(zip(d.tolist(), s.tolist(), m.tolist())):
            i = j if sel is None else int(sel[j])
            try:
                self.write_replicas([([(src, c)], c, ReplicaDesc(name, a, c))], dead)
            except MooncakeError as e:
                log.warning("%s of %r: %s", b.op, b.keys[int(pos[i])], e)
                failed.append(i)
        return np.array(failed, np.int64) if failed else None

    def _write_pieces(self, name: str, placed: _Placed, ksel: np.ndarray | None,
                      pieces_of: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], psel: np.ndarray | None,
                      b: _Batch, dead: set[str]) -> np.ndarray | None:
        """``_write_group`` of multi-piece objects: the pieces of the objects bound for segment
        ``name`` (``ksel``/``psel``: their indices among the placed objects / the pieces, None =
        all) in one vectored write -- retried object by object when it fails. Returns the
        placed indices that failed, or None."""
        owner, psrc, pdst, plen = pieces_of
        o, s, d, m = (owner, psrc, pdst, plen) if psel is None else (owner[psel], psrc[psel], pdst[psel], plen[psel])
        objs = np.arange(len(placed.pos)) if ksel is None else ksel
        seg = self.local.segment
        if seg is not None and name == self.local.name:
            if self._outside_own(placed.dst[objs], placed.ln[objs], seg, b.op, name):
                return objs
            for a, src, c in zip(d.tolist(), s.tolist(), m.tolist()):
                memmove(a, src, c)
            return None
        if name in dead:
            return objs
        if not len(m) or self._vectored_write(name, s, d, m, dead):
            return None
        failed = []
        order = np.argsort(o, kind="stable")
        o, s, m = o[order], s[order], m[order]
        cuts = np.searchsorted(o, objs)
        ends = np.searchsorted(o, objs, side="right")
        for j, lo, hi in zip(objs.tolist(), cuts.tolist(), ends.tolist()):
            total = int(placed.ln[j])
            try:
                self.write_replicas([(list(zip(s[lo:hi].tolist(), m[lo:hi].tolist())), total,
                                      ReplicaDesc(name, int(placed.dst[j]), total))], dead)
            except MooncakeError as e:
                log.warning("%s of %r: %s", b.op, b.keys[int(placed.pos[j])], e)
                failed.append(j)
        return np.array(failed, np.int64) if failed else None

    def _commit_batch(self, keys: list[str], blob: bytes, msg: ReplicateConfigMsg, reserved: bool, next_blob: bytes,
                      sizes: list[int]) -> tuple[np.ndarray, BatchReservation | None]:
        """batch_put_commit: (the versions, as batch_put_end's; the next reservation, for a
        batch of ``sizes``, or None). Raises MooncakeError."""
        t = time.monotonic()  # before the grant: a reservation's age is never under-counted
        got = self.master.batch_put_commit(self.client_id, keys, blob, msg, reserved=reserved, next_sizes=next_blob)
        addrs = np.frombuffer(got.addrs, np.uint64).astype(np.int64)
        nxt = None
        if got.segment and len(addrs) == len(sizes):
            # a copy: a caller reusing its list of sizes must not change what the ranges were made for
            nxt = BatchReservation(got.segment, addrs, list(sizes), next_blob, msg, t, got.epoch)
        return np.frombuffer(got.versions, np.int64), nxt

    def _publish_batch(self, dk: list[str], b: _Batch, want_next: bool
                       ) -> tuple[np.ndarray | int, BatchReservation | None]:
        """Publish the written keys ``dk`` of batch ``b`` in one round trip: (their versions,
        or the error code for all of them; the next batch reservation). ``want_next``:
        batch_put_commit asking for a reservation for a next batch like ``b``; else
        batch_put_end."""
        def end() -> tuple[np.ndarray, BatchReservation | None]:
            return np.frombuffer(self.master.batch_put_end_packed(self.client_id, dk), np.int64), None

        try:
            if want_next:
                vers, nxt = self._publish(self.batch,
                                          lambda: self._commit_batch(dk, b"", b.msg, False, sizes_blob(b.sizes),
                                                                     b.sizes),
                                          end, "batch_put_commit", "batch puts")
            else:
                vers, nxt = end()
        except MooncakeError as e:
            return e.code, None
        if len(vers) != len(dk):  # a reply that does not add up: no key counts as published
            return INTERNAL, nxt
        return vers, nxt

    def _put_batch_reserved(self, b: _Batch, r: BatchReservation) -> tuple[list[int] | None, BatchReservation | None]:
        """Write the batch into reservation ``r`` and publish it with one batch_put_commit
        (asking for the next reservation): (one code per key, or None when ``r`` cannot be
        used -- a write failed, or the master does not know ``r`` any more (-704) or finds it
        does not fit (-600) -- and the batch_put_start route should put the batch instead;
        the next reservation)."""
        assert b.src is not None
        keys, n = b.keys, len(b.keys)
        ln = np.fromiter(b.sizes, np.int64, n)
        placed = _Placed(np.arange(n), np.fromiter(b.src, np.int64, n), r.addrs, ln)
        if self._write_group(r.segment, placed, None, b, set()) is not None:
            return None, None
        try:
            vers, nxt = self._commit_batch(keys, r.blob, b.msg, True, r.blob, b.sizes)
        except MooncakeError as e:
            if e.code in (NOT_FOUND, INVALID):
                log.debug("%s: batch reservation refused (%s); taking the put_start path", b.op, e)
                return None, None
            log.warning("%s", e)
            return [e.code] * n, None
        if len(vers) != n:
            log.warning("%s: batch_put_commit answered %d codes for %d keys", b.op, len(vers), n)
            return [INTERNAL] * n, nxt
        results = [OK] * n
        pub = vers > 0
        if not pub.all():
            for i in np.flatnonzero(~pub).tolist():
                c = int(vers[i])
                if c < 0 and c != EXISTS:  # an existing key keeps its old value: success, as for put_start
                    results[i] = c
        if r.segment == self.local.name:
            if pub.all():
                self._own(keys, r.addrs, ln, vers)
            elif pub.any():
                self._own([keys[i] for i in np.flatnonzero(pub).tolist()], r.addrs[pub], ln[pub], vers[pub])
        else:
            self.owned.discard([keys[i] for i in np.flatnonzero(pub).tolist()])
        self.metrics.count(b.op, min(results), int(ln[pub].sum()), b.t0)
        return results, nxt

    # ================================================================== the owned index
    def _own_placed(self, keys: list[str], dk: list[str], done: np.ndarray, seg: np.ndarray, dst: np.ndarray,
                    ln: np.ndarray, segments: list[str], bad: np.ndarray, vers: np.ndarray) -> None:
        """The owned index after a batch published the keys ``dk`` (at ``done`` in ``keys``):
        those published into our own segment are ours, the others are not."""
        local = self.local
        mine = np.zeros(len(done), bool)
        if local.segment is not None and local.name in segments:
            mine = (seg == segments.index(local.name)) & ~bad
        if not mine.all():
            self.owned.discard([keys[i] for i in done[~mine].tolist()])
        if local.segment is None or not mine.any():
            return
        if mine.all():
            self._own(dk, dst, ln, vers)
        else:
            self._own([keys[i] for i in done[mine].tolist()], dst[mine], ln[mine], vers[mine])

    def _own(self, keys: list[str], dst: np.ndarray, ln: np.ndarray, vers: np.ndarray) -> None:
        """Owned-index entries of objects just published in our own segment. Objects in memory
        mounted besides it (``mount_segment``) are not re-reported after a master change."""
        own = self.local.segment
        view = own.view if own is not None else None
        if own is None or view is None:
            return
        inside = self.local.in_segment(dst, ln)
        if not inside.all():
            self.owned.discard([keys[i] for i in np.flatnonzero(~inside).tolist()])
            keys = [keys[i] for i in np.flatnonzero(inside).tolist()]
            dst, ln, vers = dst[inside], ln[inside], vers[inside]
        if keys:
            self.owned.add_batch(self.local.name, keys, dst, ln, fingerprints(view, dst - own.addr, ln), vers)

    def remember_owned(self, key: str, replicas: Iterable[ReplicaDesc], version: Any) -> None:
        """After put_end: re-report this object after a master change if it lives in our
        segment and the put really published it (``version`` > 0)."""
        self.remember_owned_many([(key, replicas, version)])

    def remember_owned_many(self, published: Sequence[tuple[str, Iterable[ReplicaDesc], Any]]) -> None:
        """``remember_owned`` of every ``(key, replicas, version)`` of a batch: one pass, one
        lock, fingerprints of all of them at once."""
        seg = self.local.segment
        if seg is None or not published:
            return
        name = self.local.name
        if len(published) == 1 and seg.view is not None:  # a single put: no numpy (fixed costs)
            key, replicas, version = published[0]
            mine = next((r for r in replicas if r.segment_name == name), None)
            off = mine.addr - seg.addr if mine is not None else -1
            if not isinstance(version, int) or version <= 0 or mine is None or not 0 <= off <= seg.size - mine.size:
                self.owned.discard([key])  # (memory mounted besides the segment is not re-reported)
            else:
                self.owned.add(key, mine, fingerprint_in(seg.view, off, mine.size), version)
            return
        keys: list[str] = []
        addrs: list[int] = []
        sizes: list[int] = []
        versions: list[int] = []
        gone: list[str] = []
        for key, replicas, version in published:
            if not isinstance(version, int) or version <= 0:
                gone.append(key)  # nothing published (lost to an existing value): not ours
                continue
            for rep in replicas:
                if rep.segment_name == name and seg.addr <= rep.addr <= seg.addr + seg.size - rep.size:
                    keys.append(key)
                    addrs.append(rep.addr)
                    sizes.append(rep.size)
                    versions.append(version)
                    break
            else:
                gone.append(key)
        if gone:
            self.owned.discard(gone)
        if keys:
            a, m = np.array(addrs, np.int64), np.array(sizes, np.int64)
            self.owned.add_batch(name, keys, a, m, _fingerprints(seg, a, m), np.array(versions, np.int64))


def _fingerprints(seg: StoreSegment, addrs: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Fingerprints of replicas as written, from our own memory (all at once over a view of
    the segment; a range outside it, never expected, is read on its own)."""
    view = seg.view
    offs = addrs - seg.addr
    if view is not None and bool(((offs >= 0) & (offs + sizes <= seg.size)).all()):
        return fingerprints(view, offs, sizes)
    return np.array([fingerprint(a, m) for a, m in zip(addrs.tolist(), sizes.tolist())], np.uint64)
