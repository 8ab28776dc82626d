"""Pool management methods of the store client: copy/move tasks, replica clearing, more
memory for the pool.

``PoolApi`` is a delegate of ``MooncakeDistributedStore`` (the original's names, argument
order and return conventions; typed against ``StoreInternals``):

* ``create_copy_task(key, targets)`` / ``create_move_task(key, source, target)`` ->
  ``(task_id, code)``: the master plans the task and the client holding the source replica
  carries it out (``master_tasks``, ``replica_tasks``); ``query_task(task_id)`` ->
  ``(QueryTaskResponse | None, code)``. Codes: -704 missing key, -600 unknown segment or task.
* ``batch_replica_clear(keys, segment_name="")``: the keys whose replicas on that segment
  (all of them when "") were dropped; leased keys are skipped.
* ``mount_segment(path, size, offset=0, protocol, location)`` (a file's pages, shared mmap) and
  ``allocate_and_mount_segment(size, ...)`` (anonymous memory, rounded up to 4 MiB) give the
  pool more memory of this client: ``{"ret": 0, "segment_ids": [id], ...}`` (ret -1 and no ids
  on failure). ``unmount_segment`` / ``unmount_and_free_segment(segment_ids,
  grace_period_seconds=0)``: 0, or -1 for an id this client did not mount that way. With a
  grace period the segment first takes no new allocation and is drained (its objects moved, or
  left on their other replicas) and goes when that is done or the grace period is over (at
  once without one: its replicas are dropped); either way its memory is unmapped once the
  master let it go and the read leases on it ended. Objects in such memory are not re-reported
  after a master change (the main segment's are): they are lost then, as a cache may be. The
  ``protocol`` argument is accepted as the original's: the Transfer Engine picks the transport
  per peer.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store.internals import StoreInternals
from mooncake_core.store.segment import StoreSegment
from mooncake_core.store.types import QueryTaskResponse
from mooncake_core.store.validate import check_key, check_keys
from mooncake_core.utils.log import get_logger

__all__ = ["PoolApi"]

log = get_logger("mooncake.store.pool_api")

NO_TASK = (0, 0)
#: allocate_and_mount_segment rounds sizes up to this (the original's slab size)
SLAB = 4 << 20
#: how often a graceful unmount asks the master whether the segment is gone
UNMOUNT_POLL_S = 0.2


@dataclass
class _Mount:
    """Memory this client mounted besides its main segment."""

    segment_id: str
    kind: str  # "file" (mount_segment) or "alloc" (allocate_and_mount_segment)
    addr: int
    size: int
    memory: Any  # the mmap.mmap or StoreSegment that owns the pages
    key: str = ""  # the master's name: <segment name>#<segment id>
    anchor: Any = None  # a file mapping's ctypes view (its address); dropped before unmapping

    def release(self) -> None:
        self.anchor = None
        try:
            self.memory.close()
        except (BufferError, ValueError):  # a view still alive: the GC unmaps it
            pass


def _segment_list(targets: Any, op: str) -> list[str]:
    if isinstance(targets, str) or not isinstance(targets, (list, tuple)) \
            or not all(isinstance(t, str) for t in targets):
        raise TypeError(f"{op}: targets must be a list of segment names (str)")
    return list(targets)


class PoolApi:
    def __init__(self, core: StoreInternals) -> None:
        self.core = core
        self._mounts: dict[str, _Mount] = {}  # segment id -> mounted memory
        #: graceful unmounts waiting for the master: their memory still serves reads and drain moves
        self._leaving: dict[threading.Thread, _Mount] = {}
        self._mounts_lock = threading.Lock()
        self._closing = threading.Event()  # set at close: graceful unmounts stop waiting
        #: held while the replica-task runner reads our memory (wired by the client)
        self.tasks_busy: threading.Lock = threading.Lock()

    def mounted_regions(self) -> list[tuple[int, int]]:
        with self._mounts_lock:
            return [(m.addr, m.size) for m in [*self._mounts.values(), *self._leaving.values()]]

    # ------------------------------------------------------------------ copy / move tasks
    def _task(self, op: str, key: str, fn: Any) -> tuple[tuple[int, int], int]:
        try:
            self.core.require_ready(op)
            return tuple(fn()), 0  # type: ignore[return-value]
        except MooncakeError as e:
            log.error("%s %r failed: %s", op, key, e)
            return NO_TASK, e.code

    def create_copy_task(self, key: str, targets: list[str]) -> tuple[tuple[int, int], int]:
        key = check_key(key, "create_copy_task")
        segs = _segment_list(targets, "create_copy_task")
        return self._task("create_copy_task", key,
                          lambda: self.core.master.create_copy_task(self.core.client_id, key, segs))

    def create_move_task(self, key: str, source: str, target: str) -> tuple[tuple[int, int], int]:
        key = check_key(key, "create_move_task")
        if not isinstance(source, str) or not isinstance(target, str):
            raise TypeError("create_move_task: source and target must be segment names (str)")
        return self._task("create_move_task", key,
                          lambda: self.core.master.create_move_task(self.core.client_id, key, source, target))

    def query_task(self, task_id: Any) -> tuple[QueryTaskResponse | None, int]:
        if not isinstance(task_id, (tuple, list)) or len(task_id) != 2 \
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in task_id):
            raise TypeError(f"query_task: task_id must be the (int, int) pair create_*_task returned, got {task_id!r}")
        try:
            self.core.require_ready("query_task")
            info = self.core.master.query_task((int(task_id[0]), int(task_id[1])))
        except MooncakeError as e:
            log.error("query_task %s failed: %s", tuple(task_id), e)
            return None, e.code
        return QueryTaskResponse(info.task_id, info.type, info.status, info.created_at_ms_epoch,
                                 info.last_updated_at_ms_epoch, info.assigned_client, info.message), 0

    # ------------------------------------------------------------------ replica clearing
    def batch_replica_clear(self, keys: list[str], segment_name: str = "") -> list[str]:
        keys = check_keys(keys, "batch_replica_clear")
        if not isinstance(segment_name, str):
            raise TypeError(f"batch_replica_clear: segment_name must be str, got {type(segment_name).__name__}")
        if not keys:
            return []
        try:
            self.core.require_ready("batch_replica_clear")
            cleared = list(self.core.master.batch_replica_clear(keys, segment_name))
        except MooncakeError as e:
            log.warning("batch_replica_clear: %s", e)
            return []
        if not segment_name or segment_name == self.core.segment_name:
            self.core.forget(cleared)
        return cleared

    # ------------------------------------------------------------------ more memory: mount / unmount
    def mount_segment(self, path: str, size: int, offset: int = 0, protocol: str = "tcp",
                      location: str = "") -> dict[str, Any]:
        op = "mount_segment"
        fail: dict[str, Any] = {"ret": -1, "segment_ids": []}
        if not isinstance(path, str) or not path:
            raise TypeError(f"{op}: path must be a file path (str)")
        for name, v in (("size", size), ("offset", offset)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise TypeError(f"{op}: {name} must be an int >= 0, got {v!r}")
        if size == 0 or offset % mmap.ALLOCATIONGRANULARITY:
            log.error("%s %s: size must be > 0 and offset a multiple of %d (got size=%d offset=%d)", op, path,
                      mmap.ALLOCATIONGRANULARITY, size, offset)
            return fail
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as e:
            log.error("%s: cannot open %s: %s", op, path, e.strerror)
            return fail
        try:
            end = os.fstat(fd).st_size
            if offset + size > end:
                log.error("%s %s: range [%d, %d) is past the file's %d bytes", op, path, offset, offset + size, end)
                return fail
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, offset=offset)
        except OSError as e:
            log.error("%s: cannot map %s: %s", op, path, e.strerror)
            return fail
        finally:
            os.close(fd)
        anchor = ctypes.c_char.from_buffer(mm)
        m = _Mount(str(uuid.uuid4()), "file", ctypes.addressof(anchor), size, mm, anchor=anchor)
        return {"ret": 0, "segment_ids": [m.segment_id]} if self._mount(m, location, op) else fail

    def allocate_and_mount_segment(self, size: int, protocol: str = "tcp", location: str = "") -> dict[str, Any]:
        op = "allocate_and_mount_segment"
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise TypeError(f"{op}: size must be an int >= 0, got {size!r}")
        fail: dict[str, Any] = {"ret": -1, "segment_ids": [], "allocated_size": 0}
        if size == 0:
            log.error("%s: size is 0", op)
            return fail
        total = -(-size // SLAB) * SLAB
        try:
            seg = StoreSegment(total)
        except (OSError, ValueError) as e:
            log.error("%s: cannot allocate %d bytes: %s", op, total, e)
            return fail
        m = _Mount(str(uuid.uuid4()), "alloc", seg.addr, total, seg)
        if not self._mount(m, location, op):
            return fail
        return {"ret": 0, "segment_ids": [m.segment_id], "allocated_size": total}

    def _mount(self, m: _Mount, location: str, op: str) -> bool:
        """Register ``m`` with our engine and mount it at the master; on failure undo both."""
        core = self.core
        try:
            core.require_ready(op)
            rc = core.engine.register_memory(m.addr, m.size, location or "cpu:0")
            if rc not in (0, None):
                raise MooncakeError(-1, f"registering {m.size} bytes with the Transfer Engine failed ({rc})")
        except MooncakeError as e:
            log.error("%s: %s", op, e)
            m.release()
            return False
        m.key = f"{core.segment_name}#{m.segment_id}"
        try:
            core.master.mount_segment(core.client_id, core.segment_name, m.addr, m.size, 0, m.segment_id)
        except MooncakeError as e:
            log.error("%s: the master refused the segment: %s", op, e)
            self._free(m)
            return False
        with self._mounts_lock:
            self._mounts[m.segment_id] = m
        log.info("segment mounted", extra={"segment": m.key, "bytes": m.size, "kind": m.kind})
        return True

    def unmount_segment(self, segment_ids: list[str], grace_period_seconds: int = 0) -> int:
        return self._unmount(segment_ids, grace_period_seconds, "file", "unmount_segment")

    def unmount_and_free_segment(self, segment_ids: list[str], grace_period_seconds: int = 0) -> int:
        return self._unmount(segment_ids, grace_period_seconds, "alloc", "unmount_and_free_segment")

    def _unmount(self, segment_ids: list[str], grace_s: int, kind: str, op: str) -> int:
        if isinstance(segment_ids, str) or not isinstance(segment_ids, (list, tuple)):
            raise TypeError(f"{op}: segment_ids must be a list of the ids the mount returned")
        if isinstance(grace_s, bool) or not isinstance(grace_s, int) or grace_s < 0:
            raise TypeError(f"{op}: grace_period_seconds must be an int >= 0, got {grace_s!r}")
        try:
            self.core.require_ready(op)
        except MooncakeError as e:
            log.error("%s", e)
            return -1
        first = 0
        for sid in segment_ids:
            with self._mounts_lock:
                m = self._mounts.get(sid) if isinstance(sid, str) else None
                if m is not None and m.kind == kind:
                    del self._mounts[sid]
                else:
                    m = None
            if m is None:
                log.error("%s: segment id %r was not mounted by this client with %s", op, sid,
                          "mount_segment" if kind == "file" else "allocate_and_mount_segment")
                first = first or -1
                continue
            try:
                if grace_s:
                    self.core.master.unmount_segment_gracefully(self.core.client_id, m.key, grace_s * 1000)
                else:
                    self.core.master.unmount_segment(self.core.client_id, m.key)
            except MooncakeError as e:
                log.error("%s %s: %s", op, sid, e)
                with self._mounts_lock:
                    self._mounts[sid] = m  # still mounted: the caller may try again
                first = first or e.code
                continue
            self._leave_later(m, grace_s)  # even at once: readers may hold leases on its bytes
        return first

    def _leave_later(self, m: _Mount, grace_s: int) -> None:
        """Free ``m`` once the master has unmounted it (drained, or the grace period over) and
        the read leases on it ended; a thread of its own, so the call returns at once."""
        def wait() -> None:
            deadline = time.monotonic() + grace_s + 60
            closing = self._closing
            try:
                while time.monotonic() < deadline and not closing.is_set():
                    status, wait_ms = self.core.master.segment_status(self.core.client_id, m.key)
                    if status == 0:
                        closing.wait(wait_ms / 1000)
                        break
                    closing.wait(UNMOUNT_POLL_S)
            except MooncakeError as e:
                log.warning("graceful unmount of %s: lost the master (%s); unmapping now", m.key, e)
            finally:
                self._free(m)
                with self._mounts_lock:
                    self._leaving.pop(t, None)

        t = threading.Thread(target=wait, name="mooncake-store-unmount", daemon=True)
        with self._mounts_lock:
            self._leaving[t] = m
        t.start()

    def _free(self, m: _Mount) -> None:
        """Unregister ``m`` from our engine and unmap it (after any replica task reading it)."""
        with self.tasks_busy:
            engine = self.core.engine_or_none
            if engine is not None:
                try:
                    engine.unregister_memory(m.addr)
                except Exception:  # noqa: BLE001 - the engine may be closing
                    pass
            m.release()

    def remount(self) -> None:
        """After a master change: mount our extra segments again (the main one was). They come
        back from an earlier term, so the new master holds new allocations off them for its
        recovery hold (prev_epoch 1: any epoch but its own)."""
        core = self.core
        with self._mounts_lock:
            mounts = list(self._mounts.values())
        for m in mounts:
            try:
                core.master.mount_segment(core.client_id, core.segment_name, m.addr, m.size, 1, m.segment_id)
            except MooncakeError as e:
                log.warning("re-mounting %s at the new master failed: %s", m.key, e)

    def close(self) -> None:
        """Before the store closes: unmount and free every extra segment (graceful unmounts in
        progress end at once)."""
        with self._mounts_lock:
            mounts, self._mounts = list(self._mounts.values()), {}
            leaving = dict(self._leaving)
        for m in [*mounts, *leaving.values()]:  # a graceful unmount in progress ends at once
            try:
                self.core.master.unmount_segment(self.core.client_id, m.key, refused_is_final=True)
            except MooncakeError as e:
                if e.code != ErrorCode.SEGMENT_NOT_FOUND:
                    log.warning("unmounting %s at close: %s", m.key, e)
        for m in mounts:
            self._free(m)
        self._closing.set()  # the leaving ones' threads free theirs now
        for t in leaving:
            t.join(timeout=10)


