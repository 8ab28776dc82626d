"""``protocol="rdma"``: one-sided READ/WRITE through UCX's UCP API.

The same calls run over verbs / RoCE / EFA lanes on RDMA NICs and over tcp / shared-memory
lanes elsewhere, so CI exercises the real code path (docs/transfer-engine.md says what was
measured on which lanes).

* **One UCP context and worker per engine**, with a progress thread. A peer's one-sided
  operations need no help from us on RDMA lanes, but on tcp lanes UCX emulates GET (and
  completes PUT) with messages the *target* must progress, so every engine keeps
  progressing. The thread sleeps on the worker's event fd (``ucp_worker_arm``) when idle
  and stands aside while a caller of this engine waits on its own transfer (that caller
  progresses the worker itself: no lock ping-pong on the hot path).
* **Registration**: each region the engine registers is ``ucp_mem_map``-ed; its packed
  remote key, and this worker's address, go into our section of the segment descriptor
  (``descriptor["transports"]["ucx"]``) -- peers need no second listener or handshake.
* **A transfer**: the endpoint to the peer is created on first use from its worker address
  (its lanes logged once), remote keys are unpacked once per region, each request is one
  ``ucp_put_nbx`` / ``ucp_get_nbx``, and completion is one ``ucp_ep_flush_nbx`` progressed
  until done or the deadline -- never ``ucp_worker_flush``, which cannot time out. On a
  deadline or an error the endpoint is force-closed (its outstanding operations are
  cancelled, so no late byte lands in a buffer the caller reuses) and the peer is reported
  down; the next call reconnects.
* **Notifications** go over the engine's control channel after ``transfer`` returned, i.e.
  after the flush completed: in order after the data.

Peer failure: endpoints are created without UCX's peer error handling by default, because
UCX then refuses shared-memory lanes and halves tcp PUT bandwidth (measured); a dead peer is
found by the transfer's deadline instead. ``MC_UCX_PEER_ERRORS=1`` turns it on (fast failure,
fewer lanes).
"""

from __future__ import annotations

import base64
import os
import select
import threading
import time
from typing import Any

import numpy as np

from mooncake_core import envs
from mooncake_core.errors import ErrorCode
from mooncake_core.transfer import metrics
from mooncake_core.transfer.base import (Capabilities, Transport, TransportContext, TransferError, TransferOpcode,
                                         TransferRequest)
from mooncake_core.transfer.descriptor import SegmentDescriptor, process_start_time
from mooncake_core.transfer.memory import Region
from mooncake_core.transfer.ucx import lanes as lanes_mod
from mooncake_core.transfer.ucx.binding import UCS_INPROGRESS, UCS_OK, Ucp, UcxError
from mooncake_core.transfer.ucx.library import LoadedUcp, UcxNotFound, load
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.te.ucx")

__all__ = ["UcxTransport", "rdma_devices", "net_interfaces"]

#: progress calls a waiter spins before it sleeps on the worker's event fd
SPIN = 2000
#: longest sleep on the event fd (a safety net: events should wake us first)
IDLE_WAIT_S = 0.05


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


def net_interfaces() -> list[str]:
    try:
        return sorted(os.listdir("/sys/class/net"))
    except OSError:
        return []


