"""The store master's records: its policy knobs and what it keeps per segment, object,
in-flight put and client (pure data; the decisions are ``master_state.MasterState``'s).

Memory per object is kept small (``__slots__``, the rare fields in a side object, shared size
ints, allocators that do not duplicate the offset->size map, no lease float until first read).
"""

from __future__ import annotations

import os
from typing import Callable

from dataclasses import dataclass

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store.protocol import OffloadTask
from mooncake_core.utils.range_allocator import RangeAllocator

MAX_REPLICAS = 16
MAX_SEGMENT_SIZE = 1 << 56


@dataclass
class MasterConfig:
    """Policy knobs (flag names of ``mooncake_master`` in comments)."""

    default_kv_lease_ttl_ms: int = 10_000          # --default_kv_lease_ttl
    default_kv_soft_pin_ttl_ms: int = 30 * 60_000  # --default_kv_soft_pin_ttl
    allow_evict_soft_pinned_objects: bool = True   # --allow_evict_soft_pinned_objects
    eviction_ratio: float = 0.05                   # --eviction_ratio
    eviction_high_watermark_ratio: float = 0.90    # --eviction_high_watermark_ratio
    client_ttl_s: float = 10.0                     # --client_ttl
    put_start_discard_timeout_s: float = 30.0      # --put_start_discard_timeout_sec
    put_start_release_timeout_s: float = 600.0     # --put_start_release_timeout_sec
    enable_offload: bool = False                   # --enable_offload
    root_fs_dir: str = ""                          # --root_fs_dir
    disk_quota_bytes: int = 0                      # --quota_bytes (0 = unlimited)
    offload_timeout_s: float = 60.0                # an unanswered OffloadTask is retried after this
    recovery_hold_s: float = 1.0                   # --recovery_hold_ms: re-mounted segments take no new
                                                   # allocation this long (see mount_segment)
    alignment: int = 64
    regex_budget_s: float = 1.0                    # --remove_by_regex_budget_ms: longest a pattern
                                                   # may take to match every key (ReDoS bound)
    #: a client's reservation (``MasterState.put_commit``) is taken back without its holder's
    #: word once this old and a put needs the space: the holder starts no write into it after
    #: RESERVATION_MAX_AGE_S, and this leaves a started write time to finish (see _reclaim)
    reservation_reclaim_s: float = 2.0
    #: --allocation_strategy: where a replica goes among the segments no preference names --
    #: "random" (the original's default, and ours: a segment that just rejoined empty gets its
    #: 1/N share, not every new put; a put placed on a segment whose owner died -- mounted until
    #: its client_ttl -- is retried by the writer away from it, ``ReplicateConfigMsg.avoid_segments``),
    #: "free_ratio_first" (largest free fraction first: fills an empty node first), "local_first"
    #: (segments on the writer's host first, then random)
    allocation_strategy: str = "random"
    #: --max_keys: most objects the master keeps (its memory grows with them: about 160 bytes
    #: each); a put of a new key past it evicts the least recently used evictable object, or is
    #: refused with -200 naming the flag. 0 = no bound.
    max_keys: int = 0
    #: the original's task-queue flags (``master_tasks``): a copy/move task not picked up within
    #: ``pending_task_timeout_s`` (0 = never) or not answered within ``processing_task_timeout_s``
    #: fails; ``create_*_task`` is refused with -1401 at ``max_total_pending_tasks``; heartbeats
    #: hand out no more while ``max_total_processing_tasks`` run; the newest
    #: ``max_total_finished_tasks`` finished ones can be queried
    pending_task_timeout_s: float = 300.0
    processing_task_timeout_s: float = 300.0
    max_total_pending_tasks: int = 10000
    max_total_processing_tasks: int = 10000
    max_total_finished_tasks: int = 10000


