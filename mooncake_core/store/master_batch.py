"""The master's batch operations, answered packed (see ``packing``): pure, like MasterState.

Why a module of its own: a batch is where per-key cost multiplies, so these loops are kept
free of per-key objects -- every key costs a few dict operations and array appends, the
config is checked and the clock read once per batch, and the reply is a handful of byte
strings instead of one Struct per key. Per-key semantics are exactly those of the single
calls (``put_start``, ``put_end``, ``put_revoke``, ``get_replica_list``): each key gets its
own code, a failure of one never fails the others. ``MasterState`` delegates here.
"""

from __future__ import annotations

from array import array
from typing import Callable, Iterable, Protocol

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store.master_records import (BATCH_RESERVATION_SUFFIX, RESERVATION_PREFIX, MasterConfig,
                                                 ObjectMeta, PendingPut, Rep, Segment, Stats, check_key, err)
from mooncake_core.store.master_space import SpaceReclaiming
from mooncake_core.store.packing import I32, I64, U8, U32, U64, Packer, pack
from mooncake_core.store.protocol import BatchGetReply, BatchPutCommitReply, Placements, ReplicaDesc, ReplicateConfigMsg



class BatchState(Protocol):
    """What the batch operations use of ``master_state.MasterState`` (its public primitives:
    the per-key rules of the single calls, placement, publishing), declared here so that this
    module does not import the one that delegates to it."""

    cfg: MasterConfig
    clock: Callable[[], float]
    epoch: int
    confirm_after_ms: int
    objects: dict[str, ObjectMeta]
    inflight: dict[str, PendingPut]
    segments: dict[str, Segment]
    stats: Stats

    @staticmethod
    def check_cfg(cfg: ReplicateConfigMsg, what: str) -> None: ...
    def soft_ttl(self, cfg: ReplicateConfigMsg) -> float | None: ...
    def direct_target(self, cfg: ReplicateConfigMsg, now: float) -> Segment | None: ...
    def placeable(self, now: float) -> dict[str, Segment]: ...
    def without_avoided(self, segs: dict[str, Segment], cfg: ReplicateConfigMsg) -> dict[str, Segment]: ...
    def place(self, size: int, want: int, preferred: list[str], segs: dict[str, Segment]) -> list[Rep] | None: ...
    def is_mounted(self, seg: Segment) -> bool: ...
    def intern_size(self, size: int) -> int: ...
    def claim(self, key: str, size: int, upsert: bool, now: float) -> bool: ...
    def put_start_one(self, client_id: str, key: str, size: int, cfg: ReplicateConfigMsg, soft_ttl: float | None,
                      now: float, upsert: bool, direct: Segment | None = None) -> list[Rep]: ...
    def put_end_one(self, client_id: str, key: str, now: float) -> int: ...
    def put_revoke(self, client_id: str, key: str) -> None: ...
    def publish(self, key: str, meta: ObjectMeta, run: list[str] | None = None, group: str = "") -> int: ...
    def begin_run(self) -> list[str]: ...
    def end_run(self, run: list[str]) -> None: ...
    def free_range(self, rep: Rep, size: int) -> None: ...
    def quarantine_ranges(self, writer: str, reps: Iterable[Rep], size: int) -> None: ...
    def grant(self, key: str, meta: ObjectMeta, now: float, deadline: float) -> None: ...

__all__ = ["BatchReservation", "get_replica_lists", "put_commits", "put_ends", "put_revokes", "put_starts"]

#: a batch reservation holds at most this many bytes, and at most a quarter of its segment's
#: free bytes: it is memory nobody else can use until the client's next batch
MAX_BATCH_RESERVATION = 64 << 20
#: and at most this many objects
MAX_BATCH_RESERVATION_KEYS = 65536


