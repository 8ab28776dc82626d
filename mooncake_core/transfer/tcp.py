"""TCP transport: zero-copy on both ends, several connections per peer, pipelined slices.

Why it looks like this:
* payload bytes go from registered memory straight into ``sendmsg`` (header + payload in one
  vectored call, a whole window of slices per call for batches) and come back through
  ``recv_into`` a memoryview over the destination -- no intermediate Python bytes;
* large requests are cut into slices (MC_SLICE_SIZE, default 1 MiB) and the slices of a
  batch are spread over MC_TCP_CONNECTIONS connections (default 2: one per core here),
  each pipelined with a bounded window so round trips overlap with payload;
* each peer has its own connection pool and worker threads: a dead peer only ever blocks
  its own workers, and only until the transfer deadline (socket timeouts everywhere);
* large batches of small blocks (``transfer_arrays``, 64+ entries) go as vectored WRITEV /
  READV requests (``tcp_vec.py``): a packed block list per up to 1,024 blocks, payload moved
  by ``sendmsg``/``recvmsg`` over numpy iovec arrays (``iov.py``), no object per block;
* small round trips poll for the reply briefly before sleeping (MC_TCP_BUSY_POLL_US);
  large vectored receives (READV replies here, WRITEV payloads at the target) sleep until
  MC_TCP_RCVLOWAT bytes (1 MiB) have arrived rather than waking per segment (``iov.recv_iov``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import wait
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from mooncake_core import envs
from mooncake_core.transfer.base import (DEVICE_KINDS, Capabilities, TransferError, TransferOpcode, TransferRequest,
                                         Transport, TransportContext, partition, split_slices)
from mooncake_core.transfer.conn import POOL_IDLE_MAX, Conn, ConnGroup, PeerPool
from mooncake_core.transfer.descriptor import SegmentDescriptor
from mooncake_core.transfer.iov import iov_array, recv_iov, send_iov
from mooncake_core.transfer.memory import memview
from mooncake_core.transfer.sockio import (PeerClosed, Poller, busy_poll_s, recv_exact, recv_into_exact, send_rest,
                                           sendmsg_all, set_buffers, set_kernel_timeouts)
from mooncake_core.transfer.tcp_vec import ENTRY_SIZE, MAX_BYTES, VecPlan, plan_requests, runs, with_blocks
from mooncake_core.transfer.wire import (MAGIC, MAX_AUX, REQ, RESP, WIRE_VERSION, Op, Status, WireError)
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.te.tcp")

WINDOW_REQS = 64
WINDOW_BYTES = 16 << 20
#: requests up to this size poll for their reply (MC_TCP_BUSY_POLL_US); bigger ones take
#: longer than a poll anyway
POLL_MAX_BYTES = 64 << 10
#: vectored requests (WRITEV/READV) in flight per connection: the next one is on the wire
#: while the target works on the previous one
VEC_WINDOW = 2
#: a batch whose blocks average at least this many bytes takes the sliced per-request path
#: (few large blocks: nothing to gain from block lists, and that path is tuned for them)
VEC_BIG_BLOCK = 256 << 10
#: smallest vectored request worth cutting a batch into when spreading it over connections
VEC_MIN_REQ = 1 << 20
#: batches of at least this many bytes are spread over the peer's connections
VEC_SPREAD = 8 << 20


class _Conn(Conn):
    """A pooled connection with the data-path exchanges (single request, pipelined slices,
    vectored batches); used by one thread at a time."""

    def __init__(self, host: str, port: int, deadline: float, peer: str):
        super().__init__(host, port, deadline, peer)
        self.poller = Poller(busy_poll_s())  # MC_TCP_BUSY_POLL_US, small round trips (``one``)
        set_buffers(self.sock, envs.MC_TCP_SNDBUF, envs.MC_TCP_RCVBUF)

    def one(self, opcode: int, local: int, remote: int, length: int, deadline: float,
            _pack=REQ.pack, _unpack=RESP.unpack, _mv=memview) -> None:
        """A single small request, with the fewest Python steps (the 4 KiB latency path)."""
        sock = self.sock
        self._rid += 1
        rid = self._rid
        t = deadline - time.monotonic()
        if t <= 0:
            raise TransferError(f"transfer with {self.peer}: deadline exceeded (MC_TRANSFER_TIMEOUT)")
        if abs(t - self._timeout) > 0.05:
            set_kernel_timeouts(sock, t)
            self._timeout = t
        if opcode == 1:  # WRITE: header + payload straight from registered memory, one syscall
            bufs = [_pack(MAGIC, WIRE_VERSION, 1, 0, rid, remote, length, 0, 0), _mv(local, length, False)]
            sent = sock.sendmsg(bufs)
            if sent != length + 40:
                send_rest(sock, bufs, sent, deadline)
        else:
            sock.sendall(_pack(MAGIC, WIRE_VERSION, 2, 0, rid, remote, length, 0, 0))
        got = self.poller.recv_into(sock, self._hview, 32) if length <= POLL_MAX_BYTES else None
        if got is None:
            got = sock.recv_into(self._hview, 32)
        if got < 32:
            if got == 0:
                raise PeerClosed("connection closed before the reply")
            recv_into_exact(sock, self._hview[got:], deadline)
        magic, _ver, _op, _f, r_id, status, aux_len, rlen = _unpack(self._hdr)
        if magic != MAGIC or r_id != rid or aux_len > MAX_AUX:
            raise WireError(f"bad response from {self.peer}: magic={magic:#x} id={r_id} (expected {rid})")
        if status:
            aux = bytes(recv_exact(sock, aux_len)) if aux_len else b""
            raise TransferError(f"segment {self.peer} refused {TransferOpcode(opcode).name.lower()} of {length} "
                                f"bytes at {remote:#x}: {aux.decode(errors='replace')}")
        if aux_len:
            recv_exact(sock, aux_len)
        if opcode != 1:
            if rlen != length:
                raise WireError(f"read reply carries {rlen} bytes, expected {length}")
            recv_into_exact(sock, _mv(local, length), deadline)

    def _reply(self, rid: int, deadline: float, what: str, describe: Callable[[], str]) -> int:
        """Read and check the response header to request ``rid`` of a pipelined run; returns
        the payload length that follows. A refusal raises TransferError naming
        ``describe()`` and the target's reason; a malformed header raises WireError."""
        sock = self.sock
        self._settimeout(deadline, what)
        recv_into_exact(sock, self._hview, deadline)
        magic, _ver, _op, _f, r_id, status, aux_len, length = RESP.unpack(self._hdr)
        if magic != MAGIC or r_id != rid or aux_len > MAX_AUX:
            raise WireError(f"bad response from {self.peer}: magic={magic:#x} id={r_id} (expected {rid})")
        if status != Status.OK:
            aux = bytes(recv_exact(sock, aux_len)) if aux_len else b""
            raise TransferError(f"segment {self.peer} refused {describe()}: {aux.decode(errors='replace')}")
        if aux_len:
            recv_exact(sock, aux_len)
        return length

    def run(self, slices: list[TransferRequest], deadline: float) -> None:
        """Execute slices in order with a bounded pipeline window.

        Hot path (a 4 KiB transfer is dominated by it): headers are packed with the struct
        directly and responses unpacked in place, no per-message objects.
        """
        what = f"transfer with {self.peer}"
        sock = self.sock
        pack = REQ.pack
        pending: deque = deque()
        inflight = 0
        i = 0
        n = len(slices)
        while i < n or pending:
            bufs: list = []
            while i < n and len(pending) < WINDOW_REQS and (inflight < WINDOW_BYTES or not pending):
                s = slices[i]
                self._rid += 1
                if s.opcode == TransferOpcode.WRITE:
                    bufs.append(pack(MAGIC, WIRE_VERSION, Op.WRITE, 0, self._rid, s.remote_addr, s.length, 0, 0))
                    if s.length:
                        bufs.append(memview(s.local_addr, s.length, writable=False))
                else:
                    bufs.append(pack(MAGIC, WIRE_VERSION, Op.READ, 0, self._rid, s.remote_addr, s.length, 0, 0))
                pending.append((self._rid, s))
                inflight += s.length
                i += 1
            if bufs:
                self._settimeout(deadline, what)
                sendmsg_all(sock, bufs, deadline)
            rid, s = pending.popleft()
            inflight -= s.length
            length = self._reply(rid, deadline, what, lambda: f"{s.opcode.name.lower()} of {s.length} "
                                                              f"bytes at {s.remote_addr:#x}")
            if s.opcode == TransferOpcode.READ and s.length:
                if length != s.length:
                    raise WireError(f"read reply carries {length} bytes, expected {s.length}")
                recv_into_exact(sock, memview(s.local_addr, s.length), deadline)


    def run_vec(self, write: bool, plan: VecPlan, work: _VecWork, deadline: float, lowat: int = 0) -> None:
        """Execute vectored requests of ``plan`` taken from ``work`` until none are left,
        VEC_WINDOW in flight.

        Each request is one header + packed block list (+ the payload, gathered straight from
        registered memory, for a WRITEV); a READV reply is scattered straight into the local
        blocks. Locally contiguous blocks are merged, so they cost one iovec entry. On any
        error the requests taken but not finished go back to ``work`` (a retry on a fresh
        connection, or another connection, redoes them: WRITEV/READV are idempotent).
        """
        what = f"transfer with {self.peer}"
        sock = self.sock
        op = Op.WRITEV if write else Op.READV
        local, remote, length, bounds, nbytes = plan
        pending: deque = deque()
        more = True
        try:
            while True:
                while more and len(pending) < VEC_WINDOW:
                    k = work.take()
                    if k is None:
                        more = False
                        break
                    pending.append((self._rid + 1, k))  # before any I/O: given back on failure
                    a, b = bounds[k], bounds[k + 1]
                    self._rid += 1
                    head = with_blocks(REQ.pack(MAGIC, WIRE_VERSION, op, 0, self._rid, 0, nbytes[k],
                                                ENTRY_SIZE * (b - a), 0), remote[a:b], length[a:b])
                    self._settimeout(deadline, what)
                    if write:  # header + block list + payload gathered from registered memory: one call
                        send_iov(sock, iov_array(*runs(local[a:b], length[a:b]),
                                                 head=(head.ctypes.data, head.nbytes)), deadline)
                    else:
                        sock.sendall(head.data)
                if not pending:
                    return
                rid, j = pending[0]
                rlen = self._reply(rid, deadline, what, lambda: f"a vectored {'write' if write else 'read'} "
                                                                f"of {bounds[j + 1] - bounds[j]} blocks")
                if not write:
                    if rlen != nbytes[j]:
                        raise WireError(f"vectored read reply carries {rlen} bytes, expected {nbytes[j]}")
                    a, b = bounds[j], bounds[j + 1]
                    recv_iov(sock, iov_array(*runs(local[a:b], length[a:b])), deadline, lowat)  # scattered into place
                pending.popleft()
        except BaseException:
            work.give_back([k for _, k in pending])
            raise


