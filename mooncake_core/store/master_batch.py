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
from typing import TYPE_CHECKING

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store.master_records import ObjectMeta, PendingPut, Segment, check_key, err
from mooncake_core.store.packing import I32, I64, U8, U32, U64, Packer, pack
from mooncake_core.store.protocol import BatchGetReply, Placements, ReplicaDesc, ReplicateConfigMsg

if TYPE_CHECKING:
    from mooncake_core.store.master_state import MasterState

__all__ = ["get_replica_lists", "put_ends", "put_revokes", "put_starts"]


def put_starts(st: MasterState, client_id: str, keys: list[str], sizes: list[int],
               cfg: ReplicateConfigMsg | None = None, upsert: bool = False) -> Placements:
    """put_start of every key: per key its replicas, or its error code."""
    if len(keys) != len(sizes):
        raise err(ErrorCode.INVALID_PARAMS, f"batch_put_start: {len(keys)} keys but {len(sizes)} sizes")
    cfg = cfg or ReplicateConfigMsg()
    pk = Packer()
    codes, counts, seg_ix, addrs = pk.codes, pk.counts, pk.seg, pk.addrs
    try:
        st._check_cfg(cfg, keys[0] if keys else "")
    except MooncakeError as e:
        codes.extend([e.code] * len(keys))
        counts.extend(bytes(len(keys)))
        return Placements(*pk.blobs())
    soft_ttl = st._soft_ttl(cfg)
    now = st.clock()
    direct = st._direct_target(cfg, now)
    if direct is not None:
        return _put_starts_direct(st, client_id, keys, sizes, cfg, soft_ttl, now, upsert, direct, pk)
    one = st._put_start_one
    last: Segment | None = None
    last_ix = 0
    for k, size in zip(keys, sizes):
        try:
            if k.__class__ is not str or not k:
                check_key(k)
            reps = one(client_id, k, size, cfg, soft_ttl, now, upsert, direct)
        except MooncakeError as e:
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
    return Placements(*pk.blobs())


def _put_starts_direct(st: MasterState, client_id: str, keys: list[str], sizes: list[int], cfg: ReplicateConfigMsg,
                       soft_ttl: float | None, now: float, upsert: bool, direct: Segment, pk: Packer) -> Placements:
    """``put_starts`` when one segment takes every replica (``MasterState._direct_target``):
    a fresh key is placed inline (the checks of ``_put_start_one`` in the same order, for
    a key that is neither stored nor in flight), anything else by ``_put_start_one``. Every
    replica is on ``direct``, so the segment indices are one value repeated."""
    n = len(keys)
    codes = array(I32, bytes(4 * n))
    counts = array(U8, b"\x01" * n)
    addrs = pk.addrs
    objects_get, inflight, interned = st.objects.get, st.inflight, st._sizes.get
    alloc, cap, base = direct.alloc.allocate, direct.size, direct.base
    hard = bool(cfg.with_hard_pin)
    one = st._put_start_one
    for i, (k, size) in enumerate(zip(keys, sizes)):
        if (k.__class__ is str and k and size.__class__ is int and 0 < size <= cap and objects_get(k) is None
                and k not in inflight):
            off = alloc(size)
            if off is not None:
                inflight[k] = PendingPut(client_id, interned(size) or st._intern_size(size), [(direct, off)], now,
                                         upsert, False, hard, soft_ttl)
                addrs.append(base + off)
                continue
        try:
            if k.__class__ is not str or not k:
                check_key(k)
            reps = one(client_id, k, size, cfg, soft_ttl, now, upsert, direct)
        except MooncakeError as e:
            codes[i] = e.code
            counts[i] = 0
            continue
        counts[i] = len(reps)
        for _, off in reps:
            addrs.append(base + off)
    pk.codes, pk.counts = codes, counts
    if len(addrs):
        pk.seg = array(U32, [pk.segment(direct.name)]) * len(addrs)
    return Placements(*pk.blobs())


def put_ends(st: MasterState, client_id: str, keys: list[str]) -> bytes:
    """put_end of every key: ``i64`` per key, the version (> 0), 0 or a code. A plain put of
    a fresh key (no pin, nothing stored under it) is published inline -- what
    ``_put_end_one`` does for it -- with versions counted up from one clock reading per
    batch; anything else goes through ``_put_end_one``."""
    now = st.clock()
    one = st._put_end_one
    out = array(I64)
    inflight, objects = st.inflight, st.objects
    publish = st.key_events.publish
    st._last_version = max(st.version_clock(), st._last_version + 1) - 1
    puts = 0
    for k in keys:
        p = inflight.get(k) if k.__class__ is str else None
        if (p is not None and p.client_id == client_id and not p.hard and p.soft_ttl is None
                and k not in objects):
            del inflight[k]
            objects[k] = ObjectMeta(p.size, p.reps)
            if st.reported:
                st.reported.pop(k, None)
            puts += 1
            publish("put", k)
            st._last_version += 1
            out.append(st._last_version)
            continue
        try:
            if k.__class__ is not str or not k:
                check_key(k)
            out.append(one(client_id, k, now))
        except MooncakeError as e:
            out.append(e.code)
    st.stats.puts += puts
    return pack(I64, out)


def put_revokes(st: MasterState, client_id: str, keys: list[str]) -> bytes:
    """put_revoke of every key: ``i64`` per key, 0 or a code."""
    out = array(I64)
    for k in keys:
        try:
            st.put_revoke(client_id, k)
            out.append(0)
        except MooncakeError as e:
            out.append(e.code)
    return pack(I64, out)


def get_replica_lists(st: MasterState, keys: list[str]) -> BatchGetReply:
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
    return BatchGetReply(c, pack(U64, sizes), n, segments, sx, ad, disk, ttl_ms, st.epoch, st._confirm_after_ms)

