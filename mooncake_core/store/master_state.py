"""The store master's decision logic: pure, single-threaded, clock injected.

No sockets, no threads, no files: the RPC server (``master_server``) calls these methods
one at a time (under its lock) and performs the few side effects they ask for (deleting
SSD-tier files listed in ``tier.pending_file_deletes``). Unit tests drive it with a fake clock.

Rules implemented here (Mooncake semantics):

* **Put state machine**: ``put_start`` allocates the replicas (distinct segments, preferred
  segments first) and records an *in-flight* put; ``put_end`` makes the object visible
  (complete); ``put_revoke`` frees the space. Objects are immutable: ``put_start`` of a
  complete key fails with -705 (the client maps that to "success, old value kept");
  ``upsert_start`` replaces: the old replicas stay readable until the new ones are complete,
  then are freed once no lease holds them. An in-flight put not finished within
  ``put_start_discard_timeout_s`` (30 s) may be taken over by another put.
* **Leases**: ``get_replica_list`` grants a lease of ``default_kv_lease_ttl``; a leased
  object is never evicted, and ``remove`` refuses it with -706 unless ``force`` -- even then
  its memory is only reused after the lease ran out (the "graveyard"), so a reader holding a
  lease never sees bytes of another object.
* **Eviction**: approximate LRU over the key dict's order (a hit moves the key to the end).
  Starts when usage reaches ``eviction_high_watermark_ratio`` (checked in ``tick``) or when
  an allocation fails, and frees ``eviction_ratio`` of the capacity; skips leased,
  in-flight and hard-pinned objects; soft-pinned objects (pin not yet expired) only if the
  others did not free enough. -200 when nothing evictable remains.
* **Clients**: heartbeats; after ``client_ttl_s`` without one, the client's segments are
  unmounted and every replica on them dropped (gets then miss).
* **SSD tier** (``enable_offload``): instead of dropping an evicted object whose owner is
  alive, the master queues an ``OffloadTask`` for the owner; the memory is freed only when the
  owner reports ``offload_done``. The disk tier has a byte quota and evicts LRU.
* **Recovery** (new leader / restarted master): unknown clients get ``need_remount`` and
  re-report their complete objects (``report_objects``); reported ranges are re-marked used.

The records it keeps (config, segments, objects, puts, clients) are in ``master_records``;
eviction and the SSD tier are the ``Tier``'s (``master_tier``), batches ``master_batch``'s (answered packed).
"""

from __future__ import annotations

import heapq
import itertools
import random
import secrets
import time
from typing import Any, Callable, Iterable

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store.key_events import KeyEventKind, KeyEventLog, watch_reply
from mooncake_core.store.protocol import (
    BatchGetReply, BatchPutCommitReply, GetReply, HeartbeatReply, KeyEventsReply, MountReply, Placements,
    PutCommitReply, ReplicaDesc, ReplicateConfigMsg,
)
from mooncake_core.store import master_batch, master_reports
from mooncake_core.store.master_absence import Absences
from mooncake_core.store.master_groups import ObjectGroups
from mooncake_core.store.packing import I32, I64, unpack
from mooncake_core.store.master_records import (MAX_REMOVED_NOTICES, MAX_REPLICAS, MAX_SEGMENT_SIZE,
                                                 RESERVATION_PREFIX, ClientInfo, Extra, MasterConfig, ObjectMeta,
                                                 PendingPut, Rep, Segment, Stats, VersionClock, check_key, err)
from mooncake_core.store.master_tasks import ReplicaTasks
from mooncake_core.store.master_tier import Tier
from mooncake_core.store.master_space import (SpaceReclaiming, holdings, no_space_message, reclaim_pending,
                                               reclaimable)
from mooncake_core.utils import bounded_regex
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.store.master")

#: in-flight name of a client's reservation (see ``MasterState.put_commit``): a NUL-prefixed
#: string no client library produces as a key


#: --allocation_strategy values (the original's names; its cxl / ssd_* ones need tiers not here)
ALLOCATION_STRATEGIES = ("random", "free_ratio_first", "local_first")
#: --max_keys: how many of the least recently used objects a put at the bound looks at for one to evict
KEY_ROOM_SCAN = 4096


