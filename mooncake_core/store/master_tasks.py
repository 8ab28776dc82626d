"""Replica work the master plans and clients carry out: copy/move tasks and segment drains.

Pure (no sockets, clock injected through the state). The master stays off the data path:
a task is *assigned* to the client whose segment holds the source replica; the master
allocates the target ranges when that client's next heartbeat picks the task up (the reply
carries a ``ReplicaTask``), the client writes its local bytes into them with its Transfer
Engine and answers ``replica_task_done``; only then do the new replicas become visible (and,
for a move, the source replica goes -- its memory is reused only after the read leases that
may still point at it have ended).

Rules:

* **One task per key at a time**: a task whose key is busy waits (PENDING); a second move of
  the same replica then finds it gone and fails with a message, so concurrent moves of one
  key never lose or duplicate it.
* **The object stays put while copied**: picking a task up raises the object's lease to the
  task's deadline (eviction and a plain ``remove`` leave it alone; a forced remove parks the
  source range until then). An object removed or replaced meanwhile fails the task, and the
  target ranges are quarantined like those of a failed put.
* **Deadlines and limits** (the original's task-queue flags, ``MasterConfig``): a task not
  picked up within ``pending_task_timeout_s`` (its client is gone) or not answered within
  ``processing_task_timeout_s`` fails; ``create_*_task`` is refused with -1401 while
  ``max_total_pending_tasks`` wait; heartbeats hand out no more while
  ``max_total_processing_tasks`` run; the newest ``max_total_finished_tasks`` can be queried.
* **Drain** (the original's drain jobs, ``/api/v1/drain_jobs``): the drained segments take no
  new allocation (DRAINING); every object with a replica there either keeps a replica
  elsewhere (the drained one is dropped) or is moved to a target segment by a move task
  (``max_concurrency`` at a time). When none is left the segments are DRAINED; objects that
  could not be moved (no room anywhere) are counted as failed units and the job FAILED.

Status names and numbers follow the original (TaskStatus, TaskType, JobStatus, SegmentStatus).
"""

from __future__ import annotations

import uuid
from collections import deque
from typing import Callable, Iterable, Protocol

from mooncake_core.errors import ErrorCode
from mooncake_core.store.master_records import MasterConfig, ObjectMeta, PendingPut, Rep, Segment, err
from mooncake_core.store.protocol import ReplicaDesc, ReplicaTask, TaskInfo

__all__ = ["SegmentTable", "COPY", "MOVE", "PENDING", "PROCESSING", "SUCCESS", "FAILED", "JOB_STATUS", "SEGMENT_STATUS",
           "DrainJob", "ReplicaTasks"]

COPY, MOVE = 0, 1  #: TaskType REPLICA_COPY, REPLICA_MOVE
PENDING, PROCESSING, FAILED, SUCCESS = 0, 1, 2, 3  #: TaskStatus (the original's numbers)
#: JobStatus names by number (the original's enum order)
JOB_STATUS = ("CREATED", "PLANNING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELED")
#: SegmentStatus names by number (the original's enum order)
SEGMENT_STATUS = ("UNDEFINED", "OK", "DRAINING", "DRAINED", "GRACEFULLY_UNMOUNTING", "UNMOUNTING")
OK_STATUS = 1

#: most tasks one heartbeat reply hands out
MAX_PER_HEARTBEAT = 256


def _task_id(tid: object) -> tuple[int, int]:
    """``tid`` as a task-id key ((0, 0), which no task has, when it is not a pair of ints)."""
    if isinstance(tid, (tuple, list)) and len(tid) == 2 and all(isinstance(x, int) for x in tid):
        return (int(tid[0]), int(tid[1]))
    return (0, 0)


class SegmentTable(Protocol):
    """What the tasks use of ``master_state.MasterState``: segments, objects, puts in flight,
    and its rules for freeing ranges and closing segments."""

    cfg: MasterConfig
    clock: Callable[[], float]
    epoch: int
    segments: dict[str, Segment]
    objects: dict[str, ObjectMeta]
    inflight: dict[str, PendingPut]

    @staticmethod
    def desc(rep: Rep, size: int, status: str = "complete") -> ReplicaDesc: ...
    def is_mounted(self, seg: Segment) -> bool: ...
    def free_range(self, rep: Rep, size: int) -> None: ...
    def quarantine_ranges(self, writer: str, reps: Iterable[Rep], size: int) -> None: ...
    def release_ranges(self, reps: Iterable[Rep], size: int, not_before: float, now: float) -> None: ...
    def notify_dropped(self, key: str, seg: Segment) -> None: ...
    def set_segment_status(self, seg: Segment, status: int) -> None: ...
    def drop_reservations_in(self, names: set[str]) -> None: ...
    def unmount(self, seg: Segment) -> None: ...


