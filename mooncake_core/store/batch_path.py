"""Batches as batches on the client: a put or get of many one-piece objects as arrays.

Why: with the per-key path, a batch of 1,000 x 1 KiB puts cost ~12 us of client CPU per
object (the original C++ client: ~5 us), most of it in Python objects built per key -- a
replica descriptor decoded from the master's reply, a ctypes copy, an owned-index entry,
a hash. Here the master's packed replies (``packing``) are read with ``numpy.frombuffer``;
the replicas are grouped by target segment, and each group is written in one go -- one
copy when the sources are bytes objects and their ranges in our own segment follow each
other (the allocator hands out consecutive ranges to a batch), else one ``memmove`` per key
into our own segment, and one vectored ``batch_transfer_sync_write`` per remote segment
(the Transfer Engine batches scattered blocks); the owned index takes the batch as columns
with fingerprints computed by one numpy gather. Reads get one lease grant per batch, a
vectored read per remote segment and the bytes objects sliced from one staging buffer.

Per-key semantics are the per-key path's (``StoreCore.put_many`` / ``read_batch``): every
key gets its own code; a failed write of one segment is retried key by key so one bad
peer fails only its keys; an existing key counts as success for put (the old value
stays); leases are checked per object after the read. Objects of several pieces
(``*_multi_buffers``, tensors with a header) are the same batches with a piece table: piece
k of an object goes to / comes from the object's offset past the pieces before it, and all
pieces bound for one segment travel in one vectored transfer. Anything unusual -- several
replicas per key, disk replicas, big objects read -- takes the per-key path.
"""

from __future__ import annotations

import ctypes

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from mooncake_core.errors import MooncakeError
from mooncake_core.store.codes import EXISTS, INTERNAL, INVALID, LEASE_EXPIRED, NO_HANDLE, NOT_FOUND, OK, TRANSFER_FAIL
from mooncake_core.store.memory import PREFAULT_MIN, fingerprints, memmove
from mooncake_core.store.packing import expand_gets, expand_placements
from mooncake_core.store.protocol import BatchGetReply, Placements, ReplicaDesc
from mooncake_core.store.space_wait import SpaceWait
from mooncake_core.utils.log import get_logger

if TYPE_CHECKING:
    from mooncake_core.store.core import StoreCore
    from mooncake_core.store.internals import Parts
    from mooncake_core.store.protocol import ReplicateConfigMsg

__all__ = ["BatchReservation", "get_arrays", "part_offsets", "put_flat", "put_parts", "read_flat"]

log = get_logger("mooncake.store.client")


