"""The client's side of copy/move tasks and drains: write replicas the master asked for.

The master (``master_tasks``) assigns a task to the client whose segment holds the source
replica and hands it over with a heartbeat reply, target ranges already allocated. This
runner writes the local bytes into those ranges with the store's own write path (one
``batch_transfer_sync_write`` per target segment for everything one reply brought) and
answers ``replica_task_done`` per task. It has its own thread: a heartbeat must never wait
for a transfer (a client silent for ``client_ttl`` loses its segment).
"""

from __future__ import annotations

import queue
import threading
from typing import Protocol

import numpy as np

from mooncake_core.errors import MooncakeError
from mooncake_core.store.master_client import MasterClient
from mooncake_core.store.protocol import ReplicaDesc, ReplicaTask
from mooncake_core.store.local_view import SegmentView
from mooncake_core.utils.log import get_logger

__all__ = ["ReplicaTaskRunner"]

log = get_logger("mooncake.store.client")


class _Writer(Protocol):
    client_id: str
    ready: bool
    #: our segment's name and memory, and memory mounted besides it (source replicas lie there)
    local: SegmentView

    @property
    def master(self) -> MasterClient: ...

    def write_replicas(self, jobs: list[tuple[list[tuple[int, int]], int, ReplicaDesc]],
                       skip: set[str] | None = None) -> None: ...

    def enter(self, what: str) -> None: ...

    def exit(self) -> None: ...


class ReplicaTaskRunner:
    """Started on the first task; ``stop`` before the segment memory goes away."""

    def __init__(self, core: _Writer) -> None:
        self.core = core
        self._q: queue.Queue[list[ReplicaTask] | None] | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: held while a batch of tasks reads from our memory: memory leaving the pool
        #: (``PoolApi``'s unmounts) takes it before it is unmapped
        self.busy = threading.Lock()

    def submit(self, tasks: list[ReplicaTask]) -> None:
        with self._lock:
            if self._q is None:
                self._q = queue.Queue()
                self._thread = threading.Thread(target=self._loop, args=(self._q,), name="mooncake-store-tasks",
                                                daemon=True)
                self._thread.start()
            self._q.put(list(tasks))

    def stop(self) -> None:
        with self._lock:
            q, t = self._q, self._thread
            self._q = self._thread = None
        if q is not None:
            q.put(None)
        if t is not None and t is not threading.current_thread():
            t.join(timeout=30)

    def _loop(self, q: queue.Queue[list[ReplicaTask] | None]) -> None:
        while True:
            tasks = q.get()
            if tasks is None:
                return
            try:
                self.core.enter("replica task")
            except MooncakeError:
                return  # closing: the master fails the tasks at their deadline
            try:
                with self.busy:
                    self._run(tasks)
            except Exception:  # noqa: BLE001 - the thread must survive anything
                log.exception("replica tasks failed")
            finally:
                self.core.exit()

    def _source_problem(self, t: ReplicaTask) -> str:
        """Why the source replica is not in memory this client owns ("" when it is)."""
        src = t.source
        local = self.core.local
        if src.segment_name != local.name:
            return f"source replica of {t.key!r} is on {src.segment_name!r}, not in this client's segments"
        if not local.holds(np.array([src.addr], np.int64), np.array([src.size], np.int64)):
            return f"source replica of {t.key!r} lies outside this client's segments"
        return ""

    def _run(self, tasks: list[ReplicaTask]) -> None:
        ok: list[ReplicaTask] = []
        results: dict[tuple[int, int], tuple[bool, str]] = {}
        for t in tasks:
            why = self._source_problem(t)
            if why:
                results[t.task_id] = (False, why)
            else:
                ok.append(t)
        if ok:
            try:  # everything this reply brought in one go (one batch per target segment)
                self.core.write_replicas([([(t.source.addr, t.source.size)], t.source.size, r)
                                          for t in ok for r in t.targets])
                for t in ok:
                    results[t.task_id] = (True, "")
            except MooncakeError:
                for t in ok:  # one target failed the batch: find out which task by task
                    try:
                        self.core.write_replicas([([(t.source.addr, t.source.size)], t.source.size, r)
                                                  for r in t.targets])
                        results[t.task_id] = (True, "")
                    except MooncakeError as e:
                        results[t.task_id] = (False, f"write of {t.key!r} failed: {e}")
        master = self.core.master
        for t in tasks:
            done, why = results[t.task_id]
            try:
                master.replica_task_done(self.core.client_id, t.task_id, done, why)
            except MooncakeError as e:
                log.warning("replica task %s of %r: could not report to the master: %s", t.task_id, t.key, e)