class Task:
    __slots__ = ("tid", "kind", "key", "source", "targets", "status", "created_ms", "updated_ms", "client",
                 "message", "job", "reps", "src", "meta", "created", "deadline", "pre_lease")

    def __init__(self, tid: tuple[int, int], kind: int, key: str, source: str, targets: list[str], client: str,
                 now: float, wall_ms: int, job: DrainJob | None = None) -> None:
        self.tid = tid
        self.kind = kind
        self.key = key
        self.source = source  # the segment a move empties ("" for a copy: any replica of the client)
        self.targets = targets
        self.status = PENDING
        self.created_ms = self.updated_ms = wall_ms
        self.client = client  # who carries it out: the source segment's owner
        self.message = ""
        self.job = job
        self.reps: list[Rep] = []  # target ranges, once picked up
        self.src: Rep | None = None
        self.meta: ObjectMeta | None = None
        self.created = now
        self.deadline = 0.0
        self.pre_lease = 0.0

    def info(self) -> TaskInfo:
        return TaskInfo(self.tid, self.kind, self.status, self.created_ms, self.updated_ms, self.client, self.message)


class DrainJob:
    __slots__ = ("job_id", "segments", "targets", "max_concurrency", "status", "created_ms", "updated_ms",
                 "succeeded", "failed", "blocked", "migrated_bytes", "message", "backlog", "active", "given_up",
                 "unmount_by")

    def __init__(self, segments: list[str], targets: list[str], max_concurrency: int, wall_ms: int) -> None:
        self.job_id = str(uuid.uuid4())
        self.segments = segments
        self.targets = targets
        self.max_concurrency = max_concurrency
        self.status = 2  # RUNNING
        self.created_ms = self.updated_ms = wall_ms
        self.succeeded = self.failed = self.blocked = self.migrated_bytes = 0
        self.message = ""
        self.backlog: deque[str] = deque()
        self.active = 0
        self.given_up: set[str] = set()  # keys no target had room for
        #: a graceful unmount's: the segments go when the drain ends, or at this (monotonic) time
        self.unmount_by: float | None = None

    def describe(self) -> dict[str, object]:
        """The original's drain-job query answer (``/api/v1/drain_jobs/query``)."""
        return {"success": True, "job_id": self.job_id, "type": 0, "type_name": "DRAIN", "status": self.status,
                "status_name": JOB_STATUS[self.status], "created_at_ms_epoch": self.created_ms,
                "last_updated_at_ms_epoch": self.updated_ms, "segments": list(self.segments),
                "succeeded_units": self.succeeded, "failed_units": self.failed, "blocked_units": self.blocked,
                "active_units": self.active, "migrated_bytes": self.migrated_bytes, "message": self.message}