class _Peer:
    """One endpoint to one peer worker and the remote keys unpacked on it.

    ``pidfd``: for a peer on this host (same boot and pid namespace), a pidfd of its process.
    Why: UCX's shared-memory lanes deliver small puts into a FIFO the target drains; when the
    target is dead nobody drains it and the flush still succeeds -- bytes silently lost. A
    pidfd turns readable when the process exits, so one poll after the flush tells.
    """

    __slots__ = ("ep", "address", "rkeys", "lanes", "lane_label", "pidfd")

    def __init__(self, ep: int, address: bytes, lanes: list[str], pidfd: int) -> None:
        self.ep = ep
        self.address = address
        self.rkeys: dict[int, int] = {}  # remote region addr -> unpacked rkey handle
        self.lanes = lanes
        self.lane_label = "+".join(lanes) or "unknown"
        self.pidfd = pidfd

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
    """A UCP context + worker, one lock around every call into it, and its progress thread."""

    def __init__(self, ucp: Ucp, config: dict[str, str]) -> None:
        self.ucp = ucp
        self.ctx = ucp.init(config)
        try:
            self.worker = ucp.worker_create(self.ctx)
            self.efd = ucp.worker_efd(self.worker)
            self.address = ucp.worker_address(self.worker)
        except BaseException:
            ucp.cleanup(self.ctx)
            raise
        self.lock = threading.Lock()
        self.waiters = 0  # callers progressing the worker themselves right now
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="te-ucx-progress", daemon=True)
        self._thread.start()

    def context_info(self) -> str:
        import ctypes
        f = self.ucp.lib.ucp_context_print_info
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        f.restype = None
        return self.ucp._capture(f, self.ctx)

    def _run(self) -> None:
        ucp, w = self.ucp, self.worker
        idle = 0
        while not self._stop.is_set():
            if self.waiters:
                time.sleep(0.0005)  # a caller is progressing: stay out of its way
                continue
            with self.lock:
                n = ucp.progress(w)
            if n:
                idle = 0
                continue
            idle += 1
            if idle < 64:
                continue
            with self.lock:
                armed = ucp.worker_arm(w)
            if armed:
                select.select([self.efd], [], [], IDLE_WAIT_S)
            idle = 0

    def wait(self, req: int | None, deadline: float) -> int:
        """Progress until ``req`` completes (its status) or the deadline (UCS_INPROGRESS)."""
        if req is None:
            return UCS_OK
        ucp, w = self.ucp, self.worker
        with self.lock:
            self.waiters += 1
        try:
            spins = 0
            while True:
                with self.lock:
                    n = ucp.progress(w)
                    st = ucp.request_status(req)
                if st != UCS_INPROGRESS:
                    with self.lock:
                        ucp.request_free(req)
                    return st
                if n:
                    spins = 0
                    continue
                spins += 1
                if spins & 255 == 0 and time.monotonic() > deadline:
                    with self.lock:
                        ucp.request_free(req)  # released when UCX completes it (cancelled by the close)
                    return UCS_INPROGRESS
                if spins > SPIN:
                    with self.lock:
                        armed = ucp.worker_arm(w)
                    if armed:
                        select.select([self.efd], [], [], min(0.001, max(0.0, deadline - time.monotonic())))
                    spins = 0
        finally:
            with self.lock:
                self.waiters -= 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        with self.lock:
            self.ucp.worker_destroy(self.worker)
            self.ucp.cleanup(self.ctx)


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
        self._w: _Worker | None = None
        self.library: LoadedUcp | None = None
        self.lanes: list[lanes_mod.Resource] = []
        self._memh: dict[int, tuple[int, str]] = {}  # region addr -> (memh, packed rkey b64)
        self._peers: dict[tuple[str, bytes], _Peer] = {}
        self._plock = threading.Lock()
        self._section: dict[str, Any] | None = None
        if ctx is None or ctx.protocol != "rdma":
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
        net = lanes_mod.net_devices(ctx.device_name, rdma_devices(), net_interfaces(), envs.MC_IB_PORT)
        if net:
            config["NET_DEVICES"] = net
        ucp = Ucp(self.library.lib)
        self._w = _Worker(ucp, config)
        self.lanes = lanes_mod.resources(self._w.context_info())
        log.info("UCX loaded", extra={"library": self.library.path, "source": self.library.source,
                                      "version": ucp.version(), "net_devices": net or "all", "config": config,
                                      "lanes": sorted({r.lane for r in self.lanes})})
        warning = lanes_mod.no_rdma_warning(self.lanes, self.library.source, self.library.path,
                                            sorted(rdma_devices()))
        if warning:
            log.warning(warning)
        self._section = {"worker": base64.b64encode(self._w.address).decode(), "rkeys": {}}

    @property
    def active(self) -> bool:
        return self._w is not None

    # ------------------------------------------------------------------ registration
    def register_region(self, region: Region) -> None:
        w = self._w
        if w is None:
            return
        with w.lock:
            memh = w.ucp.mem_map(w.ctx, region.addr, region.length)
            try:
                packed = base64.b64encode(w.ucp.rkey_pack(w.ctx, memh)).decode()
            except BaseException:
                w.ucp.mem_unmap(w.ctx, memh)
                raise
        with self._plock:
            self._memh[region.addr] = (memh, packed)
            self._section = {**(self._section or {}), "rkeys": {**(self._section or {}).get("rkeys", {}),
                                                                str(region.addr): packed}}

    def unregister_region(self, region: Region) -> None:
        w = self._w
        if w is None:
            return
        with self._plock:
            got = self._memh.pop(region.addr, None)
            if self._section is not None:
                rk = dict(self._section.get("rkeys", {}))
                rk.pop(str(region.addr), None)
                self._section = {**self._section, "rkeys": rk}
        if got is not None:
            with w.lock:
                w.ucp.mem_unmap(w.ctx, got[0])

    def descriptor_section(self) -> dict[str, Any] | None:
        return self._section

    # ------------------------------------------------------------------ peers
    def can_reach(self, desc: SegmentDescriptor) -> bool:
        if self._w is None:
            return False
        sec = desc.section(self.name, self.section_version)
        c = self.ctx
        ourselves = c is not None and desc.same_host_as(c.boot_id, c.pidns) and desc.pid == os.getpid()
        return bool(sec and sec.get("worker")) and not ourselves

    def _peer(self, desc: SegmentDescriptor) -> tuple[_Peer, dict[str, str]]:
        w = self._w
        assert w is not None
        sec = desc.section(self.name, self.section_version)
        if not sec or not sec.get("worker"):
            raise TransferError(f"segment {desc.name!r} publishes no UCX worker address (peer not on protocol "
                                "'rdma', or another version)")
        address = base64.b64decode(sec["worker"])
        key = (desc.name, address)
        p = self._peers.get(key)
        if p is None:
            with self._plock:
                p = self._peers.get(key)
                if p is None:
                    with w.lock:
                        ep = w.ucp.ep_create(w.worker, address, envs.MC_UCX_PEER_ERRORS)
                        info = w.ucp.ep_info(ep)
                    found = lanes_mod.ep_lanes(info)
                    c = self.ctx
                    pidfd = _pidfd_of(desc, c.boot_id, c.pidns) if c is not None else -1
                    p = _Peer(ep, address, lanes_mod.rma_lanes(found), pidfd)
                    self._peers[key] = p
                    log.info("UCX endpoint to peer", extra={"segment": desc.name, "lanes": [ln.name for ln in found],
                                                            "rma_lanes": p.lanes})
        return p, sec.get("rkeys", {})

    def _rkey(self, p: _Peer, rkeys: dict[str, str], desc: SegmentDescriptor, addr: int) -> int:
        rk = p.rkeys.get(addr)
        if rk is None:
            packed = rkeys.get(str(addr))
            if packed is None:
                raise TransferError(f"segment {desc.name!r} published no UCX remote key for its region at "
                                    f"{addr:#x}", ErrorCode.INVALID_PARAMS)
            w = self._w
            assert w is not None
            with w.lock:
                rk = w.ucp.rkey_unpack(p.ep, base64.b64decode(packed))
            p.rkeys[addr] = rk
        return rk

    def drop_peer(self, desc: SegmentDescriptor) -> None:
        with self._plock:
            gone = [k for k in self._peers if k[0] == desc.name]
            peers = [self._peers.pop(k) for k in gone]
        for p in peers:
            self._close_ep(p, time.monotonic() + 2.0)

    def _close_ep(self, p: _Peer, deadline: float) -> None:
        w = self._w
        if w is None:
            return
        with w.lock:
            for rk in p.rkeys.values():
                w.ucp.rkey_destroy(rk)
            p.rkeys.clear()
            req = w.ucp.ep_close_force(p.ep)
        p.close_pidfd()
        w.wait(req, deadline)

    def _fail(self, desc: SegmentDescriptor, p: _Peer, what: str) -> TransferError:
        """Close the endpoint (cancelling what is outstanding) and report the peer down."""
        with self._plock:
            for k, v in list(self._peers.items()):
                if v is p:
                    del self._peers[k]
        self._close_ep(p, time.monotonic() + 2.0)
        return TransferError(f"ucx transfer to segment {desc.name!r} over {p.lane_label} {what}", peer_down=True)

    # ------------------------------------------------------------------ transfers
    def _finish(self, desc: SegmentDescriptor, p: _Peer, deadline: float, write: bool, nbytes: int) -> None:
        w = self._w
        assert w is not None
        try:
            with w.lock:
                req = w.ucp.ep_flush(p.ep)
        except UcxError as e:
            raise self._fail(desc, p, f"failed: {e}") from None
        st = w.wait(req, deadline)
        if st == UCS_INPROGRESS:
            raise self._fail(desc, p, "timed out (deadline passed; peer dead or unreachable)")
        if st != UCS_OK:
            raise self._fail(desc, p, f"failed: {w.ucp.status_text(st)}")
        if p.dead():
            raise self._fail(desc, p, f"failed: the peer's process {desc.pid} exited")
        metrics.lane_bytes(self.name, p.lane_label, "write" if write else "read", nbytes)

    def transfer(self, desc: SegmentDescriptor, reqs: list[TransferRequest], deadline: float) -> None:
        w = self._w
        if w is None:
            raise TransferError("the ucx transport is not active (protocol 'rdma' not asked, or no UCX found)")
        p, rkeys = self._peer(desc)
        groups: dict[bool, int] = {}
        post = w.ucp.post
        try:
            for r in reqs:
                if r.length <= 0:
                    continue
                region = desc.find_region(r.remote_addr, r.length)
                if region is None:
                    raise TransferError(f"{r.length} bytes at {r.remote_addr:#x} outside segment {desc.name!r}",
                                        ErrorCode.INVALID_PARAMS)
                rk = self._rkey(p, rkeys, desc, region.addr)
                write = r.opcode == TransferOpcode.WRITE
                with w.lock:
                    post(write, p.ep, r.local_addr, r.length, r.remote_addr, rk)
                groups[write] = groups.get(write, 0) + r.length
        except UcxError as e:
            raise self._fail(desc, p, f"failed: {e}") from None
        if groups:
            self._finish(desc, p, deadline, True in groups, sum(groups.values()))

    def transfer_arrays(self, desc: SegmentDescriptor, opcode: TransferOpcode, local: np.ndarray,
                        remote: np.ndarray, length: np.ndarray, deadline: float) -> None:
        """A large batch: the region (remote key) of every block found with numpy, then every
        block posted under one lock hold -- from one C loop where it was compiled
        (``binding.batch_helper``) -- and one flush. UCX queues what the wire cannot take yet."""
        w = self._w
        if w is None:
            raise TransferError("the ucx transport is not active")
        p, rkeys = self._peer(desc)
        regs = sorted(desc.buffers, key=lambda r: r.addr)
        starts = np.array([r.addr for r in regs], dtype=np.int64)
        idx = np.searchsorted(starts, remote, side="right") - 1
        keys = np.array([self._rkey(p, rkeys, desc, r.addr) for r in regs], dtype=np.int64)
        write = opcode == TransferOpcode.WRITE
        try:
            with w.lock:
                w.ucp.post_many(write, p.ep, local, remote, length, keys[idx])
        except UcxError as e:
            raise self._fail(desc, p, f"failed: {e}") from None
        self._finish(desc, p, deadline, write, int(length.sum()))

    def close(self) -> None:
        w, self._w = self._w, None
        if w is None:
            return
        with self._plock:
            peers, self._peers = list(self._peers.values()), {}
            memhs, self._memh = list(self._memh.values()), {}
        self._w = w  # _close_ep needs it
        for p in peers:
            try:
                self._close_ep(p, time.monotonic() + 1.0)
            except UcxError:
                pass
        self._w = None
        with w.lock:
            for memh, _ in memhs:
                try:
                    w.ucp.mem_unmap(w.ctx, memh)
                except UcxError:
                    pass
        w.close()
