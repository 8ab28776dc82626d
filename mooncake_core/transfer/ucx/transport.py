"""``protocol="rdma"``: one-sided READ/WRITE through UCX's UCP API.

The same calls run over verbs / RoCE / EFA lanes on RDMA NICs and over tcp / shared-memory
lanes elsewhere, so CI exercises the real code path (docs/transfer-engine.md says what was
measured on which lanes).

* **One UCP context per NIC** (a *rail*; one rail for every device when ``device_name`` names
  at most one -- on a host without RDMA devices, this engine's one tcp interface, because UCX's
  tcp PUT is unsafe with several: ``lanes.tuning``) with ``MC_WORKERS_PER_CTX`` workers
  (default 2, as the original's worker threads per context), each with a progress thread. On
  one NIC a transfer of at least ``SPLIT_BYTES`` is split over the workers, each part moved by
  its own thread to the peer's worker of the same index (``_Rail`` says why). A peer's one-sided
  operations need no help from us on RDMA lanes, but on tcp lanes UCX emulates GET (and
  completes PUT) with messages the *target* must progress, so every engine keeps
  progressing. The thread sleeps on the worker's event fd (``ucp_worker_arm``) when idle
  and stands aside while a caller of this engine waits on its own transfer (that caller
  progresses the worker itself: no lock ping-pong on the hot path).
* **Registration**: each region the engine registers is ``ucp_mem_map``-ed; its packed
  remote key, and this worker's address, go into our section of the segment descriptor
  (``descriptor["transports"]["ucx"]``) -- peers need no second listener or handshake.
* **A transfer**: endpoints to the peer are created on first use from its rails' worker
  addresses (our rail on NIC ``d0`` to the peer's ``d0``; lanes logged once), remote keys
  unpacked once per region, each slice is one ``ucp_put_nbx`` / ``ucp_get_nbx``. Slices go
  in windows of a few MiB, each closed by a ``ucp_ep_flush_nbx``; rails pull windows from one
  queue (``plan.py``), progressed until done or the deadline -- never ``ucp_worker_flush``,
  which cannot time out.
* **A NIC that fails** (a window errors, or makes no progress for ``MC_SLICE_TIMEOUT`` while
  another rail is up) is taken out for ``MC_RDMA_RAIL_PAUSE_SECONDS``: its endpoint is
  force-closed (outstanding operations cancelled: no late byte lands in a buffer the caller
  reuses) and its unfinished windows go back to the queue for the other rails, within the
  same deadline. After the pause it is used again. When no rail is left, or at the deadline,
  the peer is reported down; the next call reconnects.
* **Notifications** go over the engine's control channel after ``transfer`` returned, i.e.
  after the flush completed: in order after the data.

Peer failure: endpoints are created without UCX's peer error handling by default, because
UCX then refuses shared-memory lanes and halves tcp PUT bandwidth (measured); a dead peer is
found by the transfer's deadline instead. ``MC_UCX_PEER_ERRORS=1`` turns it on (fast failure,
fewer lanes).
"""

from __future__ import annotations

import base64
import ctypes
import os
import select
import threading
import time
from typing import Any, Sequence

import numpy as np

from mooncake_core import envs
from mooncake_core.errors import ErrorCode
from mooncake_core.transfer import metrics, topology
from mooncake_core.transfer.base import (Capabilities, Transport, TransportContext, TransferError, TransferOpcode,
                                         TransferRequest, location_kind)
from mooncake_core.transfer.descriptor import SegmentDescriptor, process_start_time
from mooncake_core.transfer.memory import Region
from mooncake_core.transfer.ucx import lanes as lanes_mod
from mooncake_core.transfer.ucx import plan
from mooncake_core.transfer.ucx.binding import UCS_INPROGRESS, UCS_OK, NativeWorker, Ucp, UcxError, native
from mooncake_core.transfer.ucx.library import LoadedUcp, UcxNotFound, load
from mooncake_core.utils import net as netutil
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.te.ucx")

__all__ = ["UcxTransport", "rdma_devices"]

#: How long a wait polls before sleeping on the worker's event fd. Compiled helpers
#: (``binding._NATIVE_C``): a transfer polls ``MC_UCX_BUSY_POLL_US`` (default 50 us, as our tcp
#: transport's MC_TCP_BUSY_POLL_US) and the progress thread twice that after serving an event (as
#: our tcp server), so a peer's back-to-back stream needs no thread wake-up; polls that find
#: nothing back off, because on a loaded host a poll only takes the core the peer needs. Measured
#: on this 2-core host under load, 4 KiB over UCX's tcp lane against our tcp: with these polls
#: 0.4-1.8x, with no poll in the progress thread 1.9-3.1x (docs/benchmarks-log.md).
#: Without a compiler (Python loops, GIL held between calls) a poll costs more than it saves:
#: waits poll PY_SPIN_S, the thread not at all (measured 2-3x slower with 32 polling calls).
PY_SPIN_S = 10e-6
#: longest such sleep (events wake it first; the deadline is checked after it)
WAIT_S = 0.005
#: longest sleep on the event fd (a safety net: events should wake us first)
IDLE_WAIT_S = 0.05
#: bytes per slice when a batch is spread over several rails (one request may span them)
SLICE_BYTES = 1 << 20
#: bytes per window: posted together, closed by one flush (the unit a failed rail gives back)
WINDOW_BYTES = 4 << 20
#: windows in flight per rail (the next is posted while the previous one drains)
DEPTH = 2
#: a single transfer at least this large is split over the rail's workers (MC_WORKERS_PER_CTX),
#: each piece moved by its own thread; below, handing a piece to a thread costs more than it saves
SPLIT_BYTES = 2 << 20