class _VecWork:
    """The requests of one batch, taken by whichever connection is free (work sharing: a
    connection whose threads lose their core delays only the requests it holds)."""

    def __init__(self, n: int):
        self.n = n
        self._next = itertools.count()  # next() is atomic under the GIL
        self._redo: deque[int] = deque()
        self.failed = False

    def take(self) -> int | None:
        if self.failed:
            return None
        try:
            return self._redo.popleft()
        except IndexError:
            pass
        k = next(self._next)
        return k if k < self.n else None

    def give_back(self, ks: list[int]) -> None:
        self._redo.extend(ks)


class TcpTransport(Transport):
    name = "tcp"
    priority = 10  # reaches anything with a host and port: the last resort
    #: a peer's device memory too: its rpc server stages it (staging.py), once its plugin registered it
    capabilities = Capabilities(locations=frozenset({"cpu"}) | DEVICE_KINDS, array_batches=True)

    def __init__(self, ctx: TransportContext | None = None):
        super().__init__(ctx)
        self.nconn = envs.MC_TCP_CONNECTIONS
        self.slice_size = envs.MC_SLICE_SIZE
        self.single_max = self.slice_size
        # payload per vectored request; a request may overshoot by one block, so at most
        # half of what a target accepts (tcp_vec.MAX_BYTES)
        self.vec_bytes = min(envs.MC_TCP_VEC_BYTES, MAX_BYTES // 2)
        self.rcvlowat = envs.MC_TCP_RCVLOWAT  # READV replies (iov.recv_iov)
        self._pools: dict[tuple[str, int], PeerPool] = {}
        self._lock = threading.Lock()

    def can_reach(self, desc: SegmentDescriptor) -> bool:
        return bool(desc.host) and desc.port > 0

    def pool(self, host: str, port: int, name: str) -> PeerPool:
        key = (host, port)
        with self._lock:
            p = self._pools.get(key)
            if p is None:
                p = self._pools[key] = PeerPool(host, port, name, self.nconn, _Conn)
            return p

    def drop_peer(self, desc: SegmentDescriptor) -> None:
        with self._lock:
            p = self._pools.pop((desc.host, desc.port), None)
        if p:
            p.close()

    def transfer_one(self, desc: SegmentDescriptor, opcode: int, local: int, remote: int, length: int,
                     deadline: float) -> None:
        """One request of at most ``slice_size`` bytes on one pooled connection (latency path)."""
        pool = self._pools.get((desc.host, desc.port)) or self.pool(desc.host, desc.port, desc.name)
        c = pool.take_idle()
        if c is None or time.monotonic() - c.last_used >= POOL_IDLE_MAX:
            if c is not None:
                c.close()
            pool.use(lambda c: c.one(opcode, local, remote, length, deadline), deadline)
            return
        try:
            c.one(opcode, local, remote, length, deadline)
        except BaseException as e:
            err = pool.failed(c, e)
            if not pool.stale(c, e):
                raise err from None
            pool.use(lambda c: c.one(opcode, local, remote, length, deadline), deadline)
            return
        pool.checkin(c)

    def transfer(self, desc: SegmentDescriptor, reqs: list[TransferRequest], deadline: float) -> None:
        pool = self.pool(desc.host, desc.port, desc.name)
        if len(reqs) == 1 and reqs[0].length <= self.slice_size:  # small single op: inline, no fan-out
            pool.use(lambda c: c.run(reqs, deadline), deadline)
            return
        slices = split_slices(reqs, self.slice_size)
        total = sum(s.length for s in slices)
        ngroups = 1 if total < 2 * self.slice_size else min(self.nconn, len(slices))
        groups = partition(slices, ngroups)
        group = ConnGroup()
        futs = [pool.executor.submit(pool.use, (lambda g: lambda c: c.run(g, deadline))(g), deadline, group)
                for g in groups[1:]]
        first_err: BaseException | None = None
        try:
            pool.use(lambda c: c.run(groups[0], deadline), deadline, group)
        except TransferError as e:
            first_err = e
        if futs:
            done, not_done = wait(futs, timeout=0 if first_err else max(0.0, deadline - time.monotonic()) + 1.0)
            for f in done:
                if f.exception() is not None and first_err is None:
                    first_err = f.exception()
            if not_done and first_err is None:
                first_err = TransferError(f"segment {desc.name}: timed out (MC_TRANSFER_TIMEOUT)", peer_down=True)
        if first_err is not None:
            group.cancel(futs)
            raise first_err

    def transfer_arrays(self, desc: SegmentDescriptor, opcode: TransferOpcode, local: np.ndarray,
                        remote: np.ndarray, length: np.ndarray, deadline: float) -> None:
        """Move a large batch given as int64 arrays (validated and bounds-checked by the
        engine; the target checks again) with vectored requests: no per-block Python objects
        (iovec arrays built by numpy). The caller's thread and up to MC_TCP_CONNECTIONS-1 pool
        threads, each on its own connection, take requests from a shared counter. Batches of
        few large blocks take the sliced path instead."""
        n = len(length)
        total = int(length.sum()) if n else 0
        if n == 0 or total >= VEC_BIG_BLOCK * n:
            op = TransferOpcode(int(opcode))
            reqs = [TransferRequest(op, a, r, ln) for a, r, ln in zip(local.tolist(), remote.tolist(),
                                                                      length.tolist())]
            if reqs:
                self.transfer(desc, reqs, deadline)
            return
        write = int(opcode) == TransferOpcode.WRITE
        # spread over the peer's connections from VEC_SPREAD bytes on (below, one connection
        # is as fast on this kind of host); requests small enough that each connection gets
        # VEC_WINDOW of them (pipelined), but at least VEC_MIN_REQ; never over vec_bytes
        parts = self.nconn if total >= VEC_SPREAD else 1
        per = -(-total // (parts * VEC_WINDOW))
        plan = plan_requests(local, remote, length, max_bytes=min(self.vec_bytes, max(VEC_MIN_REQ, per)))
        nreq = len(plan.nbytes)
        if nreq == 0:
            return
        pool = self.pool(desc.host, desc.port, desc.name)
        work = _VecWork(nreq)
        group = ConnGroup()

        def worker() -> None:
            try:
                pool.use(lambda c: c.run_vec(write, plan, work, deadline, self.rcvlowat), deadline, group)
            except BaseException:
                work.failed = True  # the others stop taking requests
                raise

        futs = [pool.executor.submit(worker) for _ in range(min(parts, nreq) - 1)]
        first_err: BaseException | None = None
        try:
            worker()
        except TransferError as e:
            first_err = e
        for f in futs:
            if f.cancel():  # still queued (the pool is busy with another batch): nothing to wait for
                continue
            try:
                f.result(timeout=max(0.0, deadline - time.monotonic()) + 1.0)
            except FutureTimeout:
                first_err = first_err or TransferError(f"segment {desc.name}: timed out (MC_TRANSFER_TIMEOUT)",
                                                       peer_down=True)
            except BaseException as e:  # noqa: BLE001 - the first error is raised below
                first_err = first_err or e
        if first_err is None and (work.take() is not None):
            first_err = TransferError(f"segment {desc.name}: vectored batch left requests undone")
        if first_err is not None:
            work.failed = True
            group.cancel(futs)
            raise first_err

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            p.close()