class Segment:
    """A memory segment a client mounted: ``[base, base+size)`` in that client's memory."""

    __slots__ = ("seg_id", "name", "key", "client_id", "base", "size", "alloc", "hold_until", "status",
                 "__weakref__")

    def __init__(self, seg_id: int, name: str, client_id: str, base: int, size: int, alignment: int,
                 key: str = ""):
        #: the master's name for it: ``name`` for a client's main segment, ``name#<segment id>``
        #: for more memory the client mounted (``mount_segment``); ``name`` is what replicas on
        #: it carry -- the Transfer Engine segment (the client) that serves their bytes
        self.key = key or name
        self.hold_until = 0.0  # no new allocation before this (a segment re-mounted after a master change)
        #: the original's SegmentStatus number: 1 OK takes allocations; 2 DRAINING, 3 DRAINED,
        #: 4 GRACEFULLY_UNMOUNTING stay readable and take none (``master_tasks``)
        self.status = 1
        self.seg_id = seg_id
        self.name = name
        self.client_id = client_id
        self.base = base
        self.size = size
        # track=False: the objects below already record offset and size of every range
        self.alloc = RangeAllocator(size, alignment, track=False)


#: one memory replica: (segment, offset in it)
Rep = tuple[Segment, int]


class DiskReplica:
    __slots__ = ("segment_name", "client_id", "path", "size")

    def __init__(self, segment_name: str, client_id: str, path: str, size: int):
        self.segment_name = segment_name
        self.client_id = client_id
        self.path = path
        self.size = size


class Extra:
    """The rarely used per-object fields, kept out of ObjectMeta to keep it small."""

    __slots__ = ("hard", "soft", "disk")

    def __init__(self, hard: bool = False, soft: list[float] | None = None, disk: DiskReplica | None = None):
        self.hard = hard
        self.soft = soft  # None or [deadline, ttl_s]
        self.disk = disk


class ObjectMeta:
    """One complete object (~72 bytes + the offset int).

    ``seg``/``off``: the memory replica's Segment and offset -- or tuples of them when there
    are several replicas, or None (disk only). ``lease``: monotonic deadline of the latest
    read lease (0 = never read). ``extra``: None or Extra (pins, disk replica)."""

    __slots__ = ("size", "seg", "off", "lease", "extra")
    seg: Segment | tuple[Segment, ...] | None
    off: int | tuple[int, ...] | None

    def __init__(self, size: int, reps: list[Rep], extra: Extra | None = None):
        self.size = size
        self.lease: float = 0
        self.extra = extra
        self.set_reps(reps)

    def reps(self) -> list[Rep]:
        seg, off = self.seg, self.off
        if seg is None:
            return []
        if isinstance(seg, tuple):
            assert isinstance(off, tuple)
            return list(zip(seg, off))
        assert isinstance(off, int)
        return [(seg, off)]

    def set_reps(self, reps: list[Rep]) -> None:
        if not reps:
            self.seg = self.off = None
        elif len(reps) == 1:
            self.seg, self.off = reps[0]
        else:
            self.seg = tuple(r[0] for r in reps)
            self.off = tuple(r[1] for r in reps)

    @property
    def n_reps(self) -> int:
        seg = self.seg
        return 0 if seg is None else len(seg) if isinstance(seg, tuple) else 1

    @property
    def hard(self) -> bool:
        return self.extra is not None and self.extra.hard

    @property
    def soft(self) -> list[float] | None:
        return None if self.extra is None else self.extra.soft

    @property
    def disk(self) -> DiskReplica | None:
        return None if self.extra is None else self.extra.disk

    def set_disk(self, d: DiskReplica | None) -> None:
        if self.extra is None:
            if d is None:
                return
            self.extra = Extra()
        self.extra.disk = d


#: a client starts a write into a reservation only this long after it asked for it (counted
#: from before the request, so the master's grant is later): the contract that lets the
#: master take back a reservation its holder no longer uses (``MasterConfig.reservation_reclaim_s``)
RESERVATION_MAX_AGE_S = 0.5

#: in-flight name of a client's reservation (``RESERVATION_PREFIX`` + client id; a batch
#: reservation adds ``BATCH_RESERVATION_SUFFIX``): never a valid user key's put in progress
RESERVATION_PREFIX = "\x00reservation:"
BATCH_RESERVATION_SUFFIX = "\x00batch"


class PendingPut:
    __slots__ = ("client_id", "size", "reps", "start", "upsert", "promote", "hard", "soft_ttl", "group")

    def __init__(self, client_id: str, size: int, reps: list[Rep], start: float, upsert: bool,
                 promote: bool, hard: bool, soft_ttl: float | None, group: str = ""):
        self.group = group  # the object group it is published in (master_groups); "" = none
        self.client_id = client_id
        self.size = size
        self.reps = reps
        self.start = start
        self.upsert = upsert
        self.promote = promote
        self.hard = hard
        self.soft_ttl = soft_ttl


