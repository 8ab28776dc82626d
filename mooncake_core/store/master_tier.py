"""The master's memory-pressure rules and the SSD tier: eviction, offload, the disk quota
(pure, like MasterState).

Why a part of its own: which objects leave memory, and whether they go to disk first, is one
job with its own records (objects being offloaded, the disk LRU and its bytes, files to
delete) and invariants (leased, in-flight and hard-pinned objects stay; soft-pinned ones go
last; the disk tier never exceeds its quota, even for a moment). ``Tier`` owns those records;
it sees the object table only through ``ObjectTable``. Not thread-safe, like MasterState.
"""

from __future__ import annotations

from typing import Callable, Iterable, Protocol

from mooncake_core.errors import ErrorCode
from mooncake_core.store.key_events import KeyEventLog
from mooncake_core.store.master_groups import ObjectGroups
from mooncake_core.store.master_records import (ClientInfo, DiskReplica, MasterConfig, ObjectMeta, Rep, Stats, err,
                                                 safe_rel_path)
from mooncake_core.store.protocol import OffloadTask, ReplicaDesc

__all__ = ["ObjectTable", "Tier"]


class ObjectTable(Protocol):
    """What the tier uses of ``master_state.MasterState``: the objects (in LRU order), the
    clients (to queue offload tasks), freeing memory ranges, the counters and key events."""

    cfg: MasterConfig
    clock: Callable[[], float]
    objects: dict[str, ObjectMeta]
    clients: dict[str, ClientInfo]
    stats: Stats
    key_events: KeyEventLog
    groups: ObjectGroups

    @property
    def capacity(self) -> int: ...
    @staticmethod
    def desc(rep: Rep, size: int, status: str = "complete") -> ReplicaDesc: ...
    def free_range(self, rep: Rep, size: int) -> None: ...
    def release_ranges(self, reps: Iterable[Rep], size: int, not_before: float, now: float) -> None: ...