class ReplicaTasks:
    """Copy/move tasks and drain jobs of one ``MasterState`` (which calls in under its lock)."""

    def __init__(self, st: SegmentTable, wall_ms: Callable[[], int]) -> None:
        self.st = st
        self.wall_ms = wall_ms
        self.tasks: dict[tuple[int, int], Task] = {}
        self.queued: dict[str, deque[Task]] = {}  # client id -> its tasks not picked up yet
        self.busy: dict[str, Task] = {}  # key -> its task being carried out
        self.running: dict[tuple[int, int], Task] = {}
        self.finished: deque[tuple[int, int]] = deque()
        self.jobs: dict[str, DrainJob] = {}
        self._seq = 0
        self.n_pending = 0  # tasks not picked up yet (every client's)

    # ------------------------------------------------------------------ tasks
    def _new_id(self) -> tuple[int, int]:
        self._seq += 1
        return (self.st.epoch, self._seq)

    def _segment(self, name: str, what: str) -> Segment:
        seg = self.st.segments.get(name) if isinstance(name, str) else None
        if seg is None:
            raise err(ErrorCode.INVALID_PARAMS, f"{what}: segment {name!r} is not mounted "
                      f"(mounted: {', '.join(sorted(self.st.segments)[:8]) or 'none'})")
        return seg

    def _object(self, key: str, what: str) -> ObjectMeta:
        meta = self.st.objects.get(key)
        if meta is None:
            raise err(ErrorCode.OBJECT_NOT_FOUND, f"{what} {key!r}: no such object")
        return meta

    def create_copy(self, key: str, targets: list[str]) -> tuple[int, int]:
        """Plan a copy of ``key`` onto ``targets`` (segments already holding it are skipped).
        -704 for a missing key, -600 for an unknown target or a key with no memory replica."""
        what = "create_copy_task"
        if not isinstance(targets, list) or not targets:
            raise err(ErrorCode.INVALID_PARAMS, f"{what} {key!r}: targets must be a non-empty list of segment names")
        for name in targets:
            self._segment(name, f"{what} {key!r}")
        meta = self._object(key, what)
        reps = meta.reps()
        if not reps:
            raise err(ErrorCode.INVALID_PARAMS, f"{what} {key!r}: the object has no memory replica to copy from")
        self._check_room(what, key)
        return self._add(COPY, key, "", list(dict.fromkeys(targets)), reps[0][0].client_id).tid

    def create_move(self, key: str, source: str, target: str) -> tuple[int, int]:
        """Plan a move of ``key``'s replica on ``source`` to ``target``. -600 for an unknown
        segment or source == target, -704 for a missing key or no replica on ``source``."""
        what = "create_move_task"
        src = self._segment(source, f"{what} {key!r}")
        self._segment(target, f"{what} {key!r}")
        if source == target:
            raise err(ErrorCode.INVALID_PARAMS, f"{what} {key!r}: source and target are the same segment {source!r}")
        meta = self._object(key, what)
        if not any(s is src for s, _ in meta.reps()):
            raise err(ErrorCode.OBJECT_NOT_FOUND, f"{what} {key!r}: no replica on segment {source!r}")
        self._check_room(what, key)
        return self._add(MOVE, key, source, [target], src.client_id).tid

    def _check_room(self, what: str, key: str) -> None:
        limit = self.st.cfg.max_total_pending_tasks
        if self.n_pending >= limit:
            raise err(ErrorCode.TASK_PENDING_LIMIT_EXCEEDED, f"{what} {key!r}: {self.n_pending} tasks wait to be "
                      f"picked up, the bound set by --max_total_pending_tasks={limit}; try again later")

    def _add(self, kind: int, key: str, source: str, targets: list[str], client: str,
             job: DrainJob | None = None) -> Task:
        t = Task(self._new_id(), kind, key, source, targets, client, self.st.clock(), self.wall_ms(), job)
        self.tasks[t.tid] = t
        self.queued.setdefault(client, deque()).append(t)
        self.n_pending += 1
        if job is not None:
            job.active += 1
        return t

    def query(self, tid: tuple[int, int]) -> TaskInfo:
        t = self.tasks.get(_task_id(tid))
        if t is None:
            raise err(ErrorCode.TASK_NOT_FOUND, f"query_task: unknown task id {tid!r} (never created here, "
                      f"forgotten after --max_total_finished_tasks newer ones finished, or created by a "
                      f"master that has since restarted)")
        return t.info()

    def take(self, client_id: str, now: float) -> list[ReplicaTask]:
        """The tasks ``client_id``'s heartbeat picks up now, their target ranges allocated."""
        q = self.queued.get(client_id)
        if not q:
            return []
        out: list[ReplicaTask] = []
        waiting: deque[Task] = deque()
        room = self.st.cfg.max_total_processing_tasks - len(self.running)
        while q and len(out) < min(MAX_PER_HEARTBEAT, room):
            t = q.popleft()
            if t.status != PENDING:
                continue
            if t.key in self.busy:
                waiting.append(t)
                continue
            rt = self._start(t, now)
            if rt is not None:
                out.append(rt)
        waiting.extend(q)
        if waiting:
            self.queued[client_id] = waiting
        else:
            self.queued.pop(client_id, None)
        return out

    def _start(self, t: Task, now: float) -> ReplicaTask | None:
        st = self.st
        meta = st.objects.get(t.key)
        if meta is None:
            self._finish(t, FAILED, f"object {t.key!r} was removed before the task started")
            return None
        reps = meta.reps()
        if t.kind == MOVE:
            src = next((r for r in reps if r[0].key == t.source), None)
            if src is None:
                self._finish(t, FAILED, f"object {t.key!r} has no replica on {t.source!r} any more "
                                        f"(moved by another task, or the segment went away)")
                return None
        else:
            src = next((r for r in reps if r[0].client_id == t.client), None)
            if src is None:
                self._finish(t, FAILED, f"object {t.key!r} has no replica on client {t.client!r} any more")
                return None
        have = {s.key for s, _ in reps}
        wanted = [n for n in t.targets if n not in have]
        if not wanted:  # already where it should be: a copy has nothing to do, a move drops the source
            if t.kind == MOVE:
                self._drop_replica(t.key, meta, src, now)
            self._finish(t, SUCCESS, "already on the target segment(s)")
            return None
        got: list[Rep] = []
        for name in wanted:
            seg = st.segments.get(name)
            off = seg.alloc.allocate(meta.size) if seg is not None and seg.status == OK_STATUS else None
            if seg is None or off is None:
                for r in got:
                    st.free_range(r, meta.size)
                why = "is not mounted" if seg is None else (
                    f"is {SEGMENT_STATUS[seg.status]}" if seg.status != OK_STATUS else
                    f"has no free range of {meta.size} bytes")
                self._finish(t, FAILED, f"target segment {name!r} {why}", int(ErrorCode.NO_AVAILABLE_HANDLE))
                return None
            got.append((seg, off))
        t.reps, t.src, t.meta = got, src, meta
        t.status, t.updated_ms = PROCESSING, self.wall_ms()
        self.n_pending -= 1
        t.deadline = now + st.cfg.processing_task_timeout_s
        t.pre_lease = meta.lease
        meta.lease = max(meta.lease, t.deadline)  # not evicted or reused while copied
        self.busy[t.key] = t
        self.running[t.tid] = t
        return ReplicaTask(t.tid, t.key, st.desc(src, meta.size), [st.desc(r, meta.size, "processing") for r in got])

    def done(self, client_id: str, tid: tuple[int, int], ok: bool, message: str) -> None:
        """The executing client's answer. Late or foreign answers change nothing."""
        t = self.running.get(_task_id(tid))
        if t is None or t.client != client_id:
            return
        st = self.st
        now = st.clock()
        meta = st.objects.get(t.key)
        size = t.meta.size if t.meta is not None else 0
        if not ok or meta is None or meta is not t.meta or t.src not in meta.reps():
            st.quarantine_ranges(client_id, t.reps, size)
            why = message if not ok else f"object {t.key!r} was removed or replaced during the task"
            self._finish(t, FAILED, why or "the client could not write the replica")
            return
        reps = meta.reps() + [r for r in t.reps if st.is_mounted(r[0])]
        meta.lease = max(t.pre_lease, now + st.cfg.default_kv_lease_ttl_ms / 1000.0)  # readers since: covered
        meta.set_reps(reps)
        if t.kind == MOVE and t.src is not None:
            self._drop_replica(t.key, meta, t.src, now)
        if t.job is not None:
            t.job.migrated_bytes += size
        self._finish(t, SUCCESS, "")

    def _drop_replica(self, key: str, meta: ObjectMeta, rep: Rep, now: float) -> None:
        """Take one memory replica off an object that keeps another; its range is reused once
        the leases that may point at it have ended. Its owner stops re-reporting the key."""
        st = self.st
        meta.set_reps([r for r in meta.reps() if r != rep])
        st.release_ranges([rep], meta.size, meta.lease, now)
        st.notify_dropped(key, rep[0])

    def _finish(self, t: Task, status: int, message: str, code: int = 0) -> None:
        if t.status == PENDING:
            self.n_pending -= 1
        t.status, t.message, t.updated_ms = status, message, self.wall_ms()
        if self.busy.get(t.key) is t:
            del self.busy[t.key]
        self.running.pop(t.tid, None)
        job = t.job
        if job is not None:
            job.active -= 1
            if status == SUCCESS:
                job.succeeded += 1
            else:
                job.failed += 1
                job.message = f"{t.key!r}: {message}"
            job.updated_ms = t.updated_ms
        self.finished.append(t.tid)
        while len(self.finished) > self.st.cfg.max_total_finished_tasks:
            self.tasks.pop(self.finished.popleft(), None)

    def client_gone(self, client_id: str) -> None:
        """Its queued tasks fail now; running ones at their deadline (their ranges are in
        segments that may still be written)."""
        q = self.queued.pop(client_id, None)
        for t in q or ():
            if t.status == PENDING:
                self._finish(t, FAILED, f"client {client_id!r} that holds the source went away")

    # ------------------------------------------------------------------ drain jobs
    def create_drain(self, segments: list[str], targets: list[str], max_concurrency: int) -> DrainJob:
        what = "create drain job"
        if not isinstance(segments, list) or not segments or not all(isinstance(s, str) for s in segments):
            raise err(ErrorCode.INVALID_PARAMS, f"{what}: 'segments' must be a non-empty list of segment names")
        if not isinstance(targets, list) or not all(isinstance(s, str) for s in targets):
            raise err(ErrorCode.INVALID_PARAMS, f"{what}: 'target_segments' must be a list of segment names")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 0:
            raise err(ErrorCode.INVALID_PARAMS, f"{what}: 'max_concurrency' must be an int >= 0 (0: default)")
        segs = [self.st.segments.get(n) for n in segments]
        missing = [n for n, s in zip(segments, segs) if s is None]
        if missing:
            raise err(ErrorCode.SEGMENT_NOT_FOUND, f"{what}: segment(s) {missing} are not mounted")
        for n in targets:
            self._segment(n, what)
            if n in segments:
                raise err(ErrorCode.INVALID_PARAMS, f"{what}: segment {n!r} is both drained and a target")
        for s in segs:
            assert s is not None
            if s.status != OK_STATUS:
                raise err(ErrorCode.INVALID_PARAMS, f"{what}: segment {s.name!r} is {SEGMENT_STATUS[s.status]} already")
        job = DrainJob(list(segments), list(targets), max_concurrency or 64, self.wall_ms())
        for s in segs:
            assert s is not None
            self.st.set_segment_status(s, 2)  # DRAINING: readable, no new allocation
        self.st.drop_reservations_in(set(segments))  # a reservation there would publish into it later
        job.backlog.extend(self._keys_on(set(segments)))
        self.jobs[job.job_id] = job
        return job

    def _keys_on(self, names: set[str]) -> list[str]:
        return [k for k, m in self.st.objects.items() if any(s.key in names for s, _ in m.reps())]

    def unmount_gracefully(self, seg: Segment, grace_s: float) -> DrainJob:
        """``seg`` takes no new allocation (GRACEFULLY_UNMOUNTING) and is drained onto any
        other segment; it is unmounted when that is done or after ``grace_s``."""
        for job in self.jobs.values():  # a drain already running on it: end it into the unmount
            if job.status == 2 and seg.key in job.segments:
                job.unmount_by = self.st.clock() + grace_s
                self.st.set_segment_status(seg, 4)
                return job
        if seg.status != OK_STATUS:
            self.st.set_segment_status(seg, OK_STATUS)
        job = self.create_drain([seg.key], [], 0)
        self.st.set_segment_status(seg, 4)
        job.unmount_by = self.st.clock() + grace_s
        return job

    def query_drain(self, job_id: str) -> DrainJob:
        job = self.jobs.get(job_id)
        if job is None:
            raise err(ErrorCode.OBJECT_NOT_FOUND, f"drain job {job_id!r} not found")
        return job

    def cancel_drain(self, job_id: str) -> DrainJob:
        job = self.query_drain(job_id)
        if job.status == 2:
            job.status, job.updated_ms, job.message = 5, self.wall_ms(), "canceled"
            job.backlog.clear()
            for t in list(self.tasks.values()):
                if t.job is job and t.status == PENDING:
                    self._finish(t, FAILED, "drain job canceled")
            self._release_segments(job, OK_STATUS)
        return job

    def segment_status(self, name: str) -> int:
        seg = self.st.segments.get(name)
        if seg is None:
            raise err(ErrorCode.SEGMENT_NOT_FOUND, f"segment {name!r} is not mounted")
        return seg.status

    def _unmount_segments(self, job: DrainJob) -> None:
        for n in job.segments:
            seg = self.st.segments.get(n)
            if seg is not None:
                self.st.unmount(seg)

    def _release_segments(self, job: DrainJob, status: int) -> None:
        for n in job.segments:
            seg = self.st.segments.get(n)
            if seg is not None:
                self.st.set_segment_status(seg, status)

    def tick(self, now: float) -> None:
        """Deadlines of tasks; drain jobs plan their next units and finish."""
        if self.running:
            for t in [t for t in self.running.values() if now > t.deadline]:
                self.st.quarantine_ranges(t.client, t.reps, t.meta.size if t.meta is not None else 0)
                self._finish(t, FAILED, f"client {t.client!r} did not answer within "
                                        f"--processing_task_timeout_sec={self.st.cfg.processing_task_timeout_s:.0f}")
        wait_s = self.st.cfg.pending_task_timeout_s
        for q in list(self.queued.values()) if wait_s > 0 else ():
            while q and q[0].status == PENDING and now - q[0].created > wait_s:
                t = q.popleft()
                self._finish(t, FAILED, f"client {t.client!r} did not pick the task up within "
                                        f"--pending_task_timeout_sec={wait_s:.0f}")
        for job in self.jobs.values():
            if job.status != 2:
                continue
            if job.unmount_by is not None and now >= job.unmount_by:  # grace period over: go as it is
                job.status, job.updated_ms = (3 if job.failed == 0 and not job.backlog and not job.active else 4), \
                    self.wall_ms()
                job.message = job.message or "grace period over before every object was moved"
                job.backlog.clear()
                for t in [t for t in self.tasks.values() if t.job is job and t.status == PENDING]:
                    self._finish(t, FAILED, "the segment was unmounted (grace period over)")
                self._unmount_segments(job)
                continue
            self._plan(job, now)

    def _plan(self, job: DrainJob, now: float) -> None:
        st = self.st
        names = set(job.segments)
        while job.active < job.max_concurrency:
            if not job.backlog:
                if job.active or self._puts_into(names):
                    return  # wait: a running move, or a put that publishes into the segment later
                job.backlog.extend(k for k in self._keys_on(names) if k not in job.given_up)
                if job.backlog:
                    continue
                if job.given_up and job.unmount_by is not None and now < job.unmount_by:
                    # an unmount's grace period is still running: room may free up, try those again
                    job.failed -= len(job.given_up)
                    job.blocked -= len(job.given_up)
                    job.given_up.clear()
                    return
                job.status = 3 if job.failed == 0 else 4  # SUCCEEDED / FAILED
                job.updated_ms = self.wall_ms()
                if job.failed:
                    job.message = f"{job.failed} object(s) could not be moved off the segment(s); last: {job.message}"
                if job.unmount_by is not None:
                    self._unmount_segments(job)
                else:
                    self._release_segments(job, 3 if job.failed == 0 else OK_STATUS)  # DRAINED, or back in use
                return
            key = job.backlog.popleft()
            meta = st.objects.get(key)
            if meta is None:
                continue
            reps = meta.reps()
            on = [r for r in reps if r[0].key in names]
            if not on:
                continue
            if key in self.busy:  # a copy/move of it runs: plan it again after that
                job.backlog.append(key)
                return
            if len(on) < len(reps):  # another replica stays: drop the drained one(s), nothing to move
                for r in on:
                    self._drop_replica(key, meta, r, now)
                job.succeeded += 1
                job.updated_ms = self.wall_ms()
                continue
            target = self._pick_target(job, meta.size)
            if target is None:
                job.failed += 1
                job.blocked += 1
                job.given_up.add(key)
                job.message = f"{key!r}: no target segment has a free range of {meta.size} bytes"
                continue
            src = on[0]
            self._add(MOVE, key, src[0].key, [target.key], src[0].client_id, job)

    def _pick_target(self, job: DrainJob, size: int) -> Segment | None:
        names = job.targets or [n for n, s in self.st.segments.items() if s.status == OK_STATUS]
        best: Segment | None = None
        for n in names:
            s = self.st.segments.get(n)
            if s is not None and s.status == OK_STATUS and s.alloc.largest_free >= size \
                    and (best is None or s.alloc.free_bytes > best.alloc.free_bytes):
                best = s
        return best

    def _puts_into(self, names: set[str]) -> bool:
        """Whether a put in flight writes into one of ``names`` (it is published later)."""
        return any(s.key in names for p in self.st.inflight.values() for s, _ in p.reps)