#: removals queued for one client's next heartbeat before they collapse into "all before"
MAX_REMOVED_NOTICES = 65536


class VersionClock:
    """The versions that order the writes of one key across master terms: wall-clock
    nanoseconds (``clock``), kept increasing. A successor master starts seconds later, so its
    versions are higher than any of ours; a report of a higher one (a predecessor whose clock
    ran ahead) is ``observe``d so that ours stay above it."""

    __slots__ = ("_clock", "last")

    def __init__(self, clock: Callable[[], int]):
        self._clock = clock
        self.last = 0

    def next(self) -> int:
        """A version for a write published now."""
        v = self._clock()
        if v <= self.last:
            v = self.last + 1
        self.last = v
        return v

    def begin_run(self) -> None:
        """Start a run of versions from one clock reading (a batch): ``following`` then counts
        up from it without reading the clock per key; ``next`` may be mixed in."""
        self.last = max(self._clock(), self.last + 1) - 1

    def following(self) -> int:
        """The version after the last one handed out (within a run)."""
        self.last += 1
        return self.last

    def observe(self, version: int) -> None:
        if version > self.last:
            self.last = version


class ClientInfo:
    __slots__ = ("beat_at", "beats", "client_id", "last_seen", "missed", "missed_all_before", "pending_remount",
                 "quarantine", "removed", "removed_all_before", "segments", "tasks")

    def __init__(self, client_id: str, now: float):
        self.client_id = client_id
        self.last_seen = now
        self.beats = 0  # heartbeats received
        #: when the last two heartbeats came (master clock): (the one before, the last)
        self.beat_at = (-1.0, -1.0)
        #: ranges of this client's segment a failed put was writing into: (beats at which to
        #: free, segment, offset, size) -- see MasterState.quarantine_ranges
        self.quarantine: list[tuple[int, Segment, int, int]] = []
        self.segments: set[str] = set()
        self.tasks: list[OffloadTask] = []
        #: objects in this client's segment removed/overwritten by anyone, (key, version clock at
        #: the time), so that it stops re-reporting them (see heartbeat)
        self.removed: list[tuple[str, int]] = []
        self.removed_all_before = 0
        #: told to re-mount (new here: after a restart, a failover or its expiry) and not done
        #: yet: every heartbeat says so until it mounts -- a reply can get lost
        self.pending_remount = True
        #: notices it missed while expired, repeated with every reply until it re-mounts
        self.missed: list[tuple[str, int]] = []
        self.missed_all_before = 0

    def beats_since(self, t: float) -> int:
        """How many of the last two heartbeats came after ``t`` (0, 1 or 2)."""
        return (self.beat_at[0] > t) + (self.beat_at[1] > t)

    def beat(self, now: float) -> list[tuple[Segment, int, int]]:
        """Count a heartbeat; the parked ranges (segment, offset, size) now due to be freed."""
        self.beats += 1
        self.beat_at = (self.beat_at[1], now)
        if not self.quarantine:
            return []
        due = [(seg, off, size) for at, seg, off, size in self.quarantine if at <= self.beats]
        self.quarantine = [q for q in self.quarantine if q[0] > self.beats]
        return due


class Stats:
    __slots__ = ("hits", "misses", "evictions", "lease_refusals", "offloads", "puts",
                 "put_conflicts", "no_space", "disk_evictions", "expired_clients", "takeovers", "reclaim_waits",
                 "key_limit_evictions", "key_limit_refusals")

    def __init__(self) -> None:
        self.hits = self.misses = self.evictions = self.lease_refusals = self.offloads = 0
        self.puts = self.put_conflicts = self.no_space = self.disk_evictions = 0
        self.expired_clients = self.takeovers = 0
        self.reclaim_waits = 0  # puts asked to wait for reservations/quarantine to be taken back
        self.key_limit_evictions = self.key_limit_refusals = 0  # --max_keys at work


def err(code: ErrorCode, msg: str) -> MooncakeError:
    return MooncakeError(code, msg)


def check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise err(ErrorCode.INVALID_PARAMS, f"key must be a non-empty string, got {key!r}")
    return key


def safe_rel_path(path: object) -> bool:
    """A relative path that stays inside the offload root (no absolute path, no '..')."""
    if not isinstance(path, str) or not path or os.path.isabs(path):
        return False
    return ".." not in path.replace("\\", "/").split("/")