class Tier:
    """Eviction and the SSD tier of one master."""

    def __init__(self, table: ObjectTable):
        self.table = table
        self.cfg = table.cfg
        #: key -> when its offload task was queued (its memory is freed on offload_done)
        self.offloading: dict[str, float] = {}
        #: keys with a disk copy, least recently used first
        self.disk_lru: dict[str, None] = {}
        self.disk_used = 0
        self.pending_file_deletes: list[tuple[float, str]] = []  # (not_before, path under root_fs_dir)

    # ---------------------------------------------------------------- the object table's events
    def touch(self, key: str) -> None:
        """``key`` was read: its disk copy becomes the most recently used."""
        if key in self.disk_lru:
            del self.disk_lru[key]
            self.disk_lru[key] = None

    def forget(self, key: str) -> None:
        """``key`` left memory by another way (removed, its segment gone): no offload of it."""
        self.offloading.pop(key, None)

    def add_disk(self, key: str, meta: ObjectMeta, d: DiskReplica) -> None:
        """A disk copy of ``key`` is known (offloaded, or re-reported after a master change)."""
        meta.set_disk(d)
        self.disk_used += d.size
        self.disk_lru[key] = None

    def drop_disk(self, key: str, meta: ObjectMeta, not_before: float) -> None:
        """Forget ``key``'s disk copy; its file is deleted once ``not_before`` (a lease) passed."""
        d = meta.disk
        if d is None:
            return
        meta.set_disk(None)
        self.disk_used -= d.size
        self.disk_lru.pop(key, None)
        self.pending_file_deletes.append((not_before, d.path))

    def take_file_deletes(self, now: float) -> list[str]:
        """Paths (relative to root_fs_dir) whose files may be deleted now."""
        if not self.pending_file_deletes:
            return []
        ready = [p for t, p in self.pending_file_deletes if t <= now]
        self.pending_file_deletes = [(t, p) for t, p in self.pending_file_deletes if t > now]
        return ready

    def expire_offloads(self, now: float) -> None:
        """Offload tasks unanswered for ``offload_timeout_s``: the object may be evicted again."""
        for key, t in list(self.offloading.items()):
            if now - t > self.cfg.offload_timeout_s:
                del self.offloading[key]

    # ---------------------------------------------------------------- eviction
    def evictable(self, meta: ObjectMeta, key: str, now: float) -> bool:
        return meta.seg is not None and meta.lease <= now and not meta.hard and key not in self.offloading

    def evict(self, need: int, now: float) -> int:
        """Evict LRU objects until ``max(need, eviction_ratio * capacity)`` bytes are freed
        (or queued for offload). Returns the bytes freed immediately."""
        target = max(need, int(self.cfg.eviction_ratio * self.table.capacity))
        progress = 0
        victims: list[tuple[str, ObjectMeta]] = []
        soft: list[tuple[str, ObjectMeta]] = []
        objects, groups = self.table.objects, self.table.groups
        seen: set[str] = set()
        for key, meta in objects.items():  # oldest first: dict order is the LRU order
            if progress >= target:
                break
            if not self.evictable(meta, key, now):
                continue
            members = groups.group_of(key, objects) if groups else None
            if members:  # a group goes all at once, and only when no member is leased or pinned
                if key in seen:
                    continue
                seen.update(members)
                metas = [(k, objects[k]) for k in members]
                if all(self.evictable(m, k, now) and (m.soft is None or m.soft[0] <= now) for k, m in metas):
                    victims.extend(metas)
                    progress += sum(m.size * m.n_reps for _, m in metas)
                continue
            sp = meta.soft
            if sp is not None and sp[0] > now:
                soft.append((key, meta))
                continue
            victims.append((key, meta))
            progress += meta.size * meta.n_reps
        if progress < target and self.cfg.allow_evict_soft_pinned_objects:
            for key, meta in soft:  # soft-pinned objects go last
                if progress >= target:
                    break
                victims.append((key, meta))
                progress += meta.size * meta.n_reps
        freed = 0
        for key, meta in victims:
            freed += self.evict_one(key, meta, now)[0]
        return freed

    def offloading_bytes(self) -> int:
        """Memory bytes of objects being offloaded (freed once their files are written)."""
        return self._offloading(True)

    def _offloading(self, memory: bool) -> int:
        """Bytes of the objects being offloaded: in memory (every replica), or on disk (one)."""
        n = 0
        objects = self.table.objects
        for key in self.offloading:
            meta = objects.get(key)
            if meta is not None:
                n += meta.size * meta.n_reps if memory else meta.size
        return n

    def evict_one(self, key: str, meta: ObjectMeta, now: float) -> tuple[int, int]:
        """Evict one object's memory replicas. Returns (bytes freed, bytes queued for offload)."""
        reps = meta.reps()
        nbytes = meta.size * len(reps)
        if self.cfg.enable_offload and meta.disk is None:
            owner = self.table.clients.get(reps[0][0].client_id)
            if owner is not None and self.disk_room(meta.size, now):
                owner.tasks.append(OffloadTask(key, self.table.desc(reps[0], meta.size)))
                self.offloading[key] = now
                return 0, nbytes
        self.drop_memory(key, meta)
        return nbytes, 0

    def drop_memory(self, key: str, meta: ObjectMeta) -> None:
        """Free an object's memory replicas now; it stays only if it has a disk copy."""
        t = self.table
        for r in meta.reps():
            t.free_range(r, meta.size)
        meta.set_reps([])
        if meta.disk is None:
            del t.objects[key]
            t.groups.discard(key)
            t.key_events.publish("evict", key)
        t.stats.evictions += 1

    # ---------------------------------------------------------------- the SSD tier
    def offload_done(self, client_id: str, key: str, path: str, size: int) -> None:
        if not safe_rel_path(path):
            raise err(ErrorCode.INVALID_PARAMS, f"offload_done {key!r}: path {path!r} must be relative "
                       f"to root_fs_dir without '..'")
        t = self.table
        now = t.clock()
        self.offloading.pop(key, None)
        meta = t.objects.get(key)
        if meta is None or meta.size != size:
            self.pending_file_deletes.append((0, path))  # object gone meanwhile: drop the file
            raise err(ErrorCode.OBJECT_NOT_FOUND, f"offload_done {key!r}: object no longer exists "
                       f"(or size differs); the file will be deleted")
        reps = meta.reps()
        if meta.disk is None:
            self.add_disk(key, meta, DiskReplica(reps[0][0].name if reps else "", client_id, path, size))
        elif meta.disk.path != path:
            self.pending_file_deletes.append((0, path))
        lease = meta.lease if meta.lease > now else 0
        t.release_ranges(reps, meta.size, lease, now)
        meta.set_reps([])
        t.stats.offloads += 1
        self.enforce_disk_quota(now)

    def offload_failed(self, client_id: str, key: str) -> None:
        """The owner could not write the file: evict the memory copy without a disk copy."""
        now = self.table.clock()
        self.offloading.pop(key, None)
        meta = self.table.objects.get(key)
        if meta is None or meta.seg is None or meta.lease > now or meta.hard:
            return
        self.drop_memory(key, meta)

    def offload_reserved(self) -> int:
        """Disk bytes promised to offloads in flight (their files are being written now)."""
        return self._offloading(False)

    def disk_room(self, size: int, now: float) -> bool:
        """Make room for a ``size``-byte file *before* the owner writes it (least recently used
        files are dropped first), so the tier never exceeds --quota_bytes even for a moment.
        The original filled the disk because it never evicted (its issue #2475). False when the
        file cannot fit: the object is then evicted without a disk copy."""
        quota = self.cfg.disk_quota_bytes
        if quota <= 0:
            return True
        if size > quota:
            return False
        self.enforce_disk_quota(now, incoming=size + self.offload_reserved())
        return self.disk_used + self.offload_reserved() + size <= quota

    def enforce_disk_quota(self, now: float, incoming: int = 0) -> None:
        quota = self.cfg.disk_quota_bytes
        if quota <= 0 or self.disk_used + incoming <= quota:
            return
        t = self.table
        for key in list(self.disk_lru):
            if self.disk_used + incoming <= quota:
                break
            meta = t.objects.get(key)
            if meta is None or meta.disk is None:
                self.disk_lru.pop(key, None)
                continue
            if meta.lease > now or meta.hard:
                continue
            self.drop_disk(key, meta, 0)
            if meta.seg is None:
                del t.objects[key]
                t.groups.discard(key)
                t.key_events.publish("evict", key)
            t.stats.disk_evictions += 1