def put_starts(st: BatchState, client_id: str, keys: list[str], sizes: list[int],
               cfg: ReplicateConfigMsg | None = None, upsert: bool = False) -> Placements:
    """put_start of every key: per key its replicas, or its error code."""
    if len(keys) != len(sizes):
        raise err(ErrorCode.INVALID_PARAMS, f"batch_put_start: {len(keys)} keys but {len(sizes)} sizes")
    cfg = cfg or ReplicateConfigMsg()
    pk = Packer()
    codes, counts, seg_ix, addrs = pk.codes, pk.counts, pk.seg, pk.addrs
    try:
        st.check_cfg(cfg, keys[0] if keys else "")
    except MooncakeError as e:
        codes.extend([e.code] * len(keys))
        counts.extend(bytes(len(keys)))
        return Placements(*pk.blobs())
    soft_ttl = st.soft_ttl(cfg)
    now = st.clock()
    direct = st.direct_target(cfg, now)
    if direct is not None:
        return _put_starts_direct(st, client_id, keys, sizes, cfg, soft_ttl, now, upsert, direct, pk)
    one = st.put_start_one
    last: Segment | None = None
    last_ix = 0
    wait = 0.0
    for k, size in zip(keys, sizes):
        try:
            if k.__class__ is not str or not k:
                check_key(k)
            reps = one(client_id, k, size, cfg, soft_ttl, now, upsert, direct)
        except MooncakeError as e:
            if isinstance(e, SpaceReclaiming):
                wait = max(wait, e.wait_s)
            codes.append(e.code)
            counts.append(0)
            continue
        codes.append(0)
        counts.append(len(reps))
        for seg, off in reps:
            if seg is not last:
                last, last_ix = seg, pk.segment(seg.name)
            seg_ix.append(last_ix)
            addrs.append(seg.base + off)
    return Placements(*pk.blobs(), retry_after_ms=_ms(wait))


def _ms(wait_s: float) -> int:
    return int(wait_s * 1000) + 1 if wait_s > 0 else 0


def _put_starts_direct(st: BatchState, client_id: str, keys: list[str], sizes: list[int], cfg: ReplicateConfigMsg,
                       soft_ttl: float | None, now: float, upsert: bool, direct: Segment, pk: Packer) -> Placements:
    """``put_starts`` when one segment takes every replica (``MasterState.direct_target``):
    a fresh key is placed inline (the checks of ``put_start_one`` in the same order, for
    a key that is neither stored nor in flight), anything else by ``put_start_one``. Every
    replica is on ``direct``, so the segment indices are one value repeated."""
    n = len(keys)
    codes = array(I32, bytes(4 * n))
    counts = array(U8, b"\x01" * n)
    addrs = pk.addrs
    objects_get, inflight, interned = st.objects.get, st.inflight, st.intern_size
    alloc, cap, base = direct.alloc.allocate, direct.size, direct.base
    hard = bool(cfg.with_hard_pin)
    one = st.put_start_one
    wait = 0.0
    for i, (k, size) in enumerate(zip(keys, sizes)):
        if (k.__class__ is str and k and size.__class__ is int and 0 < size <= cap and objects_get(k) is None
                and k not in inflight):
            off = alloc(size)
            if off is not None:
                inflight[k] = PendingPut(client_id, interned(size), [(direct, off)], now,
                                         upsert, False, hard, soft_ttl)
                addrs.append(base + off)
                continue
        try:
            if k.__class__ is not str or not k:
                check_key(k)
            reps = one(client_id, k, size, cfg, soft_ttl, now, upsert, direct)
        except MooncakeError as e:
            if isinstance(e, SpaceReclaiming):
                wait = max(wait, e.wait_s)
            codes[i] = e.code
            counts[i] = 0
            continue
        counts[i] = len(reps)
        for _, off in reps:
            addrs.append(base + off)
    pk.codes, pk.counts = codes, counts
    if len(addrs):
        pk.seg = array(U32, [pk.segment(direct.name)]) * len(addrs)
    return Placements(*pk.blobs(), retry_after_ms=_ms(wait))


def put_ends(st: BatchState, client_id: str, keys: list[str]) -> bytes:
    """put_end of every key: ``i64`` per key, the version (> 0), 0 or a code. A plain put of
    a fresh key (no pin, nothing stored under it) is published inline -- what
    ``put_end_one`` does for it -- with versions counted up from one clock reading per
    batch; anything else goes through ``put_end_one``."""
    now = st.clock()
    one, publish = st.put_end_one, st.publish
    out = array(I64)
    inflight, objects = st.inflight, st.objects
    run = st.begin_run()
    for k in keys:
        p = inflight.get(k) if k.__class__ is str else None
        if (p is not None and p.client_id == client_id and not p.hard and p.soft_ttl is None
                and k not in objects):
            del inflight[k]
            out.append(publish(k, ObjectMeta(p.size, p.reps), run, p.group))
            continue
        try:
            if k.__class__ is not str or not k:
                check_key(k)
            out.append(one(client_id, k, now))
        except MooncakeError as e:
            out.append(e.code)
    st.end_run(run)
    return pack(I64, out)


def put_revokes(st: BatchState, client_id: str, keys: list[str]) -> bytes:
    """put_revoke of every key: ``i64`` per key, 0 or a code."""
    out = array(I64)
    for k in keys:
        try:
            st.put_revoke(client_id, k)
            out.append(0)
        except MooncakeError as e:
            out.append(e.code)
    return pack(I64, out)