class MasterState:
    """All master decisions. Not thread-safe: the caller serialises calls."""

    def __init__(self, config: MasterConfig | None = None, clock: Callable[[], float] = time.monotonic,
                 version_clock: Callable[[], int] = time.time_ns, rng: random.Random | None = None):
        """``clock`` (seconds, monotonic) times leases, TTLs and holds; ``version_clock``
        (wall-clock nanoseconds) stamps published writes (see ``_new_version``). Both are
        injected so tests drive time and versions without sleeping; so is ``rng``, the
        random placement's (``--allocation_strategy=random``)."""
        self.cfg = config or MasterConfig()
        if self.cfg.allocation_strategy not in ALLOCATION_STRATEGIES:
            raise ValueError(f"allocation_strategy must be one of {', '.join(ALLOCATION_STRATEGIES)}, "
                             f"got {self.cfg.allocation_strategy!r}")
        self.rng = rng or random.Random()
        self.clock = clock
        #: versions order the writes of one key across master terms (see put_end/report_objects)
        self.versions = VersionClock(version_clock)
        self.objects: dict[str, ObjectMeta] = {}
        self.inflight: dict[str, PendingPut] = {}
        self.segments: dict[str, Segment] = {}
        self.segs_by_id: dict[int, Segment] = {}
        self.clients: dict[str, ClientInfo] = {}
        # ranges freed only once a reader's lease has run out: (deadline, seq, segment, off, size)
        self.graveyard: list[tuple[float, int, Segment, int, int]] = []
        self.stats = Stats()
        self._next_seg_id = 1
        self._seq = 0
        self._sizes: dict[int, int] = {}
        self._largest_seg: int | None = None  # cached size of the largest segment
        #: identifies this master's term: a new process or a new HA leadership gets a new one.
        #: Leases are only honoured within the epoch that granted them (see mount_segment).
        self.epoch = secrets.randbits(62) + 1
        self._holds_until = 0.0  # max hold_until of any segment (fast path: no hold active)
        #: key -> version, for objects rebuilt from re-reports (not written through this master);
        #: forgotten 2 x client_ttl after the last report, when late reports cannot matter
        self.reported: dict[str, int] = {}
        self.reported_until = 0.0
        #: expired clients' missed notices, tombstones of removals while re-reports can arrive
        self.absent = Absences(self.cfg.client_ttl_s)
        #: segment name -> the latest lease end of what it held when it was unmounted: a
        #: re-mount before then takes no new allocation (a reader may still be copying)
        self.lease_floor: dict[str, float] = {}
        #: segments a writer could not reach a moment ago (named in a put's avoid_segments):
        #: placed last for everyone until their owner heartbeats again -- a dead owner's
        #: segment stays mounted until client_ttl, and each put placed there costs its writer
        #: a failed transfer and a retry
        self.suspect: set[str] = set()
        #: segment name -> ranges of puts still being written into it when it was unmounted,
        #: (until, offset, size): a re-mount keeps them allocated until then (their writers
        #: may still be sending; their bytes must not land on a newer object)
        self.reserved: dict[str, list[tuple[float, int, int]]] = {}
        # readers whose copy took longer than this confirm the epoch afterwards; kept below the
        # hold for margin (the reader's clock starts before the grant, the hold after it). 0 = the
        # hold is off and so is the check (the original's behaviour).
        self.confirm_after_ms = int(self.cfg.recovery_hold_s * 800)
        #: existence changes of keys, for subscribers such as the proxy's scheduler (key_events.py)
        self.key_events = KeyEventLog()
        #: eviction and the SSD tier (its records are its own; it sees this object table)
        self.tier = Tier(self)
        #: segments whose status is not OK (draining, drained): they take no new allocation
        self._closed_segs = 0
        #: object groups (ReplicateConfig.group_ids): leased and evicted together (``master_groups``)
        self.groups = ObjectGroups()
        #: copy/move tasks and drain jobs (``master_tasks``); wall-clock ms for their timestamps
        self.tasks = ReplicaTasks(self, lambda: version_clock() // 1_000_000)

    def begin_leadership(self) -> None:
        """Called when this master starts serving as elected HA leader: a new epoch, so that
        reads under leases of an earlier term are confirmed against the new leader."""
        self.epoch = secrets.randbits(62) + 1

    # ================================================================ primitives (the interface master_batch,
    # master_tier and master_reports use: they touch no private member of this class)
    def placeable(self, now: float) -> dict[str, Segment]:
        """The segments that take new allocations at ``now`` (not in a recovery hold, not
        being drained)."""
        if now >= self._holds_until and not self._closed_segs:
            return self.segments
        return {n: s for n, s in self.segments.items() if s.hold_until <= now and s.status == 1}

    def set_segment_status(self, seg: Segment, status: int) -> None:
        """Open (1, OK) or close (draining, drained) ``seg`` to new allocations."""
        self._closed_segs += (status != 1) - (seg.status != 1)
        seg.status = status

    def notify_dropped(self, key: str, seg: Segment) -> None:
        """Tell ``seg``'s owner that its replica of ``key`` is gone (moved, cleared) while the
        object lives on elsewhere: it must not re-report it after a master change."""
        c = self.clients.get(seg.client_id)
        if c is None:
            return
        stamp = self._new_version()
        if len(c.removed) >= MAX_REMOVED_NOTICES:
            c.removed, c.removed_all_before = [], stamp
        else:
            c.removed.append((key, stamp))

    def drop_reservations_in(self, names: set[str]) -> None:
        """Take back the clients' reservations (single and batch) that hold ranges in the
        segments ``names``: a put into them would publish there later."""
        for key, p in list(self.inflight.items()):
            if key.startswith(RESERVATION_PREFIX) and any(s.key in names for s, _ in p.reps):  # single and batch
                del self.inflight[key]
                self.quarantine_ranges(p.client_id, p.reps, p.size)

    def intern_size(self, size: int) -> int:
        """``size``, as the one int object shared by every record of that size (memory)."""
        s = self._sizes.get(size)
        if s is not None:
            return s
        if len(self._sizes) < 4096:
            self._sizes[size] = size
        return size

    def is_mounted(self, seg: Segment) -> bool:
        return self.segments.get(seg.key) is seg

    @staticmethod
    def desc(rep: Rep, size: int, status: str = "complete") -> ReplicaDesc:
        seg, off = rep
        return ReplicaDesc(seg.name, seg.base + off, size, "memory", "", status)

    def _descs(self, meta: ObjectMeta) -> list[ReplicaDesc]:
        size = meta.size
        out = [self.desc(r, size) for r in meta.reps()]
        d = meta.disk
        if d is not None:
            out.append(ReplicaDesc(d.segment_name, 0, d.size, "disk", d.path, "complete"))
        return out

    def free_range(self, rep: Rep, size: int) -> None:
        seg, off = rep
        if self.is_mounted(seg):
            seg.alloc.free(off, size)

    def quarantine_ranges(self, writer: str, reps: Iterable[Rep], size: int) -> None:
        """Free the ranges of a put that failed or was abandoned -- once the owner of each
        segment has sent two more heartbeats.

        The one reason to wait: bytes of a write into a range must not land after the range
        was given to another object. A write into another client's segment is a request to
        that owner; a writer that gave up (timeout) may leave it queued in a *stopped* owner's
        socket, and the owner applies it when it resumes (found by bench/robustness/chaos.py). Two
        heartbeats from the owner after the writer let go show it ran a heartbeat interval
        since, its transfer server having taken what was queued. A write into the writer's own
        segment is a memcpy that has ended when the writer tells us (revoke, commit): those
        ranges, and ranges whose owner is gone, are freed at once."""
        for seg, off in reps:
            owner = self.clients.get(seg.client_id)
            if owner is None or seg.client_id == writer or not self.is_mounted(seg):
                self.free_range((seg, off), size)
            else:
                owner.quarantine.append((owner.beats + 2, seg, off, size))

    def release_ranges(self, reps: Iterable[Rep], size: int, not_before: float, now: float) -> None:
        """Free memory replicas now, or once ``not_before`` (a lease deadline) has passed."""
        for seg, off in reps:
            if not_before > now:
                self._seq += 1
                heapq.heappush(self.graveyard, (not_before, self._seq, seg, off, size))
            else:
                self.free_range((seg, off), size)

    def release_reservations(self, client_id: str, addrs: Iterable[int]) -> int:
        """Free at once the reservations (single and batch) of ``client_id`` whose first range
        starts at one of ``addrs``: its holder tells us none of its writes into them can still
        land (it never wrote, or its writes returned), so nothing waits. Named by address, so
        a release that crosses a newer reservation on the way frees nothing. Returns the bytes
        freed; reservations of other clients, or unknown addresses, are ignored."""
        want = {a for a in addrs if a.__class__ is int}
        if not want:
            return 0
        freed = 0
        for rk in (RESERVATION_PREFIX + client_id, master_batch.batch_reservation_key(client_id)):
            p = self.inflight.get(rk)
            if p is None or p.client_id != client_id or not p.reps:
                continue
            seg, off = p.reps[0]
            if seg.base + off in want:
                del self.inflight[rk]
                for r in p.reps:
                    self.free_range(r, p.size)
                    freed += p.size
        return freed

    def _reclaim(self, now: float) -> int:
        """Take back what a put may use without evicting anyone's object: ranges kept for
        readers whose leases have ended, and reservations older than
        ``reservation_reclaim_s`` -- their holders write into them only within
        ``RESERVATION_MAX_AGE_S``; from then on a range is free once its owner has sent two
        heartbeats (the quarantine rule: a write that was late may be queued at the owner), or
        parked for the beats still missing. Returns the bytes freed now. On the failure path
        only: O(puts in flight)."""
        freed = 0
        while self.graveyard and self.graveyard[0][0] <= now:
            _, _, seg, off, size = heapq.heappop(self.graveyard)
            self.free_range((seg, off), size)
            freed += size
        limit = self.cfg.reservation_reclaim_s
        for key, p in list(self.inflight.items()):
            if not key.startswith(RESERVATION_PREFIX) or now - p.start < limit:
                continue
            del self.inflight[key]
            since = p.start + limit
            for seg, off in p.reps:
                if not self.is_mounted(seg):
                    continue
                owner = self.clients.get(seg.client_id)
                n = 2 if owner is None else owner.beats_since(since)
                if n >= 2:
                    self.free_range((seg, off), p.size)
                    freed += p.size
                else:
                    assert owner is not None
                    owner.quarantine.append((owner.beats + 2 - n, seg, off, p.size))
        return freed

    def reclaimable(self) -> dict[Segment, int]:
        """Bytes per segment held by reservations and quarantined ranges (``master_space``)."""
        return reclaimable(self.inflight, self.clients.values())

    def drop_object(self, key: str, meta: ObjectMeta, now: float) -> None:
        """Remove a complete object; memory/file reuse waits for an active lease."""
        del self.objects[key]
        self.groups.discard(key)
        self.key_events.publish("remove", key)
        if self.reported:
            self.reported.pop(key, None)
        self.tier.forget(key)
        lease = meta.lease if meta.lease > now else 0
        self.release_ranges(meta.reps(), meta.size, lease, now)
        meta.set_reps([])
        self.tier.drop_disk(key, meta, lease)

    @property
    def puts_in_flight(self) -> int:
        """Puts started and not yet ended, the clients' reservations (``put_commit``) aside."""
        return sum(1 for k in self.inflight if not k.startswith(RESERVATION_PREFIX))

    def reservations_by_segment(self) -> dict[str, int]:
        """Segment (its key: name, or name#id for mounted memory) -> ranges in it held by the
        clients' reservations (``put_commit``): allocations that are not objects (yet).
        O(puts in flight)."""
        out: dict[str, int] = {}
        for k, p in self.inflight.items():
            if k.startswith(RESERVATION_PREFIX):
                for seg, _ in p.reps:
                    out[seg.key] = out.get(seg.key, 0) + 1
        return out

    @property
    def capacity(self) -> int:
        return sum(s.size for s in self.segments.values())

    @property
    def used(self) -> int:
        return sum(s.alloc.used for s in self.segments.values())

    def touch_client(self, client_id: str, now: float) -> tuple[ClientInfo, bool]:
        c = self.clients.get(client_id)
        if c is None:
            c = self.clients[client_id] = ClientInfo(client_id, now)
            missed = self.absent.back(client_id, now)
            if missed is not None:  # back after an expiry: its replies carry what it missed
                c.missed, c.missed_all_before = missed
            return c, True
        c.last_seen = now
        return c, False

    # ================================================================ segments / clients
    def mount_segment(self, client_id: str, segment_name: str, base: int, size: int,
                      prev_epoch: int = 0, segment_id: str = "") -> MountReply:
        """Mount (or idempotently re-mount) a client's segment.

        ``prev_epoch``: the epoch of the master this client was mounted at before (0 = never).
        When it differs from ours, the segment comes back after a master restart/failover and
        readers may still be copying out of it under leases we never granted and cannot see.
        The segment then takes no new allocation for ``recovery_hold_s``; a reader whose copy
        took longer than that confirms with us that the epoch did not change before trusting
        its bytes (the client's side of the contract, see GetReply.confirm_after_ms). Fresh
        segments are not held, so a fresh start is not delayed.

        ``segment_id``: more memory of the same client (the original's ``mount_segment``),
        kept as segment ``segment_name#segment_id`` whose replicas name ``segment_name``."""
        if not isinstance(client_id, str) or not client_id:
            raise err(ErrorCode.INVALID_PARAMS,
                      f"mount_segment: client_id must be a non-empty string, got {client_id!r}")
        if not isinstance(segment_name, str) or not segment_name:
            raise err(ErrorCode.INVALID_PARAMS,
                      f"mount_segment: segment_name must be a non-empty string, got {segment_name!r}")
        if not isinstance(base, int) or base < 0:
            raise err(ErrorCode.INVALID_PARAMS,
                      f"mount_segment {segment_name!r}: base must be an int >= 0, got {base!r}")
        if not isinstance(size, int) or size <= 0 or size > MAX_SEGMENT_SIZE:
            raise err(ErrorCode.INVALID_PARAMS,
                      f"mount_segment {segment_name!r}: size must be an int in 1..2^56, got {size!r}")
        if not isinstance(prev_epoch, int) or prev_epoch < 0:
            raise err(ErrorCode.INVALID_PARAMS,
                      f"mount_segment {segment_name!r}: prev_epoch must be an int >= 0, got {prev_epoch!r}")
        if not isinstance(segment_id, str) or "#" in segment_id:
            raise err(ErrorCode.INVALID_PARAMS,
                      f"mount_segment {segment_name!r}: segment_id must be a string without '#', got {segment_id!r}")
        key = f"{segment_name}#{segment_id}" if segment_id else segment_name
        now = self.clock()
        client, _ = self.touch_client(client_id, now)
        if not segment_id:
            client.pending_remount = False  # it heard us (or never needed to: a fresh client)
            client.missed, client.missed_all_before = [], 0
        old = self.segments.get(key)
        if old is not None:
            if old.client_id == client_id and old.base == base and old.size == size:
                client.segments.add(key)
                return self._mount_reply()
            log.warning("segment re-mounted with a different owner or range: dropping the old one",
                        extra={"segment": key, "old_client": old.client_id, "new_client": client_id})
            self._unmount(old, now)
        segment_name = key
        seg = Segment(self._next_seg_id, key.split("#", 1)[0], client_id, base, size, self.cfg.alignment, key)
        if prev_epoch and prev_epoch != self.epoch and self.cfg.recovery_hold_s > 0:
            seg.hold_until = now + self.cfg.recovery_hold_s
            self._holds_until = max(self._holds_until, seg.hold_until)
        for until, off, rsize in self.reserved.pop(segment_name, []):
            if until > now and off + rsize <= size:
                try:
                    seg.alloc.reserve(off, rsize)
                except ValueError:
                    continue
                self._seq += 1
                heapq.heappush(self.graveyard, (until, self._seq, seg, off, rsize))
        floor = self.lease_floor.pop(segment_name, 0.0)
        if floor > now:  # unmounted (client expired) while readers held leases on it
            seg.hold_until = max(seg.hold_until, floor)
            self._holds_until = max(self._holds_until, seg.hold_until)
        self._next_seg_id += 1
        self.segments[key] = seg
        self.segs_by_id[seg.seg_id] = seg
        self._largest_seg = None
        client.segments.add(segment_name)
        log.info("segment mounted", extra={"segment": segment_name, "client": client_id, "size": size})
        return self._mount_reply()

    def _mount_reply(self) -> MountReply:
        return MountReply(self.cfg.enable_offload, self.cfg.root_fs_dir, float(self.cfg.client_ttl_s), self.epoch)

    def unmount_segment(self, client_id: str, segment_name: str, grace_period_ms: int = 0) -> None:
        """Unmount a client's segment: at once (its replicas are dropped), or with
        ``grace_period_ms`` > 0 gracefully -- it takes no new allocation, its objects are
        moved or keep a replica elsewhere (a drain, ``master_tasks``), and it goes when that
        is done or the grace period is over. ``segment_status`` tells the owner when its
        memory may go."""
        seg = self.segments.get(segment_name)
        if seg is None:
            raise err(ErrorCode.SEGMENT_NOT_FOUND, f"unmount_segment: segment {segment_name!r} is not mounted")
        if seg.client_id != client_id:
            raise err(ErrorCode.INVALID_PARAMS, f"unmount_segment: segment {segment_name!r} belongs to "
                       f"client {seg.client_id!r}, not {client_id!r}")
        if not isinstance(grace_period_ms, int) or grace_period_ms < 0:
            raise err(ErrorCode.INVALID_PARAMS, f"unmount_segment {segment_name!r}: grace_period_ms must be "
                      f"an int >= 0, got {grace_period_ms!r}")
        if grace_period_ms and seg.status != 4:
            self.tasks.unmount_gracefully(seg, grace_period_ms / 1000.0)
        elif not grace_period_ms:
            self._unmount(seg, self.clock())

    def unmount(self, seg: Segment) -> None:
        """Unmount ``seg`` now (a graceful unmount whose drain ended or ran out of time)."""
        if self.is_mounted(seg):
            self._unmount(seg, self.clock())

    def segment_status(self, client_id: str, segment_name: str) -> tuple[int, int]:
        """(SegmentStatus number, ms until its memory may be reused) of the segment, or
        (0, ms) once it is unmounted: readers may still copy out of it under leases for those ms."""
        seg = self.segments.get(segment_name)
        now = self.clock()
        if seg is not None and seg.client_id == client_id:
            return seg.status, 0
        return 0, max(0, int((self.lease_floor.get(segment_name, 0.0) - now) * 1000))

    def _unmount(self, seg: Segment, now: float, kind: KeyEventKind = "remove") -> int:
        """Forget a segment and every replica on it. Returns how many objects were lost
        (published as ``kind`` events: "expire" when the owner stopped heart-beating)."""
        del self.segments[seg.key]
        del self.segs_by_id[seg.seg_id]
        self.suspect.discard(seg.name)
        self.set_segment_status(seg, 1)  # no longer counted as closed
        self._largest_seg = None
        c = self.clients.get(seg.client_id)
        if c is not None:
            c.segments.discard(seg.key)
        lost = 0
        floor = max((g[0] for g in self.graveyard if g[2] is seg), default=0.0)
        for key, meta in list(self.objects.items()):
            s = meta.seg
            if s is None or (s is not seg and (not isinstance(s, tuple) or seg not in s)):
                continue
            floor = max(floor, meta.lease)
            meta.set_reps([r for r in meta.reps() if r[0] is not seg])
            if meta.seg is None:
                self.tier.forget(key)
                if meta.disk is None:
                    del self.objects[key]
                    self.groups.discard(key)
                    self.key_events.publish(kind, key)
                    lost += 1
        for key, p in list(self.inflight.items()):
            if any(r[0] is seg for r in p.reps):
                until = p.start + self.cfg.put_start_discard_timeout_s + 5.0
                for r in p.reps:
                    if r[0] is seg and until > now:
                        self.reserved.setdefault(seg.key, []).append((until, r[1], p.size))
                self.quarantine_ranges(p.client_id, [r for r in p.reps if r[0] is not seg], p.size)
                del self.inflight[key]
        if any(g[2] is seg for g in self.graveyard):
            self.graveyard = [g for g in self.graveyard if g[2] is not seg]
            heapq.heapify(self.graveyard)
        if floor > now:
            self.lease_floor[seg.key] = floor
        log.info("segment unmounted", extra={"segment": seg.key, "client": seg.client_id, "objects_lost": lost})
        return lost

    def heartbeat(self, client_id: str, release: Iterable[int] = ()) -> HeartbeatReply:
        """A client's sign of life; ``release``: reservations it lets go of (by address: see
        ``release_reservations``), those it held unused past their age."""
        if not isinstance(client_id, str) or not client_id:
            raise err(ErrorCode.INVALID_PARAMS, f"heartbeat: client_id must be a non-empty string, got {client_id!r}")
        now = self.clock()
        client, new = self.touch_client(client_id, now)
        if self.suspect:  # its owner answers: the writer's failure was not the segment's
            self.suspect.difference_update(self.segments[k].name for k in client.segments if k in self.segments)
        if release:
            self.release_reservations(client_id, release)
        for seg, off, size in client.beat(now):  # parked ranges of failed puts, now safe
            self.free_range((seg, off), size)
        tasks, client.tasks = client.tasks, []
        replica_tasks = self.tasks.take(client_id, now) if self.tasks.queued else []
        removed, client.removed = client.removed, []
        all_before, client.removed_all_before = client.removed_all_before, 0
        if client.pending_remount:
            removed = client.missed + removed
            all_before = max(all_before, client.missed_all_before)
        return HeartbeatReply(need_remount=new or client.pending_remount, offload_tasks=tasks, removed=removed,
                              removed_all_before=all_before, replica_tasks=replica_tasks)

    def _notify_removed(self, key: str, meta: ObjectMeta, everything: bool = False) -> int:
        """Tell the owners of ``meta``'s replicas (next heartbeat) that ``key`` is gone, so a
        master change cannot bring a removed or overwritten value back through their
        re-reports. ``everything``: a remove_all -- one "all before now" notice instead.
        Returns the removal's stamp."""
        stamp = self._new_version()
        for seg, _ in meta.reps():
            c = self.clients.get(seg.client_id)
            if c is None:
                continue
            if everything or len(c.removed) >= MAX_REMOVED_NOTICES:
                c.removed = []  # all covered by the one stamp
                c.removed_all_before = stamp
            else:
                c.removed.append((key, stamp))
        return stamp

    def report_objects(self, client_id: str, objects: list[tuple[str, ReplicaDesc]],
                       versions: list[int] | None = None) -> int:
        """Rebuild state from a client's complete objects (after need_remount): see
        ``master_reports.report_objects``."""
        return master_reports.report_objects(self, client_id, objects, versions)

    # ================================================================ puts
    def put_start(self, client_id: str, key: str, size: int, cfg: ReplicateConfigMsg | None = None,
                  *, upsert: bool = False, release: Iterable[int] = ()) -> list[ReplicaDesc]:
        """Allocate the replicas of a put (recorded in flight). ``release``: the client's
        reservations it does not use for this put, freed first (``release_reservations``)."""
        check_key(key)
        cfg = cfg or ReplicateConfigMsg()
        self.check_cfg(cfg, key)
        group = self._group(cfg, [key])
        if release:
            self.release_reservations(client_id, release)
        now = self.clock()
        reps = self.put_start_one(client_id, key, size, cfg, self.soft_ttl(cfg), now, upsert,
                                   self.direct_target(cfg, now))
        if group:
            self.inflight[key].group = group[0]
        return [ReplicaDesc(seg.name, seg.base + off, size, "memory", "", "processing") for seg, off in reps]

    @staticmethod
    def _group(cfg: ReplicateConfigMsg, keys: list[str]) -> list[str]:
        """The group of each key of a put (``group_ids``: none, one per key, or one id repeated
        or alone for every key), else -600."""
        ids = cfg.group_ids
        if not ids:
            return []
        if all(isinstance(g, str) for g in ids):
            if len(ids) == len(keys):
                return ids
            if len(set(ids)) == 1:  # one group for every key of the call
                return [ids[0]] * len(keys)
        raise err(ErrorCode.INVALID_PARAMS, f"put of {len(keys)} key(s) from {keys[0]!r}: group_ids must name "
                  f"one group (a str) per key, or one group for all, got {len(ids)} ids")

    @staticmethod
    def check_cfg(cfg: ReplicateConfigMsg, what: str) -> None:
        if not isinstance(cfg.replica_num, int) or not 1 <= cfg.replica_num <= MAX_REPLICAS:
            raise err(ErrorCode.INVALID_PARAMS,
                      f"put {what!r}: replica_num must be 1..{MAX_REPLICAS}, got {cfg.replica_num!r}")

    def soft_ttl(self, cfg: ReplicateConfigMsg) -> float | None:
        if not cfg.soft_pin:
            return None
        ttl_ms = cfg.soft_pin_ttl_ms if cfg.soft_pin_ttl_ms is not None else self.cfg.default_kv_soft_pin_ttl_ms
        return ttl_ms / 1000.0

    def direct_target(self, cfg: ReplicateConfigMsg, now: float) -> Segment | None:
        """The segment every put with ``cfg`` goes to when placement has no choice to make
        (one mounted segment, no recovery hold, not drained, not avoided: replicas must be on
        distinct segments, and a preference can only name that one), else None. Worked out
        once per batch."""
        if len(self.segments) != 1 or now < self._holds_until or self._closed_segs or self.cfg.max_keys \
                or cfg.avoid_segments:
            return None  # (with --max_keys every new key goes through claim())
        return next(iter(self.segments.values()))

    @staticmethod
    def without_avoided(segs: dict[str, Segment], cfg: ReplicateConfigMsg) -> dict[str, Segment]:
        """``segs`` less the ones ``cfg.avoid_segments`` names (a writer's retry after it could
        not reach them): never a fallback onto them, a put that fits nowhere else fails."""
        if not cfg.avoid_segments:
            return segs
        avoid = set(cfg.avoid_segments)  # by name: a client's further memory is "name#id" here
        return {k: s for k, s in segs.items() if s.name not in avoid}

    def put_start_one(self, client_id: str, key: str, size: int, cfg: ReplicateConfigMsg,
                       soft_ttl: float | None, now: float, upsert: bool,
                       direct: Segment | None = None) -> list[Rep]:
        """put_start of one key whose ``cfg`` was validated (once per batch): the replicas
        allocated (recorded as an in-flight put). Every step is
        O(1) (dict lookups, the allocator's top block) or O(log free blocks) -- never a walk
        over the stored objects. ``direct``: see _direct_target."""
        if size.__class__ is not int or size <= 0:
            raise err(ErrorCode.INVALID_PARAMS, f"put {key!r}: size must be an int > 0, got {size!r}")
        promote = self.claim(key, size, upsert, now)
        reps: list[Rep] | None = None
        if direct is not None and size <= direct.size:
            off = direct.alloc.allocate(size)
            if off is not None:
                reps = [(direct, off)]
        if reps is None:  # a choice to make, or no room: the general path (it may evict)
            reps = self._allocate(key, size, cfg, now, client_id)
        self.inflight[key] = PendingPut(client_id, self._sizes.get(size) or self.intern_size(size), reps, now,
                                        upsert, promote, bool(cfg.with_hard_pin), soft_ttl)
        return reps

    def claim(self, key: str, size: int, upsert: bool, now: float) -> bool:
        """The key checks of a put about to be recorded in flight: -705 when the key exists
        (unless upserting) or another put of it is in progress; an abandoned put of it
        (older than ``put_start_discard_timeout_s``) is taken over. Returns whether the put
        brings a disk-only object back to memory."""
        promote = False
        meta = self.objects.get(key)
        if meta is None and self.cfg.max_keys and len(self.objects) >= self.cfg.max_keys:
            self._make_key_room(key, now)
        if meta is not None and not upsert:
            if meta.seg is None and meta.disk is not None and meta.size == size:
                promote = True  # disk-only object: a put brings it back to memory
            else:
                self.stats.put_conflicts += 1
                raise err(ErrorCode.OBJECT_ALREADY_EXISTS, f"put {key!r}: object already exists")
        p = self.inflight.get(key)
        if p is not None:
            if now - p.start < self.cfg.put_start_discard_timeout_s:
                self.stats.put_conflicts += 1
                raise err(ErrorCode.OBJECT_ALREADY_EXISTS,
                           f"put {key!r}: a put by client {p.client_id!r} is in progress")
            log.warning("taking over a put never finished", extra={"key": key, "old_client": p.client_id,
                                                                 "age_s": round(now - p.start, 1)})
            self.stats.takeovers += 1
            for r in p.reps:
                self.free_range(r, p.size)
            del self.inflight[key]
        return promote

    def _make_key_room(self, key: str, now: float) -> None:
        """``--max_keys`` reached by a put of the new ``key``: evict least recently used
        objects (not leased, pinned, grouped, on the SSD tier, being offloaded or copied) until
        there is room, else -200. Puts in flight count once published (the bound may be passed
        by as many). Looks at the ``KEY_ROOM_SCAN`` least recently used objects at most: a put
        at the bound costs O(1) when the oldest can go (a read moves an object to the end),
        and never a walk over the whole table under the master's lock."""
        need = len(self.objects) - self.cfg.max_keys + 1
        victims: list[tuple[str, ObjectMeta]] = []
        busy, grouped, tier = self.tasks.busy, self.groups.of, self.tier
        for victim, meta in itertools.islice(self.objects.items(), KEY_ROOM_SCAN):
            if len(victims) >= need:
                break
            if meta.disk is not None or meta.soft is not None and meta.soft[0] > now or victim in busy \
                    or victim in grouped or not tier.evictable(meta, victim, now):
                continue  # (an object with a disk copy would stay a key: evicting it frees none)
            victims.append((victim, meta))
        if len(victims) < need:
            self.stats.key_limit_refusals += 1
            raise err(ErrorCode.NO_AVAILABLE_HANDLE, f"put {key!r}: the master holds {len(self.objects)} objects, "
                      f"the bound set by --max_keys={self.cfg.max_keys}, and none of the {KEY_ROOM_SCAN} least "
                      f"recently used can be evicted now (leased, pinned, grouped, on the SSD tier or being "
                      f"copied); raise --max_keys or remove objects")
        for victim, meta in victims:
            tier.drop_memory(victim, meta)
            tier.forget(victim)
            self.stats.key_limit_evictions += 1

    def upsert_start(self, client_id: str, key: str, size: int,
                     cfg: ReplicateConfigMsg | None = None) -> list[ReplicaDesc]:
        return self.put_start(client_id, key, size, cfg, upsert=True)

    def _allocate(self, key: str, size: int, cfg: ReplicateConfigMsg, now: float, writer: str = "") -> list[Rep]:
        segs = self.segments
        if self._closed_segs:
            segs = {n: s for n, s in segs.items() if s.status == 1}
            if not segs:
                self.stats.no_space += 1
                raise err(ErrorCode.NO_AVAILABLE_HANDLE, f"put {key!r}: every mounted segment is being drained "
                          f"or unmounted (no new allocation there); mount another segment")
        if now < self._holds_until:
            segs = {n: s for n, s in segs.items() if s.hold_until <= now}
            if not segs and self.segments:
                self.stats.no_space += 1
                wait = min(s.hold_until for s in self.segments.values()) - now
                raise err(ErrorCode.NO_AVAILABLE_HANDLE, f"put {key!r}: master recovering after a restart/"
                           f"failover; re-mounted segments take new allocations in {wait:.1f}s "
                           f"(--recovery_hold_ms) so that reads under leases of the previous master "
                           f"never see reused memory")
        if not segs:
            self.stats.no_space += 1
            raise err(ErrorCode.NO_AVAILABLE_HANDLE, f"put {key!r}: no memory segment is mounted "
                       f"(start a client with global_segment_size > 0)")
        if cfg.avoid_segments:
            avoid = set(cfg.avoid_segments)
            self.suspect.update(s.name for s in segs.values() if s.name in avoid)
            segs = self.without_avoided(segs, cfg)
            if not segs:
                self.stats.no_space += 1
                raise err(ErrorCode.NO_AVAILABLE_HANDLE, f"put {key!r}: no segment to place it on but "
                          f"{', '.join(map(repr, cfg.avoid_segments))}, which the writer could not reach a "
                          f"moment ago (its process stopped?); mount another segment or restart that one")
        largest = self._largest_seg
        if largest is None:
            largest = self._largest_seg = max(s.size for s in self.segments.values())
        if size > largest:
            raise err(ErrorCode.INVALID_PARAMS, f"put {key!r}: object of {size} bytes is larger than "
                       f"any mounted segment (largest {largest} bytes)")
        want = min(cfg.replica_num, len(segs))
        # reservations and quarantine are an optimisation: what they hold goes back first, and
        # while it could serve this put nobody's object is evicted for it (the put waits)
        reps = self.place(size, want, cfg.preferred_segments, segs, writer)
        if reps is None and self._reclaim(now):
            reps = self.place(size, want, cfg.preferred_segments, segs, writer)
        if reps is not None:
            return reps
        pending = reclaim_pending(self.inflight, self.clients.values(), segs, size, want, now,
                                  self.cfg.reservation_reclaim_s)
        if pending is not None:
            self.stats.reclaim_waits += 1
            raise SpaceReclaiming(key, want, size, *pending)
        for _ in range(64):
            if self.tier.evict(size * want, now) == 0:
                break
            reps = self.place(size, want, cfg.preferred_segments, segs, writer)
            if reps is not None:
                return reps
        self.stats.no_space += 1
        raise err(ErrorCode.NO_AVAILABLE_HANDLE, no_space_message(
            key, want, size, self.used, self.capacity,
            holdings(self.segments.values(), self.objects, self.inflight, self.clients.values(), self.graveyard, now)))

    def place(self, size: int, want: int, preferred: list[str], segs: dict[str, Segment],
              writer: str = "") -> list[Rep] | None:
        """Allocate ``want`` replicas of ``size`` bytes on distinct segments of ``segs``: the
        ``preferred`` ones first, then in ``--allocation_strategy`` order. None (nothing
        kept) when they do not all fit."""
        if want == 1 and not preferred and len(segs) == 1:
            for seg in segs.values():
                off = seg.alloc.allocate(size)
                return None if off is None else [(seg, off)]
            return None
        else:
            order = []
            for name in preferred or ():
                s = segs.get(name)
                if s is not None and s not in order:
                    order.append(s)
            rest = [s for s in segs.values() if s not in order]
            strategy = self.cfg.allocation_strategy
            if strategy == "free_ratio_first":
                rest.sort(key=lambda s: s.alloc.free_bytes / s.size, reverse=True)
            else:
                self.rng.shuffle(rest)
                if strategy == "local_first" and writer:
                    hosts = self._writer_hosts(writer)
                    rest.sort(key=lambda s: s.name.rsplit(":", 1)[0] not in hosts)  # stable: random within
            if self.suspect:
                suspect = self.suspect
                rest.sort(key=lambda s: s.name in suspect)  # stable: the strategy's order otherwise
            order.extend(rest)
        got: list[Rep] = []
        for seg in order:
            if seg.alloc.largest_free < size:
                continue
            off = seg.alloc.allocate(size)
            if off is not None:
                got.append((seg, off))
                if len(got) == want:
                    return got
        for r in got:
            self.free_range(r, size)
        return None

    def _writer_hosts(self, client_id: str) -> set[str]:
        """Hosts of the segments ``client_id`` mounted (a segment is named "host:port")."""
        c = self.clients.get(client_id)
        return {n.split("#", 1)[0].rsplit(":", 1)[0] for n in c.segments} if c is not None else set()

    def _new_version(self) -> int:
        """A version for a write published now (``VersionClock.next``)."""
        return self.versions.next()

    def put_end(self, client_id: str, key: str) -> int:
        """Publish a put. Returns the object's version (> 0) -- the writer keeps it to
        re-report the object after a master change, where the highest version of a key
        wins -- or 0 when this call published nothing (an idempotent retry, or a put that
        lost to an existing value)."""
        check_key(key)
        return self.put_end_one(client_id, key, self.clock())

    def put_end_one(self, client_id: str, key: str, now: float) -> int:
        p = self.inflight.get(key)
        if p is None:
            if key in self.objects:
                return 0  # already complete (idempotent retry)
            raise err(ErrorCode.OBJECT_NOT_FOUND, f"put_end {key!r}: no put in progress for this key")
        if p.client_id != client_id:
            raise err(ErrorCode.INVALID_PARAMS, f"put_end {key!r}: the put in progress belongs to client "
                       f"{p.client_id!r}, not {client_id!r} (taken over after a timeout?)")
        del self.inflight[key]
        old = self.objects.get(key)
        if old is not None:
            if p.promote and old.seg is None:
                old.set_reps(p.reps)
                self.objects[key] = self.objects.pop(key)
                self.reported.pop(key, None)
                return self._new_version()
            if not p.upsert:  # raced with another writer / a re-report: keep the old value
                for r in p.reps:
                    self.free_range(r, p.size)
                return 0
            self._notify_removed(key, old)
            self.drop_object(key, old, now)
        extra = None
        if p.hard or p.soft_ttl is not None:
            extra = Extra(p.hard, [now + p.soft_ttl, p.soft_ttl] if p.soft_ttl is not None else None)
        return self.publish(key, ObjectMeta(p.size, p.reps, extra), group=p.group)

    def publish(self, key: str, meta: ObjectMeta, run: list[str] | None = None, group: str = "") -> int:
        """Make ``meta`` the object readers find under ``key``: the one rule of every put
        (single, batch, into a reservation) -- the object table, forgetting a re-reported
        version of the key, the put counter, a "put" key event -- returning its version.
        ``run``: a batch's (``begin_run``): the version counts up from the batch's one clock
        reading, and the counter and events are added for the whole run by ``end_run``."""
        self.objects[key] = meta
        if self.reported:
            self.reported.pop(key, None)
        if group or self.groups:
            self.groups.set(key, group)
        if run is None:
            self.stats.puts += 1
            self.key_events.publish("put", key)
            return self.versions.next()
        run.append(key)
        return self.versions.following()

    def begin_run(self) -> list[str]:
        """Start a batch of ``publish`` calls (see there)."""
        self.versions.begin_run()
        return []

    def end_run(self, run: list[str]) -> None:
        self.stats.puts += len(run)
        self.key_events.publish_many("put", run)

    # ---------------------------------------------------------------- single puts in one round trip
    def put_commit(self, client_id: str, key: str, size: int, cfg: ReplicateConfigMsg | None, reserved: bool,
                   next_size: int) -> PutCommitReply:
        """``put_end`` of ``key`` and a *reservation* for the client's next single put, in one
        round trip; with ``reserved`` the put was written into the reservation the client
        held (no ``put_start``): it is published from there.

        Why: a single put otherwise costs two round trips (put_start, put_end), and on a
        loaded host each is a wake-up of the master and of the client. The reservation is
        the allocation the next put_start would make, made one put earlier with the same
        placement rules (``cfg``; never evicting for it): an in-flight put under a name of
        the client's own (``RESERVATION_PREFIX`` + client id), so every rule for in-flight
        puts (unmount, client expiry, release timeout, quarantine) covers it. At most one
        per client: a new one replaces (quarantines) the previous one. The client writes
        into a reservation only while it is young (``core.RESERVATION_MAX_AGE_S``, well
        within ``recovery_hold_s``: a master that restarted meanwhile does not know it and
        answers -704, and its hold keeps the range unused until such a late write is over).

        Codes: -705 when ``key`` exists or another put of it is in progress (the reservation
        stays, unchanged); -704 when the client holds no reservation; -600 when the
        reservation does not fit this put (size, pinning)."""
        check_key(key)
        cfg = cfg or ReplicateConfigMsg()
        self.check_cfg(cfg, key)
        now = self.clock()
        if reserved:
            version = self._commit_reserved(client_id, key, size, cfg, now)
        else:
            version = self.put_end_one(client_id, key, now)
        if cfg.group_ids and version > 0:
            self.groups.set(key, self._group(cfg, [key])[0])
        reps = self._reserve(client_id, next_size, cfg, now) if next_size else []
        return PutCommitReply(version, [ReplicaDesc(seg.name, seg.base + off, next_size, "memory", "", "processing")
                                        for seg, off in reps], self.epoch)

    def _commit_reserved(self, client_id: str, key: str, size: int, cfg: ReplicateConfigMsg, now: float) -> int:
        rk = RESERVATION_PREFIX + client_id
        p = self.inflight.get(rk)
        if p is None or p.client_id != client_id:
            raise err(ErrorCode.OBJECT_NOT_FOUND, f"put_commit {key!r}: client {client_id!r} holds no reservation "
                       f"(released, or the master changed)")
        if p.size != size or p.hard != bool(cfg.with_hard_pin) or p.soft_ttl != self.soft_ttl(cfg):
            raise err(ErrorCode.INVALID_PARAMS, f"put_commit {key!r}: the reservation ({p.size} bytes) does not "
                       f"fit this put ({size} bytes, or other pinning)")
        promote = self.claim(key, size, False, now)
        del self.inflight[rk]
        self.inflight[key] = PendingPut(client_id, p.size, p.reps, now, False, promote, p.hard, p.soft_ttl)
        return self.put_end_one(client_id, key, now)

    def _reserve(self, client_id: str, size: int, cfg: ReplicateConfigMsg, now: float) -> list[Rep]:
        """Allocate the client's next reservation (replacing its previous one); [] when
        there is no room without evicting, or ``size`` is not a positive int."""
        rk = RESERVATION_PREFIX + client_id
        old = self.inflight.pop(rk, None)
        if old is not None:
            self.quarantine_ranges(client_id, old.reps, old.size)
        if size.__class__ is not int or size <= 0:
            return []
        reps: list[Rep] | None = None
        direct = self.direct_target(cfg, now)
        if direct is not None:
            off = direct.alloc.allocate(size) if size <= direct.size else None
            reps = None if off is None else [(direct, off)]
        else:
            segs = self.without_avoided(self.placeable(now), cfg)
            if segs:
                reps = self.place(size, min(cfg.replica_num, len(segs)), cfg.preferred_segments, segs)
        if reps and any(seg.alloc.free_bytes < size for seg, _ in reps):
            # a reservation never takes a segment's last room: others' puts come first
            for r in reps:
                self.free_range(r, size)
            reps = None
        if not reps:
            return []
        self.inflight[rk] = PendingPut(client_id, self.intern_size(size), reps, now, False, False,
                                       bool(cfg.with_hard_pin), self.soft_ttl(cfg))
        return reps

    def put_revoke(self, client_id: str, key: str) -> None:
        check_key(key)
        p = self.inflight.get(key)
        if p is None:
            raise err(ErrorCode.OBJECT_NOT_FOUND, f"put_revoke {key!r}: no put in progress for this key")
        if p.client_id != client_id:
            raise err(ErrorCode.INVALID_PARAMS, f"put_revoke {key!r}: the put in progress belongs to "
                       f"client {p.client_id!r}, not {client_id!r}")
        del self.inflight[key]
        self.quarantine_ranges(client_id, p.reps, p.size)

    @staticmethod
    def _batch(fn: Callable[..., object], keys: list[str], *args: list[Any]) -> list[Any]:
        out: list[Any] = []
        for i, k in enumerate(keys):
            try:
                r = fn(k, *(a[i] for a in args))
                out.append(0 if r is None else r)
            except MooncakeError as e:
                out.append(e.code)
        return out

    def batch_put_start(self, client_id: str, keys: list[str], sizes: list[int],
                        cfg: ReplicateConfigMsg | None = None, *, upsert: bool = False,
                        release: Iterable[int] = ()) -> Placements:
        """put_start of every key, packed (master_batch.put_starts); ``release`` as put_start's."""
        group = self._group(cfg, keys) if cfg is not None else []
        if release:
            self.release_reservations(client_id, release)
        placed = master_batch.put_starts(self, client_id, keys, sizes, cfg, upsert)
        if group:  # the keys placed are published in their groups
            for k, g, code in zip(keys, group, unpack(I32, placed.codes, len(keys), "codes")):
                if code == 0:
                    self.inflight[k].group = g
        return placed

    def batch_put_end(self, client_id: str, keys: list[str]) -> bytes:
        return master_batch.put_ends(self, client_id, keys)

    def batch_put_commit(self, client_id: str, keys: list[str], sizes: bytes, cfg: ReplicateConfigMsg | None,
                         reserved: bool, next_sizes: bytes) -> BatchPutCommitReply:
        """batch_put_end plus a reservation for the client's next batch (master_batch.put_commits)."""
        group = self._group(cfg, keys) if cfg is not None else []
        reply = master_batch.put_commits(self, client_id, keys, sizes, cfg, reserved, next_sizes)
        if group:
            for k, g, version in zip(keys, group, unpack(I64, reply.versions, len(keys), "versions")):
                if version > 0:
                    self.groups.set(k, g)
        return reply

    def batch_put_revoke(self, client_id: str, keys: list[str]) -> bytes:
        return master_batch.put_revokes(self, client_id, keys)

    # ================================================================ reads
    def get_replica_list(self, key: str) -> GetReply:
        check_key(key)
        meta = self.objects.get(key)
        if meta is None:
            self.stats.misses += 1
            why = "put still in progress" if key in self.inflight else "no such object"
            raise err(ErrorCode.OBJECT_NOT_FOUND, f"get {key!r}: {why}")
        now = self.clock()
        ttl_ms = self.cfg.default_kv_lease_ttl_ms
        self.grant(key, meta, now, now + ttl_ms / 1000.0)
        return GetReply(self._descs(meta), ttl_ms, self.epoch, self.confirm_after_ms)

    def grant(self, key: str, meta: ObjectMeta, now: float, deadline: float) -> None:
        """A read lease on ``meta`` until ``deadline``; the object becomes the most recently used."""
        if deadline > meta.lease:
            meta.lease = deadline
        if self.groups:  # a read of one member leases the whole group
            for k in self.groups.group_of(key, self.objects) or ():
                m = self.objects[k]
                if deadline > m.lease:
                    m.lease = deadline
        extra = meta.extra
        if extra is not None:
            soft = extra.soft
            if soft is not None and now + soft[1] > soft[0]:
                soft[0] = now + soft[1]
            self.tier.touch(key)
        # LRU: move to the most-recently-used end
        del self.objects[key]
        self.objects[key] = meta
        self.stats.hits += 1

    def batch_get_replica_list(self, keys: list[str]) -> BatchGetReply:
        return master_batch.get_replica_lists(self, keys)

    def exist_key(self, key: str) -> bool:
        return key in self.objects

    def batch_exist_key(self, keys: list[str]) -> list[bool]:
        objs = self.objects
        return [k in objs for k in keys]

    def get_size(self, key: str) -> int:
        meta = self.objects.get(key)
        if meta is None:
            raise err(ErrorCode.OBJECT_NOT_FOUND, f"get_size {key!r}: no such object")
        return meta.size

    # ================================================================ removal
    def remove(self, key: str, force: bool = False) -> None:
        check_key(key)
        meta = self.objects.get(key)
        if meta is None:
            raise err(ErrorCode.OBJECT_NOT_FOUND, f"remove {key!r}: no such object")
        now = self.clock()
        if meta.lease > now and not force:
            self.stats.lease_refusals += 1
            raise err(ErrorCode.OBJECT_HAS_LEASE, f"remove {key!r}: object is leased to a reader for "
                       f"{meta.lease - now:.1f}s more (use force=True)")
        self.absent.bury(key, self._notify_removed(key, meta), now)
        self.drop_object(key, meta, now)

    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]:
        return self._batch(lambda k: self.remove(k, force), keys)

    def batch_replica_clear(self, keys: list[str], segment_name: str = "") -> list[str]:
        """Drop the replicas of ``keys`` on ``segment_name`` -- every replica when it is "" --
        of objects whose read leases have ended; an object left without any replica is
        removed. Returns the keys cleared; leased, missing keys and keys with no replica on
        that segment are skipped (the original's BatchReplicaClear)."""
        if not isinstance(segment_name, str):
            raise err(ErrorCode.INVALID_PARAMS, f"batch_replica_clear: segment_name must be a str, "
                      f"got {type(segment_name).__name__}")
        now = self.clock()
        cleared: list[str] = []
        for key in keys:
            meta = self.objects.get(key) if isinstance(key, str) else None
            if meta is None or meta.lease > now or self.tasks.busy.get(key) is not None:
                continue
            if not segment_name:
                self.absent.bury(key, self._notify_removed(key, meta), now)
                self.drop_object(key, meta, now)
                cleared.append(key)
                continue
            reps = meta.reps()
            on = [r for r in reps if r[0].name == segment_name]
            disk = meta.disk
            on_disk = disk is not None and disk.segment_name == segment_name
            if not on and not on_disk:
                continue
            if len(on) == len(reps) and (disk is None or on_disk):  # nothing would be left
                self.absent.bury(key, self._notify_removed(key, meta), now)
                self.drop_object(key, meta, now)
            else:
                if on:
                    meta.set_reps([r for r in reps if r[0].name != segment_name])
                    self.release_ranges(on, meta.size, 0.0, now)
                    self.notify_dropped(key, on[0][0])
                if on_disk:
                    self.tier.drop_disk(key, meta, 0.0)
            cleared.append(key)
        return cleared

    def remove_all(self, force: bool = False) -> int:
        """Drop every object; leased ones are skipped unless ``force`` (as :meth:`remove`)."""
        now = self.clock()
        n = 0
        for key, meta in list(self.objects.items()):
            if meta.lease > now and not force:
                continue
            self.absent.bury(key, self._notify_removed(key, meta, everything=force), now)  # leased ones stay listed
            self.drop_object(key, meta, now)
            n += 1
        return n

    def remove_by_regex(self, pattern: str, force: bool = False) -> int:
        """Drop objects whose key matches ``pattern`` (re.search); leased ones only with ``force``.
        Matching is bounded by ``cfg.regex_budget_s`` (a backtracking pattern must not freeze
        the master: see utils/bounded_regex.py); over budget -> -600 and nothing removed."""
        try:
            keys = bounded_regex.matching(list(self.objects), pattern, self.cfg.regex_budget_s,
                                          what="remove_by_regex: pattern")
        except bounded_regex.PatternError as e:
            raise err(ErrorCode.INVALID_PARAMS, str(e)) from None
        now = self.clock()
        n = 0
        for key in keys:
            meta = self.objects.get(key)
            if meta is not None and (force or meta.lease <= now):
                self.absent.bury(key, self._notify_removed(key, meta), now)
                self.drop_object(key, meta, now)
                n += 1
        return n

    # ================================================================ SSD tier (the Tier's)
    def offload_done(self, client_id: str, key: str, path: str, size: int) -> None:
        self.tier.offload_done(client_id, key, path, size)

    def offload_failed(self, client_id: str, key: str) -> None:
        self.tier.offload_failed(client_id, key)

    # ================================================================ periodic work
    def tick(self) -> None:
        """Time-driven rules; the server calls this a few times per second."""
        now = self.clock()
        ttl = self.cfg.client_ttl_s
        if self.reported and now > self.reported_until:
            self.reported = {}  # recovery settled: objects found here now beat any late report
        self.absent.prune(now)
        for cid, c in list(self.clients.items()):
            if now - c.last_seen > ttl:
                lost = 0
                had_segments = bool(c.segments)
                for name in list(c.segments):
                    seg = self.segments.get(name)
                    if seg is not None and seg.client_id == cid:
                        lost += self._unmount(seg, now, "expire")
                for key, p in list(self.inflight.items()):
                    if p.client_id == cid:
                        self.quarantine_ranges(cid, p.reps, p.size)
                        del self.inflight[key]
                del self.clients[cid]
                self.tasks.client_gone(cid)
                if had_segments or c.removed or c.removed_all_before:
                    # it may come back and re-report: keep what it missed, remember removals
                    self.absent.expired(cid, now, c.removed, c.removed_all_before)
                self.stats.expired_clients += 1
                log.warning("client expired: no heartbeat within client_ttl",
                            extra={"client": cid, "client_ttl_s": ttl, "objects_lost": lost})
        if self.lease_floor:
            for name in [k for k, t in self.lease_floor.items() if t <= now]:
                del self.lease_floor[name]
        if self.reserved:
            for name in [k for k, v in self.reserved.items() if max(u for u, _, _ in v) <= now]:
                del self.reserved[name]
        while self.graveyard and self.graveyard[0][0] <= now:
            _, _, seg, off, size = heapq.heappop(self.graveyard)
            self.free_range((seg, off), size)
        rel = self.cfg.put_start_release_timeout_s
        for key, p in list(self.inflight.items()):
            if now - p.start > rel:
                self.quarantine_ranges(p.client_id, p.reps, p.size)
                del self.inflight[key]
        self.tier.expire_offloads(now)
        if self.tasks.queued or self.tasks.running or self.tasks.jobs:
            self.tasks.tick(now)
        cap = self.capacity
        if cap and self.used - self.tier.offloading_bytes() - sum(self.reclaimable().values()) \
                >= self.cfg.eviction_high_watermark_ratio * cap:  # space reclaimable is not pressure
            self.tier.evict(0, now)
        self.tier.enforce_disk_quota(now)

    def watch_keys(self, after: int, prefix: str = "", limit: int = 0, epoch: int = 0) -> KeyEventsReply:
        """Key events after cursor ``after``, or a snapshot on a gap (key_events.watch_reply)."""
        return watch_reply(self.key_events, self.objects, self.epoch, after, prefix, limit, epoch)

    def take_file_deletes(self) -> list[str]:
        """Paths (relative to root_fs_dir) whose files may be deleted now."""
        return self.tier.take_file_deletes(self.clock())
