"""Same-host transport: cross-memory attach (process_vm_readv / process_vm_writev).

Why: two processes on one host should not push bytes through the loopback TCP stack. The
kernel copies directly between the two address spaces (as UCX's ``cma`` transport does),
on *arbitrary* registered memory -- no need to allocate regions in shared memory up front.
Chosen when both descriptors show the same boot_id and pid namespace and a probe read of
the target succeeds (ptrace permissions allow it); otherwise the engine falls back to tcp
and logs why. The initiator bounds-checks every request before the syscall (the target cannot
check: it is not involved) -- against the regions the *target process itself* reports over its
control channel (GET_DESC on the socket that process listens on), never against the regions a
descriptor from the metadata service merely claims: a forged descriptor naming a real local
engine's pid and port with other addresses would otherwise make us write into that engine's
unregistered memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import ipaddress
import bisect
import itertools
import os
import select
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from mooncake_core.errors import ErrorCode
from mooncake_core.transfer.base import (Capabilities, Transport, TransportContext, TransferError, TransferOpcode,
                                         TransferRequest)
from mooncake_core.transfer.control import ControlChannel
from mooncake_core.transfer.descriptor import DescriptorError, SegmentDescriptor, host_identity, process_start_time
from mooncake_core.transfer.tcp_vec import first_bad
from mooncake_core.transfer.vec import VEC_MIN, Plan, plan_chunks, region_index
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.te.cma")


def _proc_ip(hexip: str) -> str:
    """An address of /proc/net/tcp{,6} (host-order 32-bit words in hex) as text."""
    raw = bytes.fromhex(hexip)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw))


def _listening_inodes(pid: int, port: int) -> dict[str, str]:
    """Socket inode -> local address of the sockets in LISTEN state on ``port`` in ``pid``'s
    network namespace."""
    out: dict[str, str] = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    # local_address is HEXIP:HEXPORT; st 0A = LISTEN; inode is field 10
                    if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        out[parts[9]] = _proc_ip(parts[1].rsplit(":", 1)[0])
        except (OSError, ValueError, IndexError):
            continue
    return out


def pid_listen_address(pid: int, port: int) -> str | None:
    """The address at which process ``pid`` itself listens on tcp ``port`` (loopback for a
    wildcard bind), or None when it does not (read from /proc: the same permission
    cross-memory attach needs). Connecting there reaches that process, whatever host a
    descriptor names."""
    inodes = _listening_inodes(pid, port)
    if not inodes:
        return None
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    want = {f"socket:[{i}]": addr for i, addr in inodes.items()}
    for fd in fds:
        try:
            addr = want.get(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        if addr is not None:
            ip = ipaddress.ip_address(addr)
            if ip.is_unspecified:
                return "::1" if ip.version == 6 else "127.0.0.1"
            return addr
    return None


def pid_listens_on(pid: int, port: int) -> bool:
    """True when process ``pid`` holds a socket listening on tcp ``port``."""
    return pid_listen_address(pid, port) is not None


class _iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_HAVE = hasattr(_libc, "process_vm_readv") and hasattr(_libc, "process_vm_writev")
if _HAVE:
    for _f in (_libc.process_vm_readv, _libc.process_vm_writev):
        _f.restype = ctypes.c_ssize_t
        _f.argtypes = [ctypes.c_int, ctypes.POINTER(_iovec), ctypes.c_ulong,
                       ctypes.POINTER(_iovec), ctypes.c_ulong, ctypes.c_ulong]

# Same two syscalls bound a second time with raw pointers: the batch path passes slices of
# numpy (base, len) arrays, which would otherwise need a ctypes.cast per call.
_libc_raw = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
if _HAVE:
    _RAW = {True: _libc_raw.process_vm_writev, False: _libc_raw.process_vm_readv}
    for _f in _RAW.values():
        _f.restype = ctypes.c_ssize_t
        _f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                       ctypes.c_ulong]

IOV_BATCH = 512  # well under IOV_MAX (1024)
PARALLEL_MIN = 8 << 20  # spread big copies over threads only above this size
#: bytes per unit of work: small enough that a thread stalled by a busy core holds up little
#: (a 256 MiB batch is 32 chunks), large enough to keep per-syscall and GIL hand-off costs low
#: (measured: 2 MiB chunks cost ~40% of the bandwidth of one 64 MiB copy, 8 MiB none)
CHUNK_BYTES = 8 << 20
#: threads copying one batch (the caller plus helpers): the kernel copy is CPU bound
COPY_THREADS = max(2, min(4, os.cpu_count() or 2))


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
        if got == 0 and want:  # no progress at all: never loop on it
            raise TransferError(f"process_vm_{'writev' if write else 'readv'} to pid {pid} moved no bytes "
                                f"of {want}")
        if got < want:  # partial: requeue the rest
            rest: list[tuple[int, int, int]] = []
            for lo, r, ln in chunk:
                if got >= ln:
                    got -= ln
                    continue
                rest.append((lo + got, r + got, ln - got))
                got = 0
            if not rest:
                break
            todo = rest + todo


def _run_chunk(write: bool, pid: int, plan: Plan, k: int) -> None:
    """One vectored syscall for chunk ``k`` of ``plan``; a short count (a fault part-way)
    finishes through ``_vm_op``, which resumes after the bytes already moved."""
    a, b = plan.bounds[k], plan.bounds[k + 1]
    want = plan.nbytes[k]
    got = _RAW[write](pid, plan.local_iov.ctypes.data + a * 16, b - a,
                      plan.remote_iov.ctypes.data + a * 16, b - a, 0)
    if got == want:
        return
    if got < 0:
        err = ctypes.get_errno()
        raise TransferError(f"process_vm_{'writev' if write else 'readv'} to pid {pid} failed: "
                            f"{os.strerror(err)} (errno {err})", peer_down=err in (errno.ESRCH, errno.EPERM))
    rest: list[tuple[int, int, int]] = []
    for (lb, ln), (rb, _) in zip(plan.local_iov[a:b].tolist(), plan.remote_iov[a:b].tolist()):
        if got >= ln:
            got -= ln
            continue
        rest.append((lb + got, rb + got, ln - got))
        got = 0
    _vm_op(write, pid, rest)


#: seconds a same-host peer has to report its regions when we first consider attaching to it
PROBE_TIMEOUT = 5.0


class CmaTransport(Transport):
    name = "cma"
    priority = 80  # same host, no network stack: below only the in-process copy
    capabilities = Capabilities(locations=frozenset({"cpu"}), array_batches=True)
    hints = ("shm",)  # Mooncake's transport_hint for same-host transfers

    def __init__(self, ctx: TransportContext | None = None):
        super().__init__(ctx)
        self.boot_id, self.pidns = host_identity()
        self._probed: dict[tuple[int, int], bool] = {}
        self._pidfds: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=COPY_THREADS - 1, thread_name_prefix="te-cma")
        #: (pid, start_time) -> sorted (starts, ends) of the regions that process itself reported
        self._verified: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._verified_lists: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
        self._control = ControlChannel()

    def can_reach(self, desc: SegmentDescriptor) -> bool:
        if not _HAVE or not desc.same_host_as(self.boot_id, self.pidns) or desc.pid == os.getpid():
            return False
        key = (desc.pid, desc.start_time)
        with self._lock:
            if key in self._probed:
                return self._probed[key]
        ok = self._probe(desc)
        if ok is None:  # the peer did not answer in time: use tcp now, ask again next time
            return False
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

    def _probe(self, desc: SegmentDescriptor) -> bool | None:
        """Is ``desc.pid`` really the peer, and may we attach to it? Then read one byte from its
        first region (or nothing if it has none). None: the peer did not report its regions in
        time -- not an answer, so not remembered (a busy peer would otherwise be on tcp for good).

        Why the ownership check: a descriptor comes from the peer (P2P handshake) or from the
        metadata service, and cross-memory attach writes into whatever process ``pid`` names. A
        peer claiming another local process's pid would otherwise make us write into that
        process (found by tests/fuzz/test_fuzz_handshake.py). The process we attach to must own
        the socket listening on the descriptor's port -- the one this descriptor was served from.
        """
        if not self._alive(desc):
            return False
        if not pid_listens_on(desc.pid, desc.port):
            log.warning("segment descriptor names a local process that does not serve its port; using tcp",
                        extra={"segment": desc.name, "pid": desc.pid, "port": desc.port})
            return False
        try:  # its own word on what it registered, not the descriptor's (see _check_claims)
            starts, _ = self._target_regions(desc, time.monotonic() + PROBE_TIMEOUT)
        except TransferError as e:
            log.warning("same-host peer did not report its regions over its control channel; using tcp "
                        "for now", extra={"segment": desc.name, "pid": desc.pid, "error": str(e)})
            return None
        if not len(starts):
            return os.path.exists(f"/proc/{desc.pid}")
        b = ctypes.create_string_buffer(1)
        try:
            _vm_op(False, desc.pid, [(ctypes.addressof(b), int(starts[0]), 1)])
            return True
        except TransferError as e:
            # a warning, not info: a same-host peer silently running over tcp is what users of the
            # original could not tell from a working setup (DESIGN.md §6)
            log.warning("cross-memory attach not permitted, using tcp for this same-host peer",
                        extra={"segment": desc.name, "pid": desc.pid, "error": str(e)})
            return False

    def _target_regions(self, desc: SegmentDescriptor, deadline: float) -> tuple[np.ndarray, np.ndarray]:
        """Ask the process ``desc.pid`` (at the address *it* listens on) which regions it
        registered: GET_DESC over its control channel (authenticated when a token is set)."""
        where = pid_listen_address(desc.pid, desc.port)
        if where is None:
            raise TransferError(f"segment {desc.name!r}: process {desc.pid} no longer listens on port {desc.port}",
                                peer_down=True)
        raw = self._control.fetch_descriptor(where, desc.port, desc.name, deadline)
        try:
            own = SegmentDescriptor.from_json(raw)
        except DescriptorError as e:
            raise TransferError(f"segment {desc.name!r}: process {desc.pid} answered a bad descriptor: {e}") from None
        if own.pid != desc.pid or (desc.start_time and own.start_time != desc.start_time):
            raise TransferError(f"segment {desc.name!r}: the engine on port {desc.port} is process {own.pid}, "
                                f"not {desc.pid}: refusing cross-memory attach")
        index = region_index(own.buffers)
        with self._lock:
            self._verified[(desc.pid, desc.start_time)] = index
            self._verified_lists[(desc.pid, desc.start_time)] = (index[0].tolist(), index[1].tolist())
        return index

    def _claims_known(self, desc: SegmentDescriptor, reqs: list[TransferRequest]) -> bool:
        """The small-batch fast path of ``_check_claims`` (bisect, no numpy)."""
        lists = self._verified_lists.get((desc.pid, desc.start_time))
        if lists is None:
            return False
        starts, ends = lists
        for r in reqs:
            if r.length <= 0:
                continue
            i = bisect.bisect_right(starts, r.remote_addr) - 1
            if i < 0 or r.remote_addr + r.length > ends[i]:
                return False
        return True

    def _check_claims(self, desc: SegmentDescriptor, remote: np.ndarray, length: np.ndarray,
                      deadline: float) -> None:
        """Every remote range must lie in a region the target process registered (asked once,
        again when a range is new: it may have registered more since)."""
        index = self._verified.get((desc.pid, desc.start_time))
        if index is not None and first_bad(index[0], index[1], remote, length) is None:
            return
        starts, ends = self._target_regions(desc, deadline)
        bad = first_bad(starts, ends, remote, length)
        if bad is not None:
            a, n = int(remote[bad]), int(length[bad])
            log.warning("refused cross-memory attach outside the target's registered regions",
                        extra={"segment": desc.name, "pid": desc.pid, "addr": hex(a), "length": n})
            raise TransferError(f"segment {desc.name!r}: {n} bytes at {a:#x} are not in any region process "
                                f"{desc.pid} registered (its descriptor claims memory the engine never "
                                f"registered): cross-memory attach refused", ErrorCode.INVALID_PARAMS)

    def transfer(self, desc: SegmentDescriptor, reqs: list[TransferRequest], deadline: float) -> None:
        for op in (TransferOpcode.WRITE, TransferOpcode.READ):
            sel = [r for r in reqs if r.opcode == op]
            if not sel:
                continue
            if len(sel) < VEC_MIN and sum(r.length for r in sel) < PARALLEL_MIN:
                # small: one direct syscall; numpy planning would cost more than the copy
                if not self._alive(desc):
                    raise TransferError(f"segment {desc.name!r}: process {desc.pid} has exited", peer_down=True)
                if not self._claims_known(desc, sel):
                    self._check_claims(desc, np.array([r.remote_addr for r in sel], dtype=np.int64),
                                       np.array([r.length for r in sel], dtype=np.int64), deadline)
                _vm_op(op == TransferOpcode.WRITE, desc.pid, [(r.local_addr, r.remote_addr, r.length) for r in sel])
                continue
            arr = np.array([(r.local_addr, r.remote_addr, r.length) for r in sel], dtype=np.int64).reshape(-1, 3)
            self.transfer_arrays(desc, op, arr[:, 0], arr[:, 1], arr[:, 2], deadline)

    def transfer_arrays(self, desc: SegmentDescriptor, opcode: TransferOpcode, local: np.ndarray,
                        remote: np.ndarray, length: np.ndarray, deadline: float) -> None:
        """Move a whole batch given as int64 arrays (already validated and bounds-checked by
        the engine). The batch is cut into ~CHUNK_BYTES chunks of at most IOV_BATCH iovecs;
        the caller and up to COPY_THREADS-1 pool threads take chunks from a shared counter,
        so a thread that loses its core delays only the chunk it holds, not half the batch."""
        if not self._alive(desc):
            raise TransferError(f"segment {desc.name!r}: process {desc.pid} has exited", peer_down=True)
        self._check_claims(desc, remote, length, deadline)
        write = opcode == TransferOpcode.WRITE
        plan = plan_chunks(local, remote, length, chunk_bytes=CHUNK_BYTES, max_iov=IOV_BATCH)
        nchunks = len(plan.nbytes)
        if nchunks == 0:
            return
        helpers = 0
        if plan.total >= PARALLEL_MIN and nchunks > 1:
            helpers = min(COPY_THREADS - 1, nchunks - 1)
        counter = itertools.count()
        failed: list[BaseException] = []

        def work() -> None:
            try:
                while not failed:
                    k = next(counter)
                    if k >= nchunks:
                        return
                    if time.monotonic() > deadline:
                        raise TransferError(f"segment {desc.name!r}: transfer timed out after "
                                            f"{k} of {nchunks} chunks")
                    _run_chunk(write, desc.pid, plan, k)
            except BaseException as e:  # noqa: BLE001 - handed to the caller below
                failed.append(e)

        futs = [self._pool.submit(work) for _ in range(helpers)]
        work()
        for f in futs:
            if not f.cancel():  # a helper still queued (pool busy with another batch) is not waited for
                f.result(timeout=max(0.001, deadline - time.monotonic()) + 1)
        if failed:
            raise failed[0]

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._control.close()
        with self._lock:
            fds, self._pidfds = list(self._pidfds.values()), {}
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