def get_replica_lists(st: BatchState, keys: list[str]) -> BatchGetReply:
    """get_replica_list of every key under one lease deadline (leases are still per object:
    each found object is leased, and becomes the most recently used, as with single gets)."""
    now = st.clock()
    ttl_ms = st.cfg.default_kv_lease_ttl_ms
    deadline = now + ttl_ms / 1000.0
    objects, grant, stats = st.objects, st.grant, st.stats
    pk = Packer()
    codes, counts, seg_ix, addrs = pk.codes, pk.counts, pk.seg, pk.addrs
    sizes = array(U64)
    disk: list[tuple[int, ReplicaDesc]] = []
    last: Segment | None = None
    last_ix = 0
    for i, key in enumerate(keys):
        if key.__class__ is not str or not key:
            codes.append(ErrorCode.INVALID_PARAMS)
            sizes.append(0)
            counts.append(0)
            continue
        meta = objects.get(key)
        if meta is None:
            stats.misses += 1
            codes.append(ErrorCode.OBJECT_NOT_FOUND)
            sizes.append(0)
            counts.append(0)
            continue
        grant(key, meta, now, deadline)
        codes.append(0)
        sizes.append(meta.size)
        seg = meta.seg
        if seg is None:
            counts.append(0)
        elif seg.__class__ is tuple:
            reps = meta.reps()
            counts.append(len(reps))
            for s, off in reps:
                seg_ix.append(pk.segment(s.name))
                addrs.append(s.base + off)
        else:
            assert isinstance(seg, Segment) and isinstance(meta.off, int)
            if seg is not last:
                last, last_ix = seg, pk.segment(seg.name)
            counts.append(1)
            seg_ix.append(last_ix)
            addrs.append(seg.base + meta.off)
        d = meta.disk
        if d is not None:
            disk.append((i, ReplicaDesc(d.segment_name, 0, d.size, "disk", d.path, "complete")))
    c, n, segments, sx, ad = pk.blobs()
    return BatchGetReply(c, pack(U64, sizes), n, segments, sx, ad, disk, ttl_ms, st.epoch, st.confirm_after_ms)



class BatchReservation(PendingPut):
    """A client's reservation for its next batch: one in-flight range (``reps``, ``size``
    bytes: the objects' rounded sizes end to end) for the objects of ``sizes`` (the packed
    ``u64`` blob the client asked with), in order. As an in-flight put every rule for those
    (unmount, client expiry, release timeout) covers it as one range."""

    __slots__ = ("sizes",)

    def __init__(self, client_id: str, size: int, reps: list[Rep], start: float, hard: bool,
                 soft_ttl: float | None, sizes: bytes):
        super().__init__(client_id, size, reps, start, False, False, hard, soft_ttl)
        self.sizes = sizes


def batch_reservation_key(client_id: str) -> str:
    return RESERVATION_PREFIX + client_id + BATCH_RESERVATION_SUFFIX


def put_commits(st: BatchState, client_id: str, keys: list[str], sizes: bytes, cfg: ReplicateConfigMsg | None,
                reserved: bool, next_sizes: bytes) -> BatchPutCommitReply:
    """``put_ends`` of ``keys`` and a reservation for the client's next batch (of
    ``next_sizes``), in one round trip -- the batch form of ``MasterState.put_commit``.

    Why: a batch put is otherwise two round trips (put_start, put_end), and with batches of
    ~100 small objects each round trip's wake-ups and the per-key in-flight records are a
    large share of the batch. With ``reserved`` the client wrote object i into the i-th
    range of the reservation it held (no put_start); each key is published from there: a
    fresh key (nothing stored, nothing in flight) inline, anything else through the
    single-put rules (``claim``, then ``put_end_one``: -705 when it exists or is in
    flight, takeover of an abandoned put) -- a key that is not published has its range
    freed. Codes of the whole call: -704 when the client holds no batch reservation, -600
    when it was for other sizes (the reservation stays) or ``sizes`` is malformed."""
    cfg = cfg or ReplicateConfigMsg()
    st.check_cfg(cfg, keys[0] if keys else "")
    now = st.clock()
    rk = batch_reservation_key(client_id)
    if reserved:
        p = st.inflight.get(rk)
        if not isinstance(p, BatchReservation) or p.client_id != client_id or not st.is_mounted(p.reps[0][0]):
            raise err(ErrorCode.OBJECT_NOT_FOUND, f"batch_put_commit of {len(keys)} keys: client {client_id!r} holds "
                       f"no batch reservation (released, or the master changed)")
        if p.sizes != sizes or len(sizes) != 8 * len(keys) or p.hard != bool(cfg.with_hard_pin) \
                or p.soft_ttl != st.soft_ttl(cfg):
            raise err(ErrorCode.INVALID_PARAMS, f"batch_put_commit of {len(keys)} keys: the batch reservation "
                       f"does not fit them (other sizes, or other pinning)")
        del st.inflight[rk]
        versions = _commit_reserved(st, client_id, keys, p, now)
    else:
        versions = put_ends(st, client_id, keys)
    seg, addrs = _reserve(st, client_id, next_sizes, cfg, now)
    return BatchPutCommitReply(versions, seg, addrs, st.epoch)


