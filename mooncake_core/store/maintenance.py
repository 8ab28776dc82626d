"""Background work of a store client: heartbeat, re-mount after a master change, SSD-tier
offload and promotion of disk hits.

Why threads of their own: a client silent for the master's ``client_ttl`` loses its segment,
so nothing slow (writing offload files, promoting a big object) may run on the heartbeat
thread; each job has its own queue and thread, and all of them stop before the segment
memory is unmapped.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from mooncake_core import envs
from mooncake_core.errors import MooncakeError
from mooncake_core.store.codes import NO_HANDLE
from mooncake_core.store.memory import bytes_addr, fingerprint
from mooncake_core.store.offload import offload_relpath
from mooncake_core.store.protocol import HeartbeatReply, OffloadTask
from mooncake_core.store.replica_tasks import ReplicaTaskRunner
from mooncake_core.store.types import ReplicateConfig
from sortedcontainers import SortedDict
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.progress import Progress, log_sink

if TYPE_CHECKING:
    from mooncake_core.store.internals import StoreInternals

__all__ = ["Maintenance", "heartbeat_interval_s"]

log = get_logger("mooncake.store.client")

#: seconds between the progress lines of a long offload sweep or re-mount check
PROGRESS_S = 2.0


def heartbeat_interval_s() -> float:
    """``MC_STORE_HEARTBEAT_INTERVAL`` seconds between heartbeats (default 1.0)."""
    return envs.MC_STORE_HEARTBEAT_INTERVAL


class Maintenance:
    """The background threads of one store client (started by ``setup``, stopped by ``close``)."""

    def __init__(self, core: StoreInternals) -> None:
        self.core = core
        self._hb_thread: threading.Thread | None = None
        self._hb_stop = threading.Event()
        self._remount_pending = False
        self._promote_q: queue.Queue[tuple[str, bytes, int] | None] | None = None
        self._offload_q: queue.Queue[OffloadTask | None] | None = None
        self._offload_thread: threading.Thread | None = None
        self._offload_pending: set[str] = set()
        #: copy/move tasks and drain units the master hands us (we hold their source replicas)
        self.replica_tasks = ReplicaTaskRunner(core)  # type: ignore[arg-type]
        #: called after a re-mount at a new master (segments mounted with mount_segment go again)
        self.after_remount: list[Callable[[], None]] = []

    def start(self) -> None:
        self._hb_stop.clear()
        self._hb_thread = threading.Thread(target=self._heartbeat_loop, name="mooncake-store-heartbeat",
                                           daemon=True)
        self._hb_thread.start()

    def stop(self) -> None:
        """Stop every thread (the caller then unmaps memory they might touch)."""
        if self._promote_q is not None:
            try:
                self._promote_q.put_nowait(None)
            except queue.Full:
                pass
            self._promote_q = None
        self._hb_stop.set()
        t = self._hb_thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10)
        self._hb_thread = None
        self.replica_tasks.stop()
        if self._offload_q is not None:
            self._offload_q.put(None)
            if self._offload_thread is not None and self._offload_thread is not threading.current_thread():
                self._offload_thread.join(timeout=30)
            self._offload_q = None
            self._offload_thread = None

    # ------------------------------------------------------------------ heartbeat
    def _heartbeat_loop(self) -> None:
        failures = 0
        interval = heartbeat_interval_s()
        while not self._hb_stop.wait(interval):
            try:
                master = self.core.master
            except MooncakeError:
                return  # closed
            try:
                reply = master.heartbeat(self.core.client_id, self.core.stale_reservations())
            except MooncakeError as e:
                failures += 1
                if failures == 1 or failures % 30 == 0:
                    log.warning("heartbeat to master failed (%d in a row): %s", failures, e)
                continue
            except Exception as e:  # noqa: BLE001 - the thread must survive anything
                failures += 1
                log.warning("heartbeat error: %r", e)
                continue
            if failures:
                log.info("master reachable again after %d failed heartbeats", failures)
            failures = 0
            try:
                self._follow_up(reply)
            except MooncakeError as e:
                log.warning("heartbeat follow-up failed: %s", e)
            except Exception:
                log.exception("heartbeat follow-up error")

    def _follow_up(self, reply: HeartbeatReply) -> None:
        # the master says "need_remount" once (on our first call after its restart);
        # remember it until the re-mount and re-report really went through
        if reply.need_remount:
            self._remount_pending = True
        # removals first: a master that expired us sends what was removed meanwhile with its
        # need_remount, and those objects must not be re-reported
        if reply.removed or reply.removed_all_before:
            self.core.owned.discard_removed(reply.removed, reply.removed_all_before)
        if self._remount_pending:
            self._remount()
            self._remount_pending = False
        if reply.offload_tasks:
            self._queue_offload(reply.offload_tasks)
        if reply.replica_tasks:
            self.replica_tasks.submit(reply.replica_tasks)

    def _remount(self) -> None:
        """After a master restart/failover: mount again and re-report objects we own whose
        memory provably still holds what we wrote (fingerprint check, newest wins on overlap).

        Fingerprints are checked *before* mounting: once mounted, the new master may hand our
        ranges to other writers; the report follows the mount immediately and the master
        refuses any reported range it has meanwhile allocated, so a lost race loses the
        object (it is a cache) but never publishes foreign bytes under our key."""
        core = self.core
        if core.segment is None:
            return
        taken = SortedDict()  # start -> end of the ranges reported so far (never overlapping)
        report = []
        versions: list[int] = []
        stale = []
        entries = core.owned.newest_first()
        check = Progress("re-mount: checking owned objects", len(entries), unit="objects", every_s=PROGRESS_S,
                         sink=log_sink(log))
        for e in entries:
            check.add()
            r = e.replica
            lo, hi = r.addr, r.addr + r.size
            i = taken.bisect_left(hi) - 1  # the reported range starting last before hi
            if (i >= 0 and taken.peekitem(i)[1] > lo) or fingerprint(r.addr, r.size) != e.fingerprint:
                stale.append(e)
                continue
            taken[lo] = hi
            report.append((e.key, r))
            versions.append(e.version)
        core.mount()
        accepted = core.master.report_objects(core.client_id, report, versions) if report else 0
        core.owned.discard_entries(stale)
        for hook in self.after_remount:
            hook()
        log.info("re-mounted segment after master change", extra={"segment": core.segment_name,
                                                                    "reported": len(report),
                                                                    "accepted": accepted,
                                                                    "dropped": len(stale)})

    # ------------------------------------------------------------------ SSD-tier offload
    def _queue_offload(self, tasks: list[OffloadTask]) -> None:
        """Offload tasks run on their own thread: writing files must never delay heartbeats
        (a client silent for ``client_ttl`` loses its segment)."""
        with self.core.lock:
            q = self._offload_q
            if q is None:
                q = self._offload_q = queue.Queue()
                self._offload_thread = threading.Thread(target=self._offload_loop, args=(q,),
                                                        name="mooncake-store-offload", daemon=True)
                self._offload_thread.start()
        for t in tasks:
            if t.key not in self._offload_pending:
                self._offload_pending.add(t.key)
                q.put(t)

    def _offload_loop(self, q: queue.Queue[OffloadTask | None]) -> None:
        # a sweep: the tasks from the first after an idle queue until it idles again; one that
        # lasts logs its progress every PROGRESS_S (done/queued, objects/s, ETA, bytes, failed)
        sweep: Progress | None = None
        while True:
            try:  # a sweep ends once no task came for two heartbeats (tasks come with heartbeat replies)
                task = q.get(timeout=max(PROGRESS_S, 2 * heartbeat_interval_s())) if sweep is not None else q.get()
            except queue.Empty:
                if sweep is not None and sweep.reports:
                    sweep.finish()
                sweep = None
                continue
            if task is None:
                return
            if sweep is None:
                sweep = Progress("SSD offload sweep", unit="objects", every_s=PROGRESS_S, sink=log_sink(log))
            written = 0
            try:
                if self.core.ready:
                    written = self._run_offload(task)
            except MooncakeError as e:
                log.warning("offload of %r: %s", task.key, e)
            except Exception:
                log.exception("offload of %r failed", task.key)
            finally:
                self._offload_pending.discard(task.key)
            sweep.total = sweep.done + 1 + q.qsize()
            sweep.add(1, bytes=written, failed=0 if written else 1)

    def _run_offload(self, task: OffloadTask) -> int:
        """Write one object's file and tell the master; returns the bytes written (0: failed)."""

        core = self.core
        key, replica = task.key, task.replica
        seg = core.segment
        ok = False
        path = offload_relpath(key)
        if core.offload is None or seg is None:
            log.warning("offload task for %r but no SSD tier directory configured", key)
        elif not (seg.addr <= replica.addr and replica.addr + replica.size <= seg.addr + seg.size):
            log.warning("offload task for %r points outside our segment", key)
        else:
            try:
                core.offload.write_from(path, replica.addr, replica.size)
                ok = True
            except OSError as e:
                log.warning("offload of %r failed: %s", key, e)
        if ok:
            core.master.offload_done(core.client_id, key, path, replica.size)
        else:
            core.master.offload_failed(core.client_id, key)
        core.owned.discard([key])
        return replica.size if ok else 0

    # ------------------------------------------------------------------ promotion on hit
    def promote(self, key: str, data: bytes) -> None:
        """Promotion on hit: a disk-only object read back is put into memory again, in the
        background (the get does not wait for it). Memory may be full right now -- the
        eviction that makes room is itself an offload the owner performs within a heartbeat
        -- so a -200 is retried a few times."""
        with self.core.lock:
            q = self._promote_q
            if q is None:
                q = self._promote_q = queue.Queue(maxsize=256)
                threading.Thread(target=self._promote_loop, args=(q,), name="mooncake-store-promote",
                                 daemon=True).start()
        try:
            q.put_nowait((key, data, 0))
        except queue.Full:
            log.debug("promotion queue full, skipping %r", key)

    def _promote_loop(self, q: queue.Queue[tuple[str, bytes, int] | None]) -> None:
        while True:
            item = q.get()
            if item is None or not self.core.ready:
                return
            key, data, attempt = item
            try:
                rc = self.core.put_many([key], [[(bytes_addr(data), len(data))]], ReplicateConfig(),
                                        upsert=False, op="promote")[0]
            except Exception as e:  # noqa: BLE001 - promotion is best effort
                log.debug("promotion of %r failed: %s", key, e)
                continue
            if rc == NO_HANDLE and attempt < 8:
                time.sleep(0.25)
                try:
                    q.put_nowait((key, data, attempt + 1))
                except queue.Full:
                    pass