def _arrays(pl: Placements, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(codes, segment index, address) of placements with at most one replica per key (the
    replica arrays list the placed keys in order), or None: several replicas, or a reply that
    does not add up -- the per-key path then decodes (and checks) it."""
    codes = np.frombuffer(pl.codes, np.int32)
    counts = np.frombuffer(pl.counts, np.uint8)
    if len(codes) != n or len(counts) != n:
        return None
    seg = np.frombuffer(pl.seg, np.uint32)
    dst = np.frombuffer(pl.addrs, np.uint64)
    placed = codes == 0
    if not np.array_equal(counts, placed) or len(seg) != len(dst) or len(dst) != int(np.count_nonzero(placed)):
        return None
    if len(seg) and int(seg.max()) >= len(pl.segments):
        return None
    return codes, seg, dst.astype(np.int64)


def part_offsets(counts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(key index, offset inside its object) of every part of a multi-part batch: key i is
    the ``counts[i]`` parts that follow key i-1's, laid end to end (``lens``: their lengths,
    or capacities when reading). Pure; a key may have no parts."""
    key = np.repeat(np.arange(len(counts)), counts)
    ends = np.concatenate(([0], np.cumsum(lens)))
    first = np.concatenate(([0], np.cumsum(counts)))[:-1]
    return key, ends[:-1] - ends[first][key]


def _parts_arrays(parts: list[Parts]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(parts per key, part addresses, part lengths) of per-key (address, length) lists."""
    counts = np.fromiter(map(len, parts), np.int64, len(parts))
    flat = [x for p in parts for pair in p for x in pair]
    pa = np.array(flat, np.int64).reshape(-1, 2) if flat else np.zeros((0, 2), np.int64)
    return counts, pa[:, 0], pa[:, 1]


def put_parts(core: StoreCore, keys: list[str], parts: list[Parts], msg: ReplicateConfigMsg, *, upsert: bool,
              op: str) -> list[int] | None:
    """``put_flat`` of objects made of several pieces each (``parts[i]``: the (address,
    length) pieces whose concatenation is object i), e.g. ``batch_put_from_multi_buffers``:
    one put_start / put_end for the batch, and the pieces of all the objects bound for one
    segment written together (one vectored write per remote segment)."""
    counts, pa, pl = _parts_arrays(parts)
    key, off = part_offsets(counts, pl)
    sizes = np.bincount(key, pl, len(keys)).astype(np.int64).tolist() if len(pl) else [0] * len(keys)
    return put_flat(core, keys, None, sizes, None, msg, upsert=upsert, op=op, parts=(parts, key, off, pa, pl))


def put_flat(core: StoreCore, keys: list[str], src_addrs: list[int] | None, sizes: list[int],
             values: list[Any] | None, msg: ReplicateConfigMsg, *, upsert: bool, op: str,
             parts: tuple[list[Parts], np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
             ) -> list[int] | None:
    """Put ``keys[i]`` = the ``sizes[i]`` bytes at ``src_addrs[i]`` (``values``: the bytes
    objects themselves, when they are). One code per key, or None when the master's answer
    needs the per-key path (``StoreCore.finish_puts`` then takes over the same placements).
    ``parts`` (from ``put_parts``): objects of several pieces instead -- (the per-key
    pieces, then per piece: its key, its offset in the object, address and length)."""
    t0 = time.perf_counter()
    slot = core.batch if parts is None and not upsert and core.batch.enabled else None
    if slot is None:
        return _put_flat(core, keys, src_addrs, sizes, values, msg, upsert, op, parts, t0, None)
    resv, owner = slot.take(sizes, msg, core.master_epoch, time.monotonic())
    keep: list[BatchReservation | None] = [None]
    try:
        if resv is not None:
            got = _put_reserved(core, keys, src_addrs, sizes, values, msg, resv, op, t0, keep)
            if got is not None:
                return got
        return _put_flat(core, keys, src_addrs, sizes, values, msg, upsert, op, parts, t0, keep if owner else None)
    finally:
        if owner:
            slot.give(keep[0])


def _put_flat(core: StoreCore, keys: list[str], src_addrs: list[int] | None, sizes: list[int],
              values: list[Any] | None, msg: ReplicateConfigMsg, upsert: bool, op: str,
              parts: tuple[list[Parts], np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None, t0: float,
              keep: list[BatchReservation | None] | None) -> list[int] | None:
    """``put_flat`` through batch_put_start; ``keep``: ask for a batch reservation when
    publishing, and put it in ``keep[0]``."""
    n = len(keys)
    master = core.master
    release = core.batch.unused() if keep is not None else None
    try:
        pl = master.batch_put_start_packed(core.client_id, keys, sizes, msg, upsert=upsert, release=release)
    except MooncakeError as e:
        return [e.code] * n
    got = None if pl.retry_after_ms else _arrays(pl, n)
    if got is None:
        if parts is not None:
            srcs = parts[0]
        else:
            assert src_addrs is not None
            srcs = [[(a, s)] for a, s in zip(src_addrs, sizes)]
        allocs = _wait_for_space(core, keys, sizes, msg, upsert, pl) if pl.retry_after_ms \
            else expand_placements(pl, sizes)
        return core.finish_puts(keys, srcs, sizes, allocs, upsert=upsert, op=op, t0=t0)
    codes, seg, dst = got
    results = [OK] * n
    if len(dst) < n:
        pos = np.flatnonzero(codes == 0)
        for i in np.flatnonzero(codes).tolist():
            c = int(codes[i])
            # put of an existing key keeps the old value and counts as success
            results[i] = OK if (c == EXISTS and not upsert) else c
    else:
        pos = np.arange(n)
    ln = np.fromiter(sizes, np.int64, n)[pos]
    ok = np.ones(len(pos), bool)
    groups = [0] if len(pl.segments) == 1 else np.unique(seg).tolist()
    dead: set[str] = set()
    if parts is None:
        assert src_addrs is not None
        src = np.fromiter(src_addrs, np.int64, n)[pos]
        for g in groups:
            sel = None if len(groups) == 1 else np.flatnonzero(seg == g)
            failed = _write_group(core, pl.segments[g], sel, pos, src, dst, ln, values, dead, op, keys)
            if failed is not None:
                ok[failed] = False
    else:
        owner, psrc, pdst, plen = _pieces(n, pos, dst, *parts[1:])
        for g in groups:
            psel = np.flatnonzero(seg[owner] == g) if len(groups) > 1 else None
            ksel = np.flatnonzero(seg == g) if len(groups) > 1 else None
            failed = _write_pieces(core, pl.segments[g], ksel, psel, owner, psrc, pdst, plen, pos, dst, ln, dead,
                                   op, keys)
            if failed is not None:
                ok[failed] = False
    if not ok.all():
        bad = pos[~ok].tolist()
        try:
            fk = [keys[i] for i in bad]
            master.batch_put_revoke(core.client_id, fk) if len(fk) > 1 else master.put_revoke(core.client_id, fk[0])
        except MooncakeError as e:
            log.warning("put_revoke after failed write: %s", e)
        for i in bad:
            results[i] = TRANSFER_FAIL
    done = pos[ok]
    if len(done):
        _end(core, keys, done, seg[ok], dst[ok], ln[ok], pl.segments, results, upsert, op, msg, sizes, keep)
    total = int(ln[ok].sum()) if len(ln) else 0
    core.count(op, min(results), total, t0)
    return results


def _wait_for_space(core: StoreCore, keys: list[str], sizes: list[int], msg: ReplicateConfigMsg, upsert: bool,
                    pl: Placements) -> list[list[ReplicaDesc] | int]:
    """The placements of ``pl``, with the keys the master answered -200 for while it takes
    back reservations and quarantine (``pl.retry_after_ms``) asked for again after that wait,
    within one ``SpaceWait`` (see space_wait)."""
    allocs = expand_placements(pl, sizes)
    patience = SpaceWait()
    wait_ms = pl.retry_after_ms
    while True:
        again = [i for i, a in enumerate(allocs) if isinstance(a, int) and a == NO_HANDLE]
        if not again or not patience.pause(wait_ms / 1000):
            return allocs
        ks, ss = [keys[i] for i in again], [sizes[i] for i in again]
        try:
            sub = core.master.batch_put_start_packed(core.client_id, ks, ss, msg, upsert=upsert)
        except MooncakeError as e:
            for i in again:
                allocs[i] = e.code
            return allocs
        for i, a in zip(again, expand_placements(sub, ss)):
            allocs[i] = a
        wait_ms = sub.retry_after_ms


def _vectored_write(core: StoreCore, name: str, s: np.ndarray, d: np.ndarray, m: np.ndarray, dead: set[str]) -> bool:
    """One ``batch_transfer_sync_write`` of pieces to segment ``name``: True if it worked. A
    segment that failed after half a timeout is added to ``dead`` (not asked again, neither
    by the key-by-key retry that follows nor by the rest of the batch)."""
    from mooncake_core.store.core import _unresponsive

    t0 = time.monotonic()
    rc = core.engine.batch_transfer_sync_write(name, s.tolist(), d.tolist(), m.tolist())
    if rc is not None and rc >= 0:
        return True
    if _unresponsive(core.engine, t0):
        dead.add(name)
    return False


def _write_group(core: StoreCore, name: str, sel: np.ndarray | None, pos: np.ndarray, src: np.ndarray,
                 dst: np.ndarray, ln: np.ndarray, values: list[Any] | None, dead: set[str], op: str,
                 keys: list[str]) -> np.ndarray | None:
    """Write the objects of one target segment (``sel``: their indices among the placed
    ones, None = all). Returns the indices that failed, or None."""
    s, d, m = (src, dst, ln) if sel is None else (src[sel], dst[sel], ln[sel])
    seg = core.segment
    if seg is not None and name == core.segment_name:
        off = d - seg.addr
        if len(off) and (int(off.min()) < 0 or int((off + m).max()) > seg.size):
            log.warning("%s: the master placed %d object(s) outside our own segment %s; not written",
                        op, len(off), name)
            return np.arange(len(pos)) if sel is None else sel
        contiguous = len(d) < 2 or bool((d[1:] == d[:-1] + m[:-1]).all())
        if values is not None and contiguous:
            if sel is None and len(values) == len(pos):
                staged = b"".join(values)
            else:
                idx = pos if sel is None else pos[sel]
                staged = b"".join([values[i] for i in idx.tolist()])
            if staged:
                ctypes.memmove(int(d[0]), staged, len(staged))  # bytes values into our segment: host only
        else:
            for a, b, c in zip(d.tolist(), s.tolist(), m.tolist()):
                if c:
                    memmove(a, b, c)
        return None
    if name in dead:
        return np.arange(len(pos)) if sel is None else sel
    if _vectored_write(core, name, s, d, m, dead):
        return None
    # retry key by key so one bad range fails only its key
    failed = []
    for j, (a, b, c) in enumerate(zip(d.tolist(), s.tolist(), m.tolist())):
        i = j if sel is None else int(sel[j])
        try:
            core.write_replicas([([(b, c)], c, ReplicaDesc(name, a, c))], dead)
        except MooncakeError as e:
            log.warning("%s of %r: %s", op, keys[int(pos[i])], e)
            failed.append(i)
    return np.array(failed, np.int64) if failed else None


def _pieces(n: int, pos: np.ndarray, dst: np.ndarray, key: np.ndarray, off: np.ndarray, pa: np.ndarray,
            pl: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(placed index, source, destination, length) of every non-empty piece of a placed
    object (``pos``/``dst``: the placed keys and where their objects go)."""
    jof = np.full(n, -1, np.int64)
    jof[pos] = np.arange(len(pos))
    pj = jof[key] if len(key) else key
    keep = (pj >= 0) & (pl > 0)
    owner = pj[keep]
    return owner, pa[keep], dst[owner] + off[keep], pl[keep]


def _write_pieces(core: StoreCore, name: str, ksel: np.ndarray | None, psel: np.ndarray | None, owner: np.ndarray,
                  psrc: np.ndarray, pdst: np.ndarray, plen: np.ndarray, pos: np.ndarray, dst: np.ndarray,
                  ln: np.ndarray, dead: set[str], op: str, keys: list[str]) -> np.ndarray | None:
    """``_write_group`` of multi-piece objects: the pieces of the objects bound for segment
    ``name`` (``ksel``/``psel``: their indices among the placed objects / the pieces, None =
    all) in one vectored write -- retried object by object when it fails. Returns the
    placed indices that failed, or None."""
    o, s, d, m = (owner, psrc, pdst, plen) if psel is None else (owner[psel], psrc[psel], pdst[psel], plen[psel])
    objs = np.arange(len(pos)) if ksel is None else ksel
    seg = core.segment
    if seg is not None and name == core.segment_name:
        off = dst[objs] - seg.addr
        if len(off) and (int(off.min()) < 0 or int((off + ln[objs]).max()) > seg.size):
            log.warning("%s: the master placed %d object(s) outside our own segment %s; not written",
                        op, len(off), name)
            return objs
        for a, b, c in zip(d.tolist(), s.tolist(), m.tolist()):
            memmove(a, b, c)
        return None
    if name in dead:
        return objs
    if not len(m) or _vectored_write(core, name, s, d, m, dead):
        return None
    failed = []
    order = np.argsort(o, kind="stable")
    o, s, m = o[order], s[order], m[order]
    cuts = np.searchsorted(o, objs)
    ends = np.searchsorted(o, objs, side="right")
    for j, a, b in zip(objs.tolist(), cuts.tolist(), ends.tolist()):
        total = int(ln[j])
        try:
            core.write_replicas([(list(zip(s[a:b].tolist(), m[a:b].tolist())), total,
                                  ReplicaDesc(name, int(dst[j]), total))], dead)
        except MooncakeError as e:
            log.warning("%s of %r: %s", op, keys[int(pos[j])], e)
            failed.append(j)
    return np.array(failed, np.int64) if failed else None


def _end(core: StoreCore, keys: list[str], done: np.ndarray, seg: np.ndarray, dst: np.ndarray, ln: np.ndarray,
         segments: list[str], results: list[int], upsert: bool, op: str, msg: ReplicateConfigMsg, sizes: list[int],
         keep: list[BatchReservation | None] | None) -> None:
    """put_end of the written objects (one round trip), their codes, and the owned index.
    ``keep``: publish with batch_put_commit instead, asking for a reservation for a next
    batch of ``sizes`` (put in ``keep[0]``)."""
    n = len(keys)
    dk = keys if len(done) == n else [keys[i] for i in done.tolist()]
    try:
        vers = None
        if keep is not None:
            try:
                # the time before the grant: a reservation's age is never under-counted
                vers = _commit(core, dk, b"", msg, False, _blob(sizes), time.monotonic(), sizes, keep)
            except MooncakeError as e:
                if e.code != INVALID or "malformed request" not in str(e):
                    raise
                core.batch.enabled = False  # an older master: batch_put_end from now on
                log.info("master has no batch_put_commit (%s); batch puts take two round trips", e)
        if vers is None:
            vers = np.frombuffer(core.master.batch_put_end_packed(core.client_id, dk), np.int64)
        if len(vers) != len(dk):
            raise MooncakeError(INTERNAL, f"put_end: the master answered {len(vers)} codes for {len(dk)} keys")
    except MooncakeError as e:
        for i in done.tolist():
            results[i] = e.code
        return
    bad = vers <= 0
    if bad.any():
        for j in np.flatnonzero(bad).tolist():
            i, rc = int(done[j]), int(vers[j])
            if rc < 0:
                results[i] = rc
            elif upsert:
                # published nothing: the master no longer knew this put (it changed during
                # the write) and the key is back with another value. 0 would tell the caller
                # its value replaced the old one while every reader keeps the old one.
                results[i] = NOT_FOUND
                log.warning("%s of %r: the master lost the put in progress (restart or failover "
                            "during the write); the value was not published", op, keys[i])
    own = core.segment
    mine = np.zeros(len(done), bool)
    if own is not None and core.segment_name in segments:
        mine = (seg == segments.index(core.segment_name)) & ~bad
    if not mine.all():
        core.owned.discard([keys[i] for i in done[~mine].tolist()])
    if own is None or not mine.any():
        return
    if mine.all():
        _own(core, dk, dst, ln, vers)
    else:
        _own(core, [keys[i] for i in done[mine].tolist()], dst[mine], ln[mine], vers[mine])


def _own(core: StoreCore, keys: list[str], dst: np.ndarray, ln: np.ndarray, vers: np.ndarray) -> None:
    """Owned-index entries of objects just published in our own segment."""
    own = core.segment
    view = own.view if own is not None else None
    if own is not None and view is not None:
        core.owned.add_batch(core.segment_name, keys, dst, ln, fingerprints(view, dst - own.addr, ln), vers)


class BatchReservation:
    """Space the master set aside for our next batch put (``master_batch.put_commits``): one
    range per object of ``size`` (the sizes, in order) at ``addrs`` in ``segment``, for
    placement ``msg``, asked for at ``t`` (monotonic) from the master of ``epoch``. Used
    through a ``single_put.ReservationSlot`` by one batch at a time, under the same rules as
    a single put's reservation (young, same epoch; see ``single_put``)."""

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


def _blob(sizes: list[int]) -> bytes:
    return np.fromiter(sizes, np.uint64, len(sizes)).tobytes()


def _commit(core: StoreCore, keys: list[str], blob: bytes, msg: ReplicateConfigMsg, reserved: bool, next_blob: bytes,
            t: float, sizes: list[int], keep: list[BatchReservation | None]) -> np.ndarray:
    """batch_put_commit: the versions (as batch_put_end's); the next reservation into
    ``keep[0]``. Raises MooncakeError (INTERNAL for a reply that does not add up)."""
    got = core.master.batch_put_commit(core.client_id, keys, blob, msg, reserved=reserved, next_sizes=next_blob)
    addrs = np.frombuffer(got.addrs, np.uint64).astype(np.int64)
    if got.segment and len(addrs) == len(sizes):
        # a copy: a caller reusing its list of sizes must not change what the ranges were made for
        keep[0] = BatchReservation(got.segment, addrs, list(sizes), next_blob, msg, t, got.epoch)
    return np.frombuffer(got.versions, np.int64)


def _put_reserved(core: StoreCore, keys: list[str], src_addrs: list[int] | None, sizes: list[int],
                  values: list[Any] | None, msg: ReplicateConfigMsg, r: BatchReservation, op: str, t0: float,
                  keep: list[BatchReservation | None]) -> list[int] | None:
    """Write the batch into reservation ``r`` and publish it with one batch_put_commit (asking
    for the next reservation): one code per key, or None when ``r`` cannot be used -- a
    write failed, or the master does not know ``r`` any more (-704) or finds it does not fit
    (-600) -- and the batch_put_start path should put the batch instead."""
    assert src_addrs is not None
    n = len(keys)
    ln = np.fromiter(sizes, np.int64, n)
    pos = np.arange(n)
    if _write_group(core, r.segment, None, pos, np.fromiter(src_addrs, np.int64, n), r.addrs, ln, values, set(),
                    op, keys) is not None:
        return None
    try:
        vers = _commit(core, keys, r.blob, msg, True, r.blob, time.monotonic(), sizes, keep)
    except MooncakeError as e:
        if e.code in (NOT_FOUND, INVALID):
            log.debug("%s: batch reservation refused (%s); taking the put_start path", op, e)
            return None
        log.warning("%s", e)
        return [e.code] * n
    if len(vers) != n:
        log.warning("%s: batch_put_commit answered %d codes for %d keys", op, len(vers), n)
        return [INTERNAL] * n
    results = [OK] * n
    pub = vers > 0
    if not pub.all():
        for i in np.flatnonzero(~pub).tolist():
            c = int(vers[i])
            if c < 0 and c != EXISTS:  # an existing key keeps its old value: success, as for put_start
                results[i] = c
    if r.segment == core.segment_name:
        if pub.all():
            _own(core, keys, r.addrs, ln, vers)
        elif pub.any():
            _own(core, [keys[i] for i in np.flatnonzero(pub).tolist()], r.addrs[pub], ln[pub], vers[pub])
    else:
        core.owned.discard([keys[i] for i in np.flatnonzero(pub).tolist()])
    core.count(op, min(results), int(ln[pub].sum()), t0)
    return results



def get_arrays(reply: BatchGetReply, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                     np.ndarray] | None:
    """(codes, sizes, segment index, address, found) of a packed batch get of ``n`` keys with
    at most one memory replica per key and no disk replica (the replica arrays list the found
    keys in order), or None: another shape, or a reply that does not add up -- the per-key
    path then decodes (and checks) it."""
    codes = np.frombuffer(reply.codes, np.int32)
    sizes = np.frombuffer(reply.sizes, np.uint64)
    counts = np.frombuffer(reply.counts, np.uint8)
    seg = np.frombuffer(reply.seg, np.uint32)
    src = np.frombuffer(reply.addrs, np.uint64)
    found = codes == 0
    if (reply.disk or len(codes) != n or len(sizes) != n or not np.array_equal(counts, found)
            or len(seg) != len(src) or len(src) != int(np.count_nonzero(found))
            or (len(seg) and int(seg.max()) >= len(reply.segments))):
        return None
    return codes, sizes, seg, src, found


def read_flat(core: StoreCore, keys: list[str], dests: list[Any], op: str) -> list[int] | None:
    """``StoreCore.read_batch`` of a batch whose destinations are all fresh bytes objects
    (None) or all buffers -- one each, or several filled in order (``*_multi_buffers``):
    one lease grant, one vectored read per segment. None when the destinations are of
    another shape (the per-key path then runs from the start)."""
    n = len(keys)
    fresh = dests[0] is None
    if fresh:
        if any(d is not None for d in dests):
            return None
    elif any(d is None for d in dests):
        return None
    t0 = time.perf_counter()
    t_req = time.monotonic()
    try:
        reply = core.master.batch_get_packed(keys)
    except MooncakeError as e:
        return [e.code] * n
    got = get_arrays(reply, n)
    if got is None or (len(got[3]) and int(got[1].max()) >= PREFAULT_MIN):
        # disk or several replicas, big objects: the per-key path, with the replies in hand
        return core._read_batch_locked(keys, dests, op, fetched=(t_req, expand_gets(reply, n)))
    codes, sizes, seg, src, found = got
    results = codes.tolist()
    pos = np.flatnonzero(found) if len(src) < n else np.arange(n)
    ln = sizes.astype(np.int64)[pos]
    src = src.astype(np.int64)
    multi: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
    if fresh:
        offs = np.concatenate(([0], np.cumsum(ln)[:-1])) if len(ln) else ln
        stage = bytearray(max(int(ln.sum()), 1))
        base = np.frombuffer(stage, np.uint8).ctypes.data
        dst = offs + base
    else:
        if all(len(d) == 1 for d in dests):
            caps = np.fromiter((d[0][1] for d in dests), np.int64, n)[pos]
            dst = np.fromiter((d[0][0] for d in dests), np.int64, n)[pos]
        else:
            pc, pa, pcap = _parts_arrays(dests)
            pkey, poff = part_offsets(pc, pcap)
            caps = np.bincount(pkey, pcap, n).astype(np.int64)[pos] if len(pcap) else np.zeros(len(pos), np.int64)
            dst = np.zeros(len(pos), np.int64)  # unused: the pieces carry the addresses
            multi = (pkey, poff, pa, pcap)
        small = caps < ln
        if small.any():
            for j in np.flatnonzero(small).tolist():
                i = int(pos[j])
                results[i] = INVALID
                log.warning("%s(%r): buffer of %d bytes is smaller than the object (%d bytes)",
                            op, keys[i], int(caps[j]), int(ln[j]))
            keep = ~small
            pos, ln, dst, src, seg = pos[keep], ln[keep], dst[keep], src[keep], seg[keep]
    if multi is None:
        owner, pdst, psrc, plen = np.arange(len(pos)), dst, src, ln
    else:
        # the object's bytes fill its buffers in order: piece k takes what is left of the
        # object past the capacities of the pieces before it, at most its own capacity
        pkey, poff, pa, pcap = multi
        jof = np.full(n, -1, np.int64)
        jof[pos] = np.arange(len(pos))
        pj = jof[pkey] if len(pkey) else pkey
        take = np.clip(ln[np.maximum(pj, 0)] - poff, 0, pcap) if len(pj) and len(pos) else np.zeros_like(pj)
        keep = (pj >= 0) & (take > 0)
        owner = pj[keep]
        pdst, psrc, plen = pa[keep], src[owner] + poff[keep], take[keep]
    ok = np.ones(len(pos), bool)
    groups = [0] if len(reply.segments) == 1 else np.unique(seg).tolist()
    own = core.segment
    for g in groups:
        objs = np.arange(len(pos)) if len(groups) == 1 else np.flatnonzero(seg == g)
        psel = np.flatnonzero(seg[owner] == g) if len(groups) > 1 else None
        name = reply.segments[g]
        d, s_, m = (pdst, psrc, plen) if psel is None else (pdst[psel], psrc[psel], plen[psel])
        if own is not None and name == core.segment_name:
            off = src[objs] - own.addr
            if len(off) and (int(off.min()) < 0 or int((off + ln[objs]).max()) > own.size):
                ok[objs] = False
                continue
            for a, b, c in zip(d.tolist(), s_.tolist(), m.tolist()):
                if c:
                    memmove(a, b, c)
            continue
        nz = m > 0
        if not nz.all():
            d, s_, m = d[nz], s_[nz], m[nz]
        if not len(m):
            continue
        t_read = time.monotonic()
        rc = core.engine.batch_transfer_sync_read(name, d.tolist(), s_.tolist(), m.tolist())
        if rc is not None and rc >= 0:
            continue
        from mooncake_core.store.core import _unresponsive

        if _unresponsive(core.engine, t_read):
            # a segment that did not answer for half a timeout is not asked again key by key
            # (one more timeout per key); every key has this one replica here
            ok[objs] = False
            continue
        for j in objs.tolist():  # isolate the failing keys
            c = int(ln[j])
            parts = [(int(dst[j]), c)] if multi is None else dests[int(pos[j])]
            try:
                core.read_replica(ReplicaDesc(name, int(src[j]), c), parts, c)
            except MooncakeError:
                ok[j] = False
    for i, m, good in zip(pos.tolist(), ln.tolist(), ok.tolist()):
        results[i] = m if good else TRANSFER_FAIL
    now = time.monotonic()
    if now >= t_req + reply.lease_ttl_ms / 1000.0:
        late = [int(i) for i in pos[ok].tolist()]
        if late:
            log.warning("%s: lease expired during the read of %d key(s) (first %r); results discarded",
                        op, len(late), keys[late[0]])
        for i in late:
            results[i] = LEASE_EXPIRED
    elif 0 < reply.confirm_after_ms < (now - t_req) * 1000.0:
        replies = expand_gets(reply, n)
        stale = core._confirm_epochs(replies, results, keys, (now - t_req) * 1000.0, op)
        if stale:  # a different master leads now: read those again under fresh leases, once
            sub = [None if fresh else dests[i] for i in stale]
            again = core._read_batch_locked([keys[i] for i in stale], sub, op, retry=False)
            for j, i in enumerate(stale):
                results[i] = again[j]
                if fresh and again[j] >= 0:
                    dests[i] = sub[j]
    if fresh:
        view = memoryview(stage)
        for i, o, m in zip(pos.tolist(), offs.tolist(), ln.tolist()):
            if results[i] >= 0 and dests[i] is None:
                dests[i] = (bytes(view[o:o + m]), m)
    core.count(op, min(results) if results else OK, sum(r for r in results if r > 0), t0)
    return results
