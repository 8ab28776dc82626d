"""The master's memory-pressure rules: eviction and the SSD tier (pure, like MasterState).

Why a module of its own: which objects leave memory, and whether they go to disk first, is
one job with its own invariants (leased, in-flight and hard-pinned objects stay; soft-pinned
ones go last; the disk tier never exceeds its quota, even for a moment); ``MasterState``
delegates here and keeps the records. Not thread-safe, like MasterState.
"""

from __future__ import annotations

from typing import Callable, Iterable, Protocol

from mooncake_core.errors import ErrorCode
from mooncake_core.store.key_events import KeyEventLog
from mooncake_core.store.master_records import (ClientInfo, DiskReplica, MasterConfig, ObjectMeta, Rep, Stats, err,
                                                 safe_rel_path)
from mooncake_core.store.protocol import OffloadTask, ReplicaDesc


class TierState(Protocol):
    """What eviction and the SSD tier use of ``master_state.MasterState`` (the object table,
    the tier's records, freeing ranges), declared here so that this module does not import the
    one that delegates to it."""

    cfg: MasterConfig
    clock: Callable[[], float]
    objects: dict[str, ObjectMeta]
    clients: dict[str, ClientInfo]
    offloading: dict[str, float]
    disk_lru: dict[str, None]
    disk_used: int
    pending_file_deletes: list[tuple[float, str]]
    stats: Stats
    key_events: KeyEventLog

    @property
    def capacity(self) -> int: ...
    @staticmethod
    def desc(rep: Rep, size: int, status: str = "complete") -> ReplicaDesc: ...
    def free_range(self, rep: Rep, size: int) -> None: ...
    def release_ranges(self, reps: Iterable[Rep], size: int, not_before: float, now: float) -> None: ...
    def drop_disk(self, key: str, meta: ObjectMeta, not_before: float) -> None: ...

__all__ = ["enforce_disk_quota", "evict", "offload_done", "offload_failed", "offloading_bytes"]


def evictable(st: TierState, meta: ObjectMeta, key: str, now: float) -> bool:
    return (meta.seg is not None and meta.lease <= now and not meta.hard
            and key not in st.offloading)


def evict(st: TierState, need: int, now: float) -> int:
    """Evict LRU objects until ``max(need, eviction_ratio * capacity)`` bytes are freed
    (or queued for offload). Returns the bytes freed immediately."""
    target = max(need, int(st.cfg.eviction_ratio * st.capacity))
    progress = 0
    victims: list[tuple[str, ObjectMeta]] = []
    soft: list[tuple[str, ObjectMeta]] = []
    for key, meta in st.objects.items():  # oldest first: dict order is the LRU order
        if progress >= target:
            break
        if not evictable(st, meta, key, now):
            continue
        sp = meta.soft
        if sp is not None and sp[0] > now:
            soft.append((key, meta))
            continue
        victims.append((key, meta))
        progress += meta.size * meta.n_reps
    if progress < target and st.cfg.allow_evict_soft_pinned_objects:
        for key, meta in soft:  # soft-pinned objects go last
            if progress >= target:
                break
            victims.append((key, meta))
            progress += meta.size * meta.n_reps
    freed = 0
    for key, meta in victims:
        freed += evict_one(st, key, meta, now)[0]
    return freed


def offloading_bytes(st: TierState) -> int:
    n = 0
    for key in st.offloading:
        meta = st.objects.get(key)
        if meta is not None:
            n += meta.size * meta.n_reps
    return n


def evict_one(st: TierState, key: str, meta: ObjectMeta, now: float) -> tuple[int, int]:
    """Evict one object's memory replicas. Returns (bytes freed, bytes queued for offload)."""
    reps = meta.reps()
    nbytes = meta.size * len(reps)
    if st.cfg.enable_offload and meta.disk is None:
        owner = st.clients.get(reps[0][0].client_id)
        if owner is not None and disk_room(st, meta.size, now):
            owner.tasks.append(OffloadTask(key, st.desc(reps[0], meta.size)))
            st.offloading[key] = now
            return 0, nbytes
    drop_memory(st, key, meta)
    return nbytes, 0


def drop_memory(st: TierState, key: str, meta: ObjectMeta) -> None:
    """Free an object's memory replicas now; it stays only if it has a disk copy."""
    for r in meta.reps():
        st.free_range(r, meta.size)
    meta.set_reps([])
    if meta.disk is None:
        del st.objects[key]
        st.key_events.publish("evict", key)
    st.stats.evictions += 1


def offload_done(st: TierState, client_id: str, key: str, path: str, size: int) -> None:
    if not safe_rel_path(path):
        raise err(ErrorCode.INVALID_PARAMS, f"offload_done {key!r}: path {path!r} must be relative "
                   f"to root_fs_dir without '..'")
    now = st.clock()
    st.offloading.pop(key, None)
    meta = st.objects.get(key)
    if meta is None or meta.size != size:
        st.pending_file_deletes.append((0, path))  # object gone meanwhile: drop the file
        raise err(ErrorCode.OBJECT_NOT_FOUND, f"offload_done {key!r}: object no longer exists "
                   f"(or size differs); the file will be deleted")
    reps = meta.reps()
    if meta.disk is None:
        seg_name = reps[0][0].name if reps else ""
        meta.set_disk(DiskReplica(seg_name, client_id, path, size))
        st.disk_used += size
        st.disk_lru[key] = None
    elif meta.disk.path != path:
        st.pending_file_deletes.append((0, path))
    lease = meta.lease if meta.lease > now else 0
    st.release_ranges(reps, meta.size, lease, now)
    meta.set_reps([])
    st.stats.offloads += 1
    enforce_disk_quota(st, now)


def offload_failed(st: TierState, client_id: str, key: str) -> None:
    """The owner could not write the file: evict the memory copy without a disk copy."""
    now = st.clock()
    st.offloading.pop(key, None)
    meta = st.objects.get(key)
    if meta is None or meta.seg is None or meta.lease > now or meta.hard:
        return
    drop_memory(st, key, meta)


def offload_reserved(st: TierState) -> int:
    """Disk bytes promised to offloads in flight (their files are being written now)."""
    n = 0
    for key in st.offloading:
        meta = st.objects.get(key)
        if meta is not None:
            n += meta.size
    return n


def disk_room(st: TierState, size: int, now: float) -> bool:
    """Make room for a ``size``-byte file *before* the owner writes it (least recently used
    files are dropped first), so the tier never exceeds --quota_bytes even for a moment.
    The original filled the disk because it never evicted (its issue #2475). False when the
    file cannot fit: the object is then evicted without a disk copy."""
    quota = st.cfg.disk_quota_bytes
    if quota <= 0:
        return True
    if size > quota:
        return False
    enforce_disk_quota(st, now, incoming=size + offload_reserved(st))
    return st.disk_used + offload_reserved(st) + size <= quota


def enforce_disk_quota(st: TierState, now: float, incoming: int = 0) -> None:
    quota = st.cfg.disk_quota_bytes
    if quota <= 0 or st.disk_used + incoming <= quota:
        return
    for key in list(st.disk_lru):
        if st.disk_used + incoming <= quota:
            break
        meta = st.objects.get(key)
        if meta is None or meta.disk is None:
            st.disk_lru.pop(key, None)
            continue
        if meta.lease > now or meta.hard:
            continue
        st.drop_disk(key, meta, 0)
        if meta.seg is None:
            del st.objects[key]
            st.key_events.publish("evict", key)
        st.stats.disk_evictions += 1