def rdma_devices() -> dict[str, list[int]]:
    """RDMA devices of this host and their ports (sysfs)."""
    out: dict[str, list[int]] = {}
    try:
        names = os.listdir("/sys/class/infiniband")
    except OSError:
        return out
    for n in names:
        try:
            out[n] = sorted(int(p) for p in os.listdir(f"/sys/class/infiniband/{n}/ports") if p.isdigit())
        except OSError:
            out[n] = [1]
    return out


class _Peer:
    """One endpoint to one peer worker and the remote keys unpacked on it.

    ``pidfd``: for a peer on this host (same boot and pid namespace), a pidfd of its process.
    Why: UCX's shared-memory lanes deliver small puts into a FIFO the target drains; when the
    target is dead nobody drains it and the flush still succeeds -- bytes silently lost. A
    pidfd turns readable when the process exits, so one poll after the flush tells.
    """

    __slots__ = ("ep", "address", "rkeys", "lanes", "lane_label", "pidfd", "w", "closed_flag")

    def __init__(self, ep: int, address: bytes, lanes: list[str], pidfd: int, w: "_Worker") -> None:
        self.w = w  # the worker this endpoint lives on (one of the rail's)
        # set under the rail's worker lock when the endpoint is closed; a C int, because the
        # compiled post (``NativeWorker.rma``) reads it under that lock too
        self.closed_flag = ctypes.c_int(0)
        self.ep = ep
        self.address = address
        self.rkeys: dict[int, int] = {}  # remote region addr -> unpacked rkey handle
        self.lanes = lanes
        self.lane_label = "+".join(lanes) or "unknown"
        self.pidfd = pidfd

    @property
    def closed(self) -> bool:
        return bool(self.closed_flag.value)

    @closed.setter
    def closed(self, value: bool) -> None:
        self.closed_flag.value = int(value)

    def dead(self) -> bool:
        return self.pidfd >= 0 and bool(select.select([self.pidfd], [], [], 0)[0])

    def close_pidfd(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


def _pidfd_of(desc: SegmentDescriptor, boot_id: str, pidns: str) -> int:
    """A pidfd of the peer's process when it runs on this host in our pid namespace, else -1."""
    if not desc.same_host_as(boot_id, pidns):
        return -1
    try:
        if desc.start_time and process_start_time(desc.pid) != desc.start_time:
            raise TransferError(f"segment {desc.name!r}: process {desc.pid} is gone", peer_down=True)
        return os.pidfd_open(desc.pid)
    except (OSError, AttributeError):
        return -1


class _Worker:
    """A UCP worker of its rail's context, one lock around every call into it, and its progress
    thread.

    With the compiled helpers (``binding.native``) the lock is a pthread mutex and the waits and
    the progress thread's loop run in C without the GIL: a transfer's caller posts, flushes and
    progresses in one call, and the progress thread (which stands aside while a caller
    progresses) never competes with it for the GIL. Without a compiler the same logic runs in
    Python (correct, slower)."""

    def __init__(self, ucp: Ucp, ctx: int) -> None:
        self.ucp = ucp
        self.worker = ucp.worker_create(ctx)
        try:
            self.efd = ucp.worker_efd(self.worker)
            self.address = ucp.worker_address(self.worker)
            lib = native()
            self.native = NativeWorker(lib, ucp, self.worker, self.efd) if lib is not None else None
        except BaseException:
            ucp.worker_destroy(self.worker)
            raise
        from concurrent.futures import ThreadPoolExecutor
        # the thread that moves this worker's part of a split transfer (started on first use)
        self._pieces = ThreadPoolExecutor(max_workers=1, thread_name_prefix="te-ucx-part")
        self.spin_s = envs.MC_UCX_BUSY_POLL_US / 1e6 if self.native is not None else PY_SPIN_S
        self.lock: Any = self.native.lock if self.native is not None else threading.Lock()
        self.waiters = 0  # callers progressing the worker themselves right now (Python path)
        self._unwatched = threading.Event()  # set while no caller progresses the worker (Python path)
        self._unwatched.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="te-ucx-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self.native is not None:
            self.native.run(2 * self.spin_s, IDLE_WAIT_S)
            return
        ucp, w = self.ucp, self.worker
        quiet_since = 0.0
        while not self._stop.is_set():
            if self.waiters:  # a caller is progressing: stay out of its way until the last one leaves
                self._unwatched.wait(IDLE_WAIT_S)
                continue
            with self.lock:
                n = ucp.progress(w)
            quiet_since = self.idle_step(n, quiet_since, 0.0, IDLE_WAIT_S)

    def idle_step(self, events: int, quiet_since: float, spin_s: float, wait_s: float,
                  deadline: float | None = None) -> float:
        """After a progress call that found ``events``: keep spinning while the worker has been
        quiet for less than ``spin_s`` (since ``quiet_since``; 0 = it was not quiet), else sleep
        on its event fd for at most ``wait_s`` (and not past ``deadline``). The new quiet_since."""
        if events:
            return 0.0
        now = time.perf_counter()
        if not quiet_since:
            quiet_since = now
        if now - quiet_since < spin_s:
            return quiet_since
        with self.lock:
            armed = self.ucp.worker_arm(self.worker)
        if armed:
            if deadline is not None:
                wait_s = min(wait_s, max(0.0, deadline - time.monotonic()))
            select.select([self.efd], [], [], wait_s)
        return 0.0

    def enter(self) -> None:
        """A caller progresses this worker itself from now on (the thread stands aside)."""
        if self.native is not None:
            self.native.enter()
            return
        with self.lock:
            self.waiters += 1
            self._unwatched.clear()

    def leave(self) -> None:
        if self.native is not None:
            self.native.leave()
            return
        with self.lock:
            self.waiters -= 1
            if not self.waiters:
                self._unwatched.set()

    def wait(self, req: int | None, deadline: float) -> int:
        """Progress until ``req`` completes (its status) or the deadline (UCS_INPROGRESS)."""
        if req is None:
            return UCS_OK
        self.enter()
        try:
            if self.native is not None:
                return self.native.wait(req, self.spin_s, WAIT_S, deadline)
            ucp, w = self.ucp, self.worker
            it = 0
            quiet_since = 0.0
            while True:
                with self.lock:
                    n = ucp.progress(w)
                    st = ucp.request_status(req)
                if st != UCS_INPROGRESS:
                    with self.lock:
                        ucp.request_free(req)
                    return st
                it += 1
                if it & 255 == 0 and time.monotonic() > deadline:
                    with self.lock:
                        ucp.request_free(req)  # released when UCX completes it (cancelled by the close)
                    return UCS_INPROGRESS
                quiet_since = self.idle_step(n, quiet_since, self.spin_s, WAIT_S, deadline)
        finally:
            self.leave()

    def rma(self, p: "_Peer", write: bool, local: int, length: int, remote: int, rkey: int, deadline: float) -> int:
        """One put/get on ``p``'s endpoint, flushed and progressed here until it completes (the
        status) or the deadline (UCS_INPROGRESS). UcxError when the post or the flush fails, or
        the endpoint was closed by another transfer meanwhile."""
        call = "ucp_put_nbx" if write else "ucp_get_nbx"
        if self.native is not None:
            st, stage = self.native.rma(write, p.ep, p.closed_flag, local, length, remote, rkey, self.spin_s, WAIT_S,
                                        deadline)
            if stage == -1:
                raise UcxError(call, st, "endpoint closed by another transfer meanwhile")
            if stage < 2 and st < 0:
                raise UcxError(call if stage == 0 else "ucp_ep_flush_nbx", st, self.ucp.status_text(st))
            return st
        with self.lock:
            if p.closed:
                raise UcxError(call, -24, "endpoint closed by another transfer meanwhile")
            self.ucp.post(write, p.ep, local, length, remote, rkey)
            req = self.ucp.ep_flush(p.ep)
        return self.wait(req, deadline)

    def submit(self, deadline: float, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on this worker's part thread (a Future): a part of a split transfer
        posted and waited there runs beside the caller's own part, without the GIL in between.
        A part still queued at ``deadline`` (behind other transfers' parts) is not started: the
        caller has given up, and nothing may land in its buffers afterwards."""
        def part() -> Any:
            if time.monotonic() > deadline:
                raise TransferError("timed out (deadline passed before this worker was free)", peer_down=False)
            return fn(*args)
        return self._pieces.submit(part)

    def close(self) -> None:
        self._pieces.shutdown(wait=True)
        self._stop.set()
        self._unwatched.set()
        if self.native is not None:
            self.native.stop()
        self._thread.join(timeout=2.0)
        with self.lock:
            self.ucp.worker_destroy(self.worker)
        if self.native is not None and not self._thread.is_alive():
            self.native.free()


class _Rail:
    """One NIC (or every device, for a single rail): its UCP context, its workers (``w`` is the
    first: batches and multi-NIC windows run there), memory handles, and state.

    Why several workers: one worker is one thread's worth of progress -- on shared memory one
    ``process_vm_writev`` at a time, on tcp one socket's copies on each side. A large transfer
    split over ``MC_WORKERS_PER_CTX`` workers, each piece driven by its own thread against its
    own peer worker, moves as our cma and tcp transports do with two copy threads /
    connections (bench/transfer/bench_ucx.py: 64 MiB over shared memory 8.2 -> 13.5 GB/s).
    The workers share the context, so memory is mapped (on RDMA: registered) once."""

    def __init__(self, index: int, group: str, ucp: Ucp, config: dict[str, str], tuning: dict[str, str],
                 n_workers: int) -> None:
        self.index = index
        self.group = group              # UCX_NET_DEVICES of this rail ("" = all)
        self.name = plan.rail_name(group)
        self.ucp = ucp
        self.ctx = ucp.init(config, shared=n_workers > 1, tuning=tuning)
        self.workers: list[_Worker] = []
        try:
            for _ in range(n_workers):
                self.workers.append(_Worker(ucp, self.ctx))
        except BaseException:
            self.close()
            raise
        self.w = self.workers[0]
        # context calls (mem_map, rkey_pack) from the engine's threads, one at a time
        self.ctx_lock = threading.Lock()
        self.memh: dict[int, tuple[int, str]] = {}  # region addr -> (memh, packed rkey b64)
        self.down_until = 0.0           # monotonic time before which this rail is not used

    def up(self, now: float) -> bool:
        return now >= self.down_until

    def context_info(self) -> str:
        return self.ucp.context_info(self.ctx)

    def section(self) -> dict[str, Any]:
        addrs = [base64.b64encode(w.address).decode() for w in self.workers]
        # "worker": the first, as before (a peer that knows only it uses that one for everything)
        return {"dev": self.name, "worker": addrs[0], "workers": addrs,
                "rkeys": {str(a): packed for a, (_, packed) in self.memh.items()}}

    def map(self, addr: int, length: int) -> tuple[int, str]:
        """``ucp_mem_map`` a region once for every worker; (memh, packed remote key, base64)."""
        with self.ctx_lock, self.w.lock:
            memh = self.ucp.mem_map(self.ctx, addr, length)
            try:
                return memh, base64.b64encode(self.ucp.rkey_pack(self.ctx, memh)).decode()
            except BaseException:
                self.ucp.mem_unmap(self.ctx, memh)
                raise

    def unmap(self, memh: int) -> None:
        with self.ctx_lock, self.w.lock:
            self.ucp.mem_unmap(self.ctx, memh)

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.ucp.cleanup(self.ctx)


class _Window:
    __slots__ = ("start", "end", "nbytes", "req", "t0", "peer")

    def __init__(self, start: int, end: int, nbytes: int) -> None:
        self.start, self.end, self.nbytes = start, end, nbytes
        self.req: int | None = None
        self.t0 = 0.0
        self.peer: _Peer | None = None


class UcxTransport(Transport):
    """One-sided transfers through UCX (see module docstring). Inert unless the engine was
    initialized with ``protocol="rdma"`` and a libucp was found."""

    name = "ucx"
    hints = ("rdma",)
    priority = 50
    capabilities = Capabilities(locations=frozenset({"cpu"}), array_batches=True)
    section_version = 1
    single_max = 1 << 30

    def __init__(self, ctx: TransportContext | None = None) -> None:
        super().__init__(ctx)
        self.rails: list[_Rail] = []
        self.library: LoadedUcp | None = None
        self.lanes: list[lanes_mod.Resource] = []
        self._peers: dict[tuple[str, int, int, str], _Peer] = {}  # (segment, rail, worker, peer address)
        self._plock = threading.Lock()
        self._section: dict[str, Any] | None = None
        self._topo: topology.Topology = {}
        if ctx is None or ctx.protocol != "rdma":
            return
        if envs.MC_FORCE_TCP:  # as the original: MC_FORCE_TCP=1 serves protocol "rdma" over tcp, NICs unused
            log.warning("protocol 'rdma' asked with MC_FORCE_TCP=1: using tcp, device_name not used",
                        extra={"device_name": ctx.device_name})
            return
        try:
            self.library = load()
        except UcxNotFound as e:
            log.warning(f"protocol 'rdma' asked, but {e}; using tcp / same-host transports instead",
                        extra={"device_name": ctx.device_name})
            return
        for mc in lanes_mod.ORIGINAL_TO_UCX:  # parsed (a bad value is a ValueError naming it) before UCX sees it
            getattr(envs, mc)
        config = lanes_mod.mc_config(os.environ)
        # ValueError naming an unknown device: initialize fails
        net = lanes_mod.net_devices(ctx.device_name, rdma_devices(), netutil.net_interfaces(), envs.MC_IB_PORT)
        ucp = Ucp(self.library.lib)
        groups = plan.rail_groups(net)
        # which NICs a region's slices go to first (NUMA node / GPU); ValueError on a bad custom matrix
        self._topo = topology.local(ctx.device_name, envs.MC_CUSTOM_TOPO_JSON) if len(groups) > 1 else {}
        # the devices each rail's context sees: its NIC group, else the user's UCX_NET_DEVICES,
        # else (no RDMA device here) the one tcp interface of this engine's host -- with a
        # single tcp device UCX keeps tcp PUT, which crashes with several (lanes_mod.tuning)
        tcp_ifaces = netutil.interface_addresses()
        user_devices = os.environ.get("UCX_NET_DEVICES", "").strip()
        own = None
        if not net and not user_devices and not rdma_devices():
            own = lanes_mod.default_tcp_interface(tcp_ifaces, netutil.resolve(ctx.hostname),
                                                  netutil.default_route_source())
        tunes: list[dict[str, str]] = []
        try:
            for i, group in enumerate(groups):
                devices = group or own
                cfg = {**config, **({"NET_DEVICES": devices} if devices else {})}
                tune = lanes_mod.tuning(os.environ, lanes_mod.tcp_device_count(devices or user_devices, tcp_ifaces))
                tunes.append(tune)
                self.rails.append(_Rail(i, group, ucp, cfg, tune, envs.MC_WORKERS_PER_CTX))
        except BaseException:
            self.close()
            raise
        self.lanes = [r for rail in self.rails for r in lanes_mod.resources(rail.context_info())]
        if lanes_mod.has_cuda(self.lanes):
            # this UCX moves GPU memory itself (cuda_copy/cuda_ipc; GPUDirect RDMA where the NIC and
            # driver allow): cuda:N regions are served without pinned-host staging. An instance
            # attribute on purpose: what this UCX can do is known only once it is loaded.
            setattr(self, "capabilities", Capabilities(locations=frozenset({"cpu", "cuda"}), array_batches=True,
                                                       local_device=True))
        log.info("UCX loaded", extra={"library": self.library.path, "source": self.library.source,
                                      "version": ucp.version(), "net_devices": net or own or user_devices or "all",
                                      "config": config, "tuning": tunes, "rails": [r.name for r in self.rails],
                                      "workers_per_nic": envs.MC_WORKERS_PER_CTX,
                                      "lanes": sorted({r.lane for r in self.lanes})})
        warning = lanes_mod.no_rdma_warning(self.lanes, self.library.source, self.library.path,
                                            sorted(rdma_devices()))
        if warning:
            log.warning(warning)
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        memlock = lanes_mod.memlock_warning(-1 if soft == resource.RLIM_INFINITY else soft,
                                            -1 if hard == resource.RLIM_INFINITY else hard, self.lanes)
        if memlock:
            log.warning(memlock)
        self._section = {"rails": [r.section() for r in self.rails]}

    @property
    def active(self) -> bool:
        return bool(self.rails)

    # ------------------------------------------------------------------ registration
    def register_region(self, region: Region) -> None:
        done: list[_Rail] = []
        try:
            for rail in self.rails:
                memh, packed = rail.map(region.addr, region.length)
                with self._plock:
                    rail.memh[region.addr] = (memh, packed)
                done.append(rail)
        except BaseException:
            for rail in done:
                self._unmap(rail, region.addr)
            raise
        finally:
            self._republish()

    def _unmap(self, rail: _Rail, addr: int) -> None:
        with self._plock:
            got = rail.memh.pop(addr, None)
        if got is not None:
            rail.unmap(got[0])

    def _republish(self) -> None:
        if self.rails:
            with self._plock:
                self._section = {"rails": [r.section() for r in self.rails]}

    def unregister_region(self, region: Region) -> None:
        for rail in self.rails:
            self._unmap(rail, region.addr)
        self._republish()

    def descriptor_section(self) -> dict[str, Any] | None:
        return self._section

    # ------------------------------------------------------------------ peers
    def can_reach(self, desc: SegmentDescriptor) -> bool:
        if not self.rails:
            return False
        sec = desc.section(self.name, self.section_version)
        c = self.ctx
        ourselves = c is not None and desc.same_host_as(c.boot_id, c.pidns) and desc.pid == os.getpid()
        return bool(sec and sec.get("rails")) and not ourselves

    def _remote(self, desc: SegmentDescriptor) -> list[dict[str, Any]]:
        sec = desc.section(self.name, self.section_version)
        rails = sec.get("rails") if sec else None
        if not rails:
            raise TransferError(f"segment {desc.name!r} publishes no UCX worker address (peer not on protocol "
                                "'rdma', or another version)")
        return list(rails)

    def endpoint(self, desc: SegmentDescriptor, rail: _Rail, remote: list[dict[str, Any]],
                 k: int = 0) -> tuple[_Peer, dict]:
        """The endpoint from ``rail``'s worker ``k`` to the peer rail it pairs with (that rail's
        worker ``k``, or its only one), and that rail's rkeys."""
        r = remote[plan.pair(rail.name, rail.index, [str(x.get("dev", "")) for x in remote])]
        addrs = r.get("workers") or [r["worker"]]
        published = str(addrs[k % len(addrs)])
        key = (desc.name, rail.index, k, published)  # the published (base64) address: decoded once, below
        p = self._peers.get(key)
        if p is None:
            with self._plock:
                p = self._peers.get(key)
                if p is None:
                    address = base64.b64decode(published)
                    w = rail.workers[k]
                    with w.lock:
                        ep = w.ucp.ep_create(w.worker, address, envs.MC_UCX_PEER_ERRORS)
                        info = w.ucp.ep_info(ep)
                    found = lanes_mod.ep_lanes(info)
                    c = self.ctx
                    pidfd = _pidfd_of(desc, c.boot_id, c.pidns) if c is not None else -1
                    p = _Peer(ep, address, lanes_mod.rma_lanes(found), pidfd, w)
                    self._peers[key] = p
                    log.info("UCX endpoint to peer", extra={"segment": desc.name, "rail": rail.name, "worker": k,
                                                            "peer_worker": k % len(addrs),
                                                            "peer_rail": r.get("dev"),
                                                            "lanes": [ln.name for ln in found], "rma_lanes": p.lanes})
        return p, r.get("rkeys", {})

    def rkey_handles(self, p: _Peer, rkeys: dict[str, str], desc: SegmentDescriptor, addrs: list[int]) -> np.ndarray:
        """Unpacked remote keys (handles) of the peer's regions at ``addrs`` on ``p``'s endpoint."""
        out = np.empty(len(addrs), dtype=np.int64)
        w = p.w
        for i, addr in enumerate(addrs):
            rk = p.rkeys.get(addr)
            if rk is None:
                packed = rkeys.get(str(addr))
                if packed is None:
                    raise TransferError(f"segment {desc.name!r} published no UCX remote key for its region at "
                                        f"{addr:#x}", ErrorCode.INVALID_PARAMS)
                with w.lock:
                    if p.closed:
                        raise TransferError(f"endpoint over {p.lane_label} closed meanwhile", peer_down=True)
                    rk = p.rkeys.get(addr)  # another thread may have unpacked it meanwhile: one handle each
                    if rk is None:
                        rk = p.rkeys[addr] = w.ucp.rkey_unpack(p.ep, base64.b64decode(packed))
            out[i] = rk
        return out

    def cached_endpoint(self, segment: str, rail_index: int, worker: int = 0) -> _Peer | None:
        """The endpoint of ``rail_index``'s worker ``worker`` to ``segment``."""
        with self._plock:
            return next((p for k, p in self._peers.items() if k[:3] == (segment, rail_index, worker)), None)

    def drop_peer(self, desc: SegmentDescriptor) -> None:
        with self._plock:
            gone = [k for k in self._peers if k[0] == desc.name]
            peers = [self._peers.pop(k) for k in gone]
        for p in peers:
            self._close_ep(p, time.monotonic() + 2.0)

    def _close_ep(self, p: _Peer, deadline: float) -> None:
        w = p.w
        with w.lock:
            if p.closed:
                return
            p.closed = True
            for rk in p.rkeys.values():
                w.ucp.rkey_destroy(rk)
            p.rkeys.clear()
            req = w.ucp.ep_close_force(p.ep)
        p.close_pidfd()
        w.wait(req, deadline)

    def forget_endpoint(self, p: _Peer) -> None:
        """Close ``p``'s endpoint (cancelling what is outstanding); the next use reconnects."""
        with self._plock:
            for k, v in list(self._peers.items()):
                if v is p:
                    del self._peers[k]
        try:
            self._close_ep(p, time.monotonic() + 1.0)
        except UcxError as e:
            log.warning("closing a UCX endpoint failed", extra={"error": str(e)})

    # ------------------------------------------------------------------ transfers
    def transfer(self, desc: SegmentDescriptor, reqs: list[TransferRequest], deadline: float) -> None:
        if not self.rails:
            raise TransferError("the ucx transport is not active (protocol 'rdma' not asked, or no UCX found)")
        reqs = [r for r in reqs if r.length > 0]
        if not reqs:
            return
        writes = [r for r in reqs if r.opcode == TransferOpcode.WRITE]
        for group, write in ((writes, True), ([r for r in reqs if r.opcode != TransferOpcode.WRITE], False)):
            if group:
                arr = np.array([(r.local_addr, r.remote_addr, r.length) for r in group], dtype=np.int64)
                self._run(desc, write, arr[:, 0], arr[:, 1], arr[:, 2], deadline)

    def transfer_arrays(self, desc: SegmentDescriptor, opcode: TransferOpcode, local: np.ndarray,
                        remote: np.ndarray, length: np.ndarray, deadline: float) -> None:
        """A large batch: the region (remote key) of every block found with numpy; blocks posted
        from one C loop per window where it was compiled (``binding.batch_helper``)."""
        if not self.rails:
            raise TransferError("the ucx transport is not active")
        self._run(desc, opcode == TransferOpcode.WRITE, local, remote, length, deadline)

    def _check_memory(self, desc: SegmentDescriptor, regions: Sequence[Region]) -> None:
        """A forced ``transport_hint="rdma"`` must not hand GPU memory to a UCX without cuda lanes
        (it would treat a device pointer as host memory)."""
        if self.capabilities.serves("cuda:0"):
            return
        bad = next((r for r in regions if location_kind(r.location) != "cpu"), None)
        if bad is not None:
            raise TransferError(f"segment {desc.name!r} region at {bad.addr:#x} is {bad.location} memory, and this "
                                "UCX has no cuda lane (UCX_TLS, or a UCX built without CUDA)", ErrorCode.INVALID_PARAMS)

    def _run(self, desc: SegmentDescriptor, write: bool, local: np.ndarray, remote: np.ndarray,
             length: np.ndarray, deadline: float) -> None:
        remote_rails = self._remote(desc)
        regs = sorted(desc.buffers, key=lambda r: r.addr)
        starts = np.array([r.addr for r in regs], dtype=np.int64)
        region = np.searchsorted(starts, remote, side="right") - 1
        if len(region) and (region < 0).any():
            raise TransferError(f"a range at {int(remote[int(np.argmax(region < 0))]):#x} is outside segment "
                                f"{desc.name!r}", ErrorCode.INVALID_PARAMS)
        self._check_memory(desc, [regs[int(i)] for i in np.unique(region)])
        now = time.monotonic()
        up = [r for r in self.rails if r.up(now)] or list(self.rails)  # every rail paused: try them all
        reserve: list[_Rail] = []
        if len(up) > 1 and self._topo and self.ctx is not None:
            own = self.ctx.regions.find(int(local[0]), 1)
            loc = own.location if own is not None and ":" in own.location else "cpu:0"
            first, _ = topology.preferred(self._topo, loc, [r.name for r in up])
            up, reserve = [r for r in up if r.name in first], [r for r in up if r.name not in first]
        addrs = [r.addr for r in regs]
        n_workers = len(up[0].workers)
        if len(up) == 1 and not reserve and n_workers > 1 and int(length.sum()) >= SPLIT_BYTES:
            # one NIC: the batch split over its workers, each part a run of its own on its own thread
            local, remote, length, region = plan.slice_blocks(local, remote, length, region, SLICE_BYTES)
            parts = plan.split_blocks(length, n_workers)
            runs = [(_Run(self, desc, write, local[a:b], remote[a:b], length[a:b], region[a:b], addrs, remote_rails,
                          deadline, k), plan.windows(length[a:b], WINDOW_BYTES)) for k, (a, b) in enumerate(parts)]
            futures = [up[0].workers[k].submit(deadline, run.go, up, order, [])
                       for k, (run, order) in enumerate(runs) if k]
            self._join(desc, futures, lambda: runs[0][0].go(up, runs[0][1], []), deadline)
            return
        if len(up) > 1:
            local, remote, length, region = plan.slice_blocks(local, remote, length, region, SLICE_BYTES)
        order = [w for w in plan.windows(length, WINDOW_BYTES)]
        run = _Run(self, desc, write, local, remote, length, region, addrs, remote_rails, deadline)
        run.go(up, order, reserve)

    @staticmethod
    def _join(desc: SegmentDescriptor, futures: list[Any], own: Any, deadline: float) -> None:
        """Run ``own()`` here while the ``futures`` (the other workers' parts of one transfer) run
        on their threads; wait for all (each ends by the deadline), then raise the first error."""
        error: TransferError | None = None
        try:
            own()
        except TransferError as e:
            error = e
        for f in futures:
            try:
                f.result(timeout=max(0.0, deadline - time.monotonic()) + 5.0)
            except TransferError as e:
                error = error or e
            except Exception as e:  # noqa: BLE001 -- a part's failure becomes this transfer's error
                error = error or TransferError(f"ucx transfer to segment {desc.name!r}: a part failed: {e!r}",
                                               peer_down=True)
        if error is not None:
            raise error

    def transfer_one(self, desc: SegmentDescriptor, opcode: int, local: int, remote: int, length: int,
                     deadline: float) -> None:
        """The latency path: one request on the first rail that is up -- post, flush, wait. A
        request larger than a window, with several rails up, is spread over them instead."""
        now = time.monotonic()
        up = [r for r in self.rails if r.up(now)]
        region = desc.find_region(remote, length)
        if not up or region is None or length <= 0 or (len(up) > 1 and length > WINDOW_BYTES):
            super().transfer_one(desc, opcode, local, remote, length, deadline)
            return
        self._check_memory(desc, [region])
        rail = up[0]
        write = opcode == TransferOpcode.WRITE
        remote_rails = self._remote(desc)
        cuts = plan.pieces(length, len(rail.workers) if length >= SPLIT_BYTES else 1)
        if len(cuts) == 1:
            self._piece(desc, rail, 0, remote_rails, write, local, length, remote, region.addr, deadline)
            return
        # the other workers' pieces on their own threads, the first here; every piece ends by the deadline
        futures = [rail.workers[k].submit(deadline, self._piece, desc, rail, k, remote_rails, write, local + off, n,
                                          remote + off, region.addr, deadline)
                   for k, (off, n) in enumerate(cuts) if k]
        self._join(desc, futures, lambda: self._piece(desc, rail, 0, remote_rails, write, local, cuts[0][1], remote,
                                                      region.addr, deadline), deadline)

    def _piece(self, desc: SegmentDescriptor, rail: _Rail, k: int, remote_rails: list[dict[str, Any]], write: bool,
               local: int, length: int, remote: int, region_addr: int, deadline: float) -> None:
        """One contiguous put/get on ``rail``'s worker ``k``, posted, flushed and waited here; its
        endpoint is closed (the next use reconnects) when it fails or times out."""
        p, rkeys = self.endpoint(desc, rail, remote_rails, k)
        rk = int(self.rkey_handles(p, rkeys, desc, [region_addr])[0])
        w = p.w
        try:
            st = w.rma(p, write, local, length, remote, rk, deadline)
        except UcxError as e:
            self.forget_endpoint(p)
            raise TransferError(f"ucx transfer to segment {desc.name!r} over {p.lane_label} failed: {e}",
                                peer_down=True) from None
        why = ("timed out (deadline passed; peer dead or unreachable)" if st == UCS_INPROGRESS
               else f"failed: {w.ucp.status_text(st)}" if st != UCS_OK
               else f"failed: the peer's process {desc.pid} exited" if p.dead() else "")
        if why:
            self.forget_endpoint(p)
            raise TransferError(f"ucx transfer to segment {desc.name!r} over {p.lane_label} {why}", peer_down=True)
        metrics.lane_bytes(self.name, p.lane_label, "write" if write else "read", length)

    def close(self) -> None:
        rails, self.rails = self.rails, []
        with self._plock:
            peers, self._peers = list(self._peers.values()), {}
        for p in peers:
            try:
                self._close_ep(p, time.monotonic() + 1.0)
            except UcxError:
                pass
        for rail in rails:
            for memh, _ in rail.memh.values():
                try:
                    rail.unmap(memh)
                except UcxError:
                    pass
            rail.memh.clear()
            rail.close()


class _Run:
    """One transfer spread over rails: windows pulled from one queue, a failed rail's
    unfinished windows given back (see the module docstring)."""

    def __init__(self, t: UcxTransport, desc: SegmentDescriptor, write: bool, local: np.ndarray,
                 remote: np.ndarray, length: np.ndarray, region: np.ndarray, region_addrs: list[int],
                 remote_rails: list[dict[str, Any]], deadline: float, k: int = 0) -> None:
        self.t, self.desc, self.write, self.deadline = t, desc, write, deadline
        self.k = k  # which of each rail's workers this run uses (a split transfer runs one per worker)
        self.local, self.remote, self.length, self.region = local, remote, length, region
        self.region_addrs = region_addrs
        self.remote_rails = remote_rails
        self.keys: dict[int, tuple[_Peer, np.ndarray]] = {}  # rail index -> (endpoint, rkey handle per block)
        self.reserve: list[_Rail] = []  # rails that join when every live one failed

    def worker(self, rail: _Rail) -> _Worker:
        """The worker of ``rail`` this run posts on and progresses."""
        return rail.workers[self.k]

    def _open(self, rail: _Rail) -> tuple[_Peer, np.ndarray]:
        """The rail's current endpoint and the remote key of every block on it (unpacked again
        when the endpoint changed: another transfer may have closed the old one)."""
        p, rkeys = self.t.endpoint(self.desc, rail, self.remote_rails, self.k)
        got = self.keys.get(rail.index)
        if got is None or got[0] is not p:
            used = np.unique(self.region)
            handles = self.t.rkey_handles(p, rkeys, self.desc, [self.region_addrs[int(i)] for i in used])
            table = np.zeros(len(self.region_addrs), dtype=np.int64)
            table[used] = handles
            got = self.keys[rail.index] = (p, table[self.region])
        return got

    def _post(self, rail: _Rail, win: _Window) -> None:
        p, keys = self._open(rail)
        a, b = win.start, win.end
        w = self.worker(rail)
        with w.lock:
            if p.closed:  # closed by a failing transfer since _open: never post on a freed endpoint
                raise TransferError(f"endpoint over {p.lane_label} closed meanwhile")
            if b - a == 1:
                w.ucp.post(self.write, p.ep, int(self.local[a]), int(self.length[a]), int(self.remote[a]),
                           int(keys[a]))
            else:
                w.ucp.post_many(self.write, p.ep, self.local[a:b], self.remote[a:b], self.length[a:b], keys[a:b])
            win.req = w.ucp.ep_flush(p.ep)
        win.t0 = time.monotonic()
        win.peer = p

    def go(self, up: list[_Rail], order: list[tuple[int, int]], reserve: list[_Rail]) -> None:
        """Move every window over the ``up`` rails; the ``reserve`` ones (NICs farther from the
        memory) join only when all of those failed."""
        from collections import deque
        queue = deque(_Window(a, b, int(self.length[a:b].sum())) for a, b in order)
        inflight: dict[int, deque[_Window]] = {r.index: deque() for r in up + reserve}
        live = {r.index: r for r in up}
        self.reserve = list(reserve)
        entered = list(up)
        for r in up:
            self.worker(r).enter()
        slice_timeout = envs.MC_SLICE_TIMEOUT  # read once: an environment lookup per loop costs ~3 us
        clock = time.perf_counter
        try:
            it = 0
            quiet_since = 0.0
            while queue or any(inflight.values()):
                for idx, rail in list(live.items()):  # fill: each live rail keeps DEPTH windows in flight
                    while queue and len(inflight[idx]) < DEPTH:
                        win = queue.popleft()
                        try:
                            self._post(rail, win)
                        except (UcxError, TransferError) as e:
                            queue.appendleft(win)
                            self._fail(rail, live, inflight, queue, f"failed: {e}")
                            break
                        inflight[idx].append(win)
                events = 0
                for idx, rail in list(live.items()):
                    q = inflight[idx]
                    if not q:
                        continue
                    w = self.worker(rail)
                    with w.lock:
                        events += w.ucp.progress(w.worker)
                        done = []
                        while q and (q[0].req is None or w.ucp.request_status(q[0].req) != UCS_INPROGRESS):
                            win = q.popleft()
                            st = UCS_OK if win.req is None else w.ucp.request_status(win.req)
                            if win.req is not None:
                                w.ucp.request_free(win.req)
                            done.append((win, st))
                    for k, (win, st) in enumerate(done):
                        assert win.peer is not None
                        why = (f"failed: {w.ucp.status_text(st)}" if st != UCS_OK else
                               f"failed: the peer's process {self.desc.pid} exited" if win.peer.dead() else "")
                        if why:  # this window and the ones after it go back (a dead peer's "done" means nothing)
                            queue.extendleft(reversed([d[0] for d in done[k:]]))
                            self._fail(rail, live, inflight, queue, why)
                            break
                        metrics.lane_bytes(self.t.name, win.peer.lane_label, "write" if self.write else "read",
                                           win.nbytes)
                it += 1
                if not events and len(live) == 1 and not self.reserve:
                    events = self._wait_head(next(iter(live.values())), inflight)
                now = time.monotonic()
                if it & 63 == 0 or not events:
                    if now > self.deadline:
                        for idx, rail in list(live.items()):
                            self._fail(rail, live, inflight, queue, "timed out (deadline passed; peer dead or "
                                       "unreachable)", pause=False)
                        continue
                    if (len(live) > 1 or self.reserve) and slice_timeout > 0:  # only when another NIC can take over
                        for idx, rail in list(live.items()):
                            q = inflight[idx]
                            if q and now - q[0].t0 > slice_timeout and (len(live) > 1 or self.reserve):
                                self._fail(rail, live, inflight, queue,
                                           f"made no progress for {slice_timeout:g} s (MC_SLICE_TIMEOUT)")
                if events:
                    quiet_since = 0.0
                elif not quiet_since:
                    quiet_since = clock()
                if quiet_since and clock() - quiet_since >= PY_SPIN_S:
                    fds = []
                    for idx, rail in live.items():
                        if inflight[idx]:
                            w = self.worker(rail)
                            with w.lock:
                                if w.ucp.worker_arm(w.worker):
                                    fds.append(w.efd)
                                else:
                                    fds = []
                                    break
                    if fds:
                        select.select(fds, [], [], min(WAIT_S, max(0.0, self.deadline - time.monotonic())))
                    quiet_since = 0.0
                if not live and self.reserve:  # the preferred NICs all failed: the others take over
                    for r in self.reserve:
                        live[r.index] = r
                        self.worker(r).enter()
                        entered.append(r)
                    log.warning("UCX: the NICs preferred for this memory failed, using the others",
                                extra={"segment": self.desc.name, "rails": [r.name for r in self.reserve]})
                    self.reserve = []
        finally:
            for r in entered:
                self.worker(r).leave()

    def _wait_head(self, rail: _Rail, inflight: dict) -> int:
        """One rail left: wait for its oldest window in one compiled call (progressing the worker,
        no GIL held) until it completes, the deadline, or a short slice of time (the loop then
        checks the deadline and posts the next window). 1 when the window completed, else 0."""
        q = inflight[rail.index]
        w = self.worker(rail)
        if w.native is None or not q or q[0].req is None:
            return 0
        until = min(self.deadline, time.monotonic() + IDLE_WAIT_S)
        return int(w.native.poll(q[0].req, w.spin_s, WAIT_S, until) != UCS_INPROGRESS)

    def _fail(self, rail: _Rail, live: dict[int, _Rail], inflight: dict, queue: Any, why: str,
              pause: bool = True) -> None:
        """Take ``rail`` out of this transfer (and, paused, out of the next ones for a while):
        cancel its operations, give its unfinished windows back; raise when none is left."""
        live.pop(rail.index, None)
        q = inflight.get(rail.index)
        peer = None
        while q:
            win = q.pop()
            peer = peer or win.peer
            if win.req is not None:
                w = self.worker(rail)
                with w.lock:
                    w.ucp.request_free(win.req)  # released when the close cancels it
                win.req = None
            queue.appendleft(win)
        peer = peer or self.t.cached_endpoint(self.desc.name, rail.index, self.k)
        label = peer.lane_label if peer is not None else rail.name
        if peer is not None:
            self.t.forget_endpoint(peer)
        self.keys.pop(rail.index, None)
        if pause and (live or self.reserve):
            rail.down_until = time.monotonic() + envs.MC_RDMA_RAIL_PAUSE_SECONDS
            log.warning("UCX rail taken out, its slices retried on the others", extra={
                "segment": self.desc.name, "rail": rail.name, "lanes": label, "why": why,
                "pause_s": envs.MC_RDMA_RAIL_PAUSE_SECONDS, "remaining": [r.name for r in live.values()]})
            return
        if not live and not (pause and self.reserve):
            raise TransferError(f"ucx transfer to segment {self.desc.name!r} over {label} {why}", peer_down=True)

