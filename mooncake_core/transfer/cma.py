"""Same-host transport: cross-memory attach (process_vm_readv / process_vm_writev).

Why: two processes on one host should not push bytes through the loopback TCP stack. The
kernel copies directly between the two address spaces (as UCX's ``cma`` transport does),
on *arbitrary* registered memory -- no need to allocate regions in shared memory up front.
Chosen when both descriptors show the same boot_id and pid namespace and a probe read of
the target succeeds (ptrace permissions allow it); otherwise the engine falls back to tcp
and logs why. The initiator bounds-checks every request against the target's published
regions before the syscall (the target cannot check: it is not involved).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from mooncake_core.transfer.base import (Transport, TransferError, TransferOpcode, TransferRequest,
                                         register_transport, split_slices)
from mooncake_core.transfer.descriptor import SegmentDescriptor, host_identity, process_start_time
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.te.cma")


class _iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_HAVE = hasattr(_libc, "process_vm_readv") and hasattr(_libc, "process_vm_writev")
if _HAVE:
    for _f in (_libc.process_vm_readv, _libc.process_vm_writev):
        _f.restype = ctypes.c_ssize_t
        _f.argtypes = [ctypes.c_int, ctypes.POINTER(_iovec), ctypes.c_ulong,
                       ctypes.POINTER(_iovec), ctypes.c_ulong, ctypes.c_ulong]

IOV_BATCH = 512  # well under IOV_MAX (1024)
PARALLEL_MIN = 8 << 20  # split big copies over threads only above this size


def _vm_op(write: bool, pid: int, pairs: list[tuple[int, int, int]]) -> None:
    """Copy every (local, remote, length) with as few syscalls as possible; loop on partial."""
    fn = _libc.process_vm_writev if write else _libc.process_vm_readv
    todo = [p for p in pairs if p[2]]
    while todo:
        chunk, todo = todo[:IOV_BATCH], todo[IOV_BATCH:]
        n = len(chunk)
        local = (_iovec * n)(*[_iovec(p[0], p[2]) for p in chunk])
        remote = (_iovec * n)(*[_iovec(p[1], p[2]) for p in chunk])
        want = sum(p[2] for p in chunk)
        got = fn(pid, local, n, remote, n, 0)
        if got < 0:
            err = ctypes.get_errno()
            raise TransferError(f"process_vm_{'writev' if write else 'readv'} to pid {pid} failed: "
                                f"{os.strerror(err)} (errno {err})", peer_down=err in (errno.ESRCH, errno.EPERM))
        if got < want:  # partial: requeue the rest
            rest: list[tuple[int, int, int]] = []
            for l, r, ln in chunk:
                if got >= ln:
                    got -= ln
                    continue
                rest.append((l + got, r + got, ln - got))
                got = 0
            if not rest:
                break
            todo = rest + todo


@register_transport("cma")
class CmaTransport(Transport):
    name = "cma"

    def __init__(self, **_: object):
        self.boot_id, self.pidns = host_identity()
        self._probed: dict[tuple[int, int], bool] = {}
        self._pidfds: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="te-cma")

    def can_reach(self, desc: SegmentDescriptor) -> bool:
        if not _HAVE or not desc.same_host_as(self.boot_id, self.pidns) or desc.pid == os.getpid():
            return False
        key = (desc.pid, desc.start_time)
        with self._lock:
            if key in self._probed:
                return self._probed[key]
        ok = self._probe(desc)
        with self._lock:
            self._probed[key] = ok
        return ok

    def _alive(self, desc: SegmentDescriptor) -> bool:
        """Is the descriptor's process still the one running under that pid?

        A pidfd names one process; it becomes readable when that process exits, so a
        recycled pid can never make us write into an unrelated process.
        """
        key = (desc.pid, desc.start_time)
        fd = self._pidfds.get(key)
        if fd is None:
            if desc.start_time and process_start_time(desc.pid) != desc.start_time:
                return False
            try:
                fd = os.pidfd_open(desc.pid)
            except (OSError, AttributeError):
                return os.path.exists(f"/proc/{desc.pid}")
            with self._lock:
                self._pidfds[key] = fd
        if select.select([fd], [], [], 0)[0]:  # exited: forget it (and its fd) for good
            with self._lock:
                if self._pidfds.pop(key, None) is not None:
                    os.close(fd)
                self._probed[key] = False
            return False
        return True

    def _probe(self, desc: SegmentDescriptor) -> bool:
        """Read one byte from the target's first region (or nothing if it has none)."""
        if not self._alive(desc):
            return False
        if not desc.buffers:
            return os.path.exists(f"/proc/{desc.pid}")
        b = ctypes.create_string_buffer(1)
        try:
            _vm_op(False, desc.pid, [(ctypes.addressof(b), desc.buffers[0].addr, 1)])
            return True
        except TransferError as e:
            log.info("cross-memory attach not permitted, will use tcp",
                     extra={"segment": desc.name, "pid": desc.pid, "error": str(e)})
            return False

    def transfer(self, desc: SegmentDescriptor, reqs: list[TransferRequest], deadline: float) -> None:
        if not self._alive(desc):
            raise TransferError(f"segment {desc.name!r}: process {desc.pid} has exited", peer_down=True)
        writes = [(r.local_addr, r.remote_addr, r.length) for r in reqs if r.opcode == TransferOpcode.WRITE]
        reads = [(r.local_addr, r.remote_addr, r.length) for r in reqs if r.opcode == TransferOpcode.READ]
        for write, pairs in ((True, writes), (False, reads)):
            if not pairs:
                continue
            total = sum(p[2] for p in pairs)
            if total >= PARALLEL_MIN:
                # two halves on two cores: the kernel copy is CPU bound
                slices = split_slices([TransferRequest(TransferOpcode.WRITE, *p) for p in pairs], total // 2 + 1)
                trip = [(s.local_addr, s.remote_addr, s.length) for s in slices]
                half = len(trip) // 2
                fut = self._pool.submit(_vm_op, write, desc.pid, trip[half:])
                _vm_op(write, desc.pid, trip[:half])
                fut.result(timeout=max(0.001, deadline - time.monotonic()) + 1)
            else:
                _vm_op(write, desc.pid, pairs)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        with self._lock:
            fds, self._pidfds = list(self._pidfds.values()), {}
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