def _commit_reserved(st: BatchState, client_id: str, keys: list[str], p: BatchReservation, now: float) -> bytes:
    seg, off = p.reps[0]
    sizes = [st.intern_size(n) for n in array(U64, p.sizes).tolist()]
    offs = seg.alloc.split(off, sizes)
    out = array(I64)
    inflight, objects, publish = st.inflight, st.objects, st.publish
    run = st.begin_run()
    plain = not p.hard and p.soft_ttl is None
    new = ObjectMeta.__new__
    for k, size, o in zip(keys, sizes, offs):
        if plain and k.__class__ is str and k and k not in objects and k not in inflight:
            m = new(ObjectMeta)  # ObjectMeta(size, [(seg, o)]), without the calls
            m.size, m.lease, m.extra, m.seg, m.off = size, 0, None, seg, o
            out.append(publish(k, m, run))
            continue
        try:
            check_key(k)
            promote = st.claim(k, size, False, now)
            inflight[k] = PendingPut(client_id, size, [(seg, o)], now, False, promote, p.hard, p.soft_ttl)
            out.append(st.put_end_one(client_id, k, now))
        except MooncakeError as e:
            st.free_range((seg, o), size)  # written by the client, read by nobody: free at once
            out.append(e.code)
    st.end_run(run)
    return pack(I64, out)


def _reserve(st: BatchState, client_id: str, next_sizes: bytes, cfg: ReplicateConfigMsg,
             now: float) -> tuple[str, bytes]:
    """Replace the client's batch reservation by one for objects of ``next_sizes``: (its
    segment, the objects' addresses packed), or ("", b"") when none is made -- no sizes,
    malformed ones, more than one replica to place, too big, or no room without evicting."""
    rk = batch_reservation_key(client_id)
    old = st.inflight.pop(rk, None)
    if old is not None:
        st.quarantine_ranges(client_id, old.reps, old.size)
    if not next_sizes or len(next_sizes) % 8 or len(next_sizes) > 8 * MAX_BATCH_RESERVATION_KEYS:
        return "", b""
    sizes = array(U64, next_sizes).tolist()
    seg = st.direct_target(cfg, now)
    if seg is None:
        segs = st.without_avoided(st.placeable(now), cfg)
        if not segs or min(cfg.replica_num, len(segs)) != 1:
            return "", b""
    if min(sizes) <= 0 or not st.segments:
        return "", b""
    # every segment rounds alike (cfg.alignment), so the total is known before placing it
    rounded = next(iter(st.segments.values())).alloc.rounded
    total = rounded(sizes[0]) * len(sizes) if sizes.count(sizes[0]) == len(sizes) else sum(map(rounded, sizes))
    if total > MAX_BATCH_RESERVATION:
        return "", b""
    reps: list[Rep] | None
    if seg is not None:
        off = seg.alloc.allocate(total) if 4 * total <= seg.alloc.free_bytes else None
        reps = None if off is None else [(seg, off)]
    else:
        reps = st.place(total, 1, cfg.preferred_segments, segs)
        if reps and 3 * total > reps[0][0].alloc.free_bytes:
            st.free_range(reps[0], total)
            reps = None
    if not reps:
        return "", b""
    seg, off = reps[0]
    st.inflight[rk] = BatchReservation(client_id, total, reps, now, bool(cfg.with_hard_pin), st.soft_ttl(cfg),
                                       next_sizes)
    base = seg.base + off
    return seg.name, pack(U64, [base + o - off for o in _offsets(off, sizes, rounded)])


def _offsets(off: int, sizes: list[int], rounded: Callable[[int], int]) -> list[int]:
    """Where objects of ``sizes`` start when laid end to end from ``off`` (each taking
    ``rounded(size)``); one ``rounded`` call when they are all alike (a batch usually is)."""
    if sizes.count(sizes[0]) == len(sizes):
        r = rounded(sizes[0])
        return list(range(off, off + r * len(sizes), r))
    out = []
    for n in sizes:
        out.append(off)
        off += rounded(n)
    return out
