"""The core of one store client: lifecycle, the in-flight gate and the error boundary.

The parts it builds at ``setup`` and drops at ``close`` (docs/architecture.md):

* ``write_path.WritePath``: every put (placement, writing replicas, publication or revoke,
  the reservations that make a put one round trip);
* ``read_path.ReadPath``: every read (replica choice, leases, epoch confirmation, batches as
  arrays, ranges);
* ``maintenance.Maintenance``: background work (heartbeat, re-mount and re-report after a
  master change, SSD-tier offload, promotion of disk hits).

They share the master stub, the Transfer Engine, the segment view (``local_view``), the
owned index and the metrics, each handed to them; none of them knows the core. The core
counts data-path calls in and out (``close`` waits for them before unmapping our segment)
and turns ``MooncakeError`` into the upstream integer codes at the public boundary
(``call`` / ``call_list``). ``StoreCore`` satisfies ``internals.StoreInternals``, which is
all the API delegates know of it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import numpy as np

from mooncake_core import envs
from mooncake_core.errors import MooncakeError
from mooncake_core.store.client_metrics import ClientMetrics
from mooncake_core.store.codes import EXISTS, INTERNAL, INVALID, NOT_FOUND, OK, RPC_FAIL
from mooncake_core.store.config import StoreConfig
from mooncake_core.store.internals import EngineLike, Parts
from mooncake_core.store.local_view import SegmentView
from mooncake_core.store.maintenance import Maintenance
from mooncake_core.store.master_client import MasterClient
from mooncake_core.store.offload import OffloadFiles
from mooncake_core.store.owned import OwnedIndex
from mooncake_core.store.protocol import BatchGetReply, GetReply, ReplicaDesc
from mooncake_core.store.read_path import ReadPath
from mooncake_core.store.segment import StoreSegment
from mooncake_core.store.types import ReplicateConfig
from mooncake_core.store.validate import has_port, host_of
from mooncake_core.store.write_path import WritePath
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.net import (SEGMENT_PORT_RANGE, endpoint_host, free_port_in_range, is_loopback,
                                     loopback_warning)

__all__ = ["StoreCore"]

log = get_logger("mooncake.store.client")

T = TypeVar("T")


def _engine_segment_name(engine: Any, local_hostname: str) -> str:
    """The segment name peers see for ``engine`` (ours, or one handed to ``setup``)."""
    for attr in ("get_local_segment_name", "get_segment_name"):
        fn = getattr(engine, attr, None)
        if callable(fn):
            try:
                name = fn()
                if name:
                    return str(name)
            except Exception:  # noqa: BLE001 - fall back to host:rpc_port
                pass
    name = getattr(engine, "local_segment_name", None) or getattr(engine, "segment_name", None)
    if isinstance(name, str) and name:
        return name
    if local_hostname.count(":") == 1 and local_hostname.rsplit(":", 1)[1].isdigit():
        return local_hostname
    return f"{local_hostname}:{engine.get_rpc_port()}"


def _set_up(part: T | None) -> T:
    """A part that exists between setup and close (MooncakeError -600 outside)."""
    if part is None:
        raise MooncakeError(INVALID, "store is not set up (call setup() first) or is closed")
    return part


class StoreCore:
    """Lifecycle, in-flight gate and error boundary of one ``MooncakeDistributedStore``; its
    data path is the ``WritePath`` and ``ReadPath`` built at setup (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.ready = False
        self.cfg: StoreConfig | None = None
        self._engine: Any = None
        self._own_engine = False
        self._master: MasterClient | None = None
        self.client_id = ""
        self.local = SegmentView()  # our segment, its name and host, the mount epoch, the SSD tier
        self.local_buffer_size = 0  # setup's local_buffer_size: the most one bytes-value put may stage
        self.owned = OwnedIndex()
        self.registered: dict[int, int] = {}
        self.mounted = False  # a master accepted our segment: close() unmounts it (else nothing to undo)
        self.maintenance = Maintenance(self)
        self._metrics: ClientMetrics | None = None
        self._writes: WritePath | None = None  # built at setup, dropped at close
        self._reads: ReadPath | None = None
        self._http_server: Any = None
        # data-path calls in flight: close() waits for them before unmapping our segment, so
        # a concurrent memcpy from/to it never touches freed memory
        self._inflight = 0
        self._inflight_cv = threading.Condition()

    @property
    def master(self) -> MasterClient:
        return _set_up(self._master)

    @property
    def engine(self) -> EngineLike:
        return _set_up(self._engine)

    @property
    def engine_or_none(self) -> EngineLike | None:
        """The Transfer Engine, or None when the store is not set up or closed."""
        return self._engine

    @property
    def writes(self) -> WritePath:
        return _set_up(self._writes)

    @property
    def reads(self) -> ReadPath:
        return _set_up(self._reads)

    # the segment view's fields, as the API delegates and maintenance read them
    @property
    def segment(self) -> StoreSegment | None:
        return self.local.segment

    @property
    def segment_name(self) -> str:
        return self.local.name

    @property
    def offload(self) -> OffloadFiles | None:
        return self.local.offload

    # ================================================================== setup / teardown
    def start(self, cfg: StoreConfig, engine: Any) -> int:
        """``setup`` after argument parsing: 0, or the negative code of the service that
        could not be reached (everything half-built is torn down again)."""
        rpc_timeout = envs.MC_STORE_RPC_TIMEOUT
        if rpc_timeout is not None:
            cfg.rpc_timeout = rpc_timeout
        with self.lock:
            if self.ready:
                raise RuntimeError("setup: this store is already set up (call close() first)")
            try:
                self._setup(cfg, engine)
            except MooncakeError as e:
                # name the setting to fix: frameworks (LMCache) often log nothing else
                hint = (f" (check master_server_address={cfg.master_server_addr!r})"
                        if e.code == RPC_FAIL and "master_server_address" not in str(e) else "")
                log.error("store setup failed: %s%s", e, hint, extra={"master": cfg.master_server_addr})
                self.teardown(quiet=True)
                return e.code
            except OSError as e:
                log.error("store setup failed: %s", e)
                self.teardown(quiet=True)
                return INTERNAL
            except BaseException:
                self.teardown(quiet=True)
                raise
        return OK

    def _setup(self, cfg: StoreConfig, engine: Any) -> None:
        self.cfg = cfg
        self.local_buffer_size = int(cfg.local_buffer_size)
        self.client_id = uuid.uuid4().hex
        # 1. Transfer Engine: our segment's name is its local_hostname ("host:port").
        if engine is None:
            from mooncake_core.engine import TransferEngine

            te = TransferEngine()
            te_host = cfg.local_hostname
            if cfg.metadata_server.upper() != "P2PHANDSHAKE" and not has_port(te_host):
                # segment names must be unique per process: like upstream, add a random
                # port from its range (12300-14300)
                te_host = f"{te_host}:{free_port_in_range(*SEGMENT_PORT_RANGE)}"
            rc = te.initialize(te_host, cfg.metadata_server, cfg.protocol, cfg.rdma_devices)
            if rc != 0:
                raise MooncakeError(rc if rc < 0 else INTERNAL,
                                    f"TransferEngine.initialize({te_host!r}, {cfg.metadata_server!r}, "
                                    f"{cfg.protocol!r}, {cfg.rdma_devices!r}) failed with {rc}: "
                                    f"{te.last_error or 'see the log'}")
            engine = te
            self._own_engine = True
        self._engine = engine
        self.local.name = _engine_segment_name(engine, cfg.local_hostname)
        self.local.host = host_of(self.local.name)
        meta_host = endpoint_host(cfg.metadata_server)
        if meta_host is None or is_loopback(meta_host):  # else the engine warned already (toward metadata)
            warning = loopback_warning(self.segment_name, cfg.master_server_addr, what="store client")
            if warning:
                log.warning(warning, extra={"segment": self.segment_name, "master": cfg.master_server_addr})
        # 2. master connection
        self._master = MasterClient(cfg.master_server_addr, timeout=cfg.rpc_timeout)
        # first contact: no master there fails in milliseconds, not after the RPC deadline
        info = self._master.ping(refused_is_final=True)
        # 3. contribute memory
        if cfg.global_segment_size > 0:
            seg = StoreSegment(cfg.global_segment_size)
            self.local.segment = seg
            rc = engine.register_memory(seg.addr, seg.size, "cpu:0")
            if rc not in (0, None):
                raise MooncakeError(INTERNAL, f"register_memory of the {seg.size}-byte segment failed: {rc}")
            self.mount()
        else:
            # no segment to mount: learn the master's SSD-tier dir from the ping
            if info.enable_offload and info.root_fs_dir and not cfg.ssd_offload_path:
                self._use_offload_dir(info.root_fs_dir)
        if cfg.enable_ssd_offload or cfg.ssd_offload_path:
            path = cfg.ssd_offload_path or envs.MOONCAKE_OFFLOAD_FILE_STORAGE_PATH
            if path:
                self.local.offload = OffloadFiles(path)
        metrics = self._setup_metrics(cfg)
        self._writes = WritePath(self.client_id, self._master, engine, self.local, self.owned, metrics)
        self._reads = ReadPath(self._master, engine, self.local, metrics, self.maintenance.promote)
        self.ready = True
        self.maintenance.start()
        log.info("store client ready", extra={"segment": self.segment_name, "client_id": self.client_id,
                                               "segment_bytes": cfg.global_segment_size,
                                               "master": cfg.master_server_addr})

    def _use_offload_dir(self, root: str) -> None:
        try:
            self.local.offload = OffloadFiles(root)
        except OSError as e:
            log.warning("cannot use SSD tier dir %s: %s", root, e)

    def mount(self) -> None:
        """Mount our segment at the master (again, after a master change)."""
        seg = self.segment
        assert seg is not None
        reply = self.master.mount_segment(self.client_id, self.segment_name, seg.addr, seg.size, self.local.epoch)
        self.local.epoch = reply.epoch  # a reservation of another epoch is not used (reservations)
        self.mounted = True
        if reply.root_fs_dir and reply.enable_offload and self.local.offload is None:
            self._use_offload_dir(reply.root_fs_dir)

    def _setup_metrics(self, cfg: StoreConfig) -> ClientMetrics:
        metrics = self._metrics = ClientMetrics()
        if cfg.enable_client_http_server:
            from prometheus_client import start_http_server

            self._http_server = start_http_server(cfg.client_http_port, registry=metrics.registry)
        return metrics

    def count(self, op: str, rc: int, nbytes: int = 0, t0: float | None = None) -> None:
        if self._metrics is not None:
            self._metrics.count(op, rc, nbytes, t0)

    def close(self) -> int:
        with self.lock:
            if not self.ready and self._engine is None and self._master is None:
                return OK
            self.teardown(quiet=False)
        return OK

    def teardown(self, quiet: bool) -> None:
        with self._inflight_cv:
            self.ready = False
        self.maintenance.stop()
        drained = self._wait_drained(30.0)
        if self._master is not None and self.segment is not None and self.mounted:
            try:
                self._master.unmount_segment(self.client_id, self.segment_name, refused_is_final=True)
            except Exception as e:  # noqa: BLE001 - best effort on the way out
                if not quiet:
                    log.warning("unmount_segment at close failed: %s", e)
        if self._engine is not None:
            self._release_engine()
        self.registered.clear()
        if self._master is not None:
            try:
                self._master.close()
            except Exception:  # noqa: BLE001
                pass
        if self._http_server is not None:
            try:
                self._http_server[0].shutdown()
            except Exception:  # noqa: BLE001
                pass
            self._http_server = None
        if self.segment is not None:
            if drained:
                self.segment.close()
            else:  # a call is still running against it: leak the mapping rather than crash
                log.warning("close(): data-path calls still running after 30 s; segment memory kept mapped")
        self.local.segment = None
        self.mounted = False
        self._engine = None
        self._master = None
        self._writes = None  # with their reservations: the master frees them with our mount
        self._reads = None
        self.owned.clear()

    def _release_engine(self) -> None:
        """Unregister our memory; close the engine if we started it (an engine handed to
        ``setup`` belongs to the caller)."""
        engine = self._engine
        seg = self.local.segment
        for addr in ([seg.addr] if seg is not None else []) + list(self.registered):
            try:
                engine.unregister_memory(addr)
            except Exception:  # noqa: BLE001
                pass
        if self._own_engine:
            for name in ("close", "shutdown"):
                fn = getattr(engine, name, None)
                if callable(fn):
                    try:
                        fn()
                    except Exception:  # noqa: BLE001
                        pass
                    break

    def health_check(self) -> int:
        """0 healthy, 1 not set up / closed, 2 master unreachable (upstream convention)."""
        if not self.ready:
            return 1
        try:
            self.master.exist_key("__mooncake_health__")
        except MooncakeError:
            return 2
        return 0

    def _wait_drained(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._inflight_cv:
            while self._inflight > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._inflight_cv.wait(left)
        return True

    def enter(self, what: str) -> None:
        with self._inflight_cv:
            self.require_ready(what)
            self._inflight += 1

    def exit(self) -> None:
        with self._inflight_cv:
            self._inflight -= 1
            if self._inflight == 0:
                self._inflight_cv.notify_all()

    def require_ready(self, what: str) -> None:
        if not self.ready:
            raise MooncakeError(INVALID, f"{what}: store is not set up (call setup() first) or is closed")

    # ================================================================== data path (through the gate)
    def put_many(self, keys: list[str], srcs: list[Parts] | None, cfg: ReplicateConfig, *, upsert: bool,
                 op: str, flat: tuple[list[int], list[int], list[Any] | None] | None = None) -> list[int]:
        """Core of every put: one code per key (``WritePath.put``). ``srcs[i]`` = the (address,
        size) parts whose concatenation is object i; or ``flat`` = (addresses, sizes, the bytes
        objects or None) when every object is one piece (``srcs`` may then be None)."""
        refused = cfg.refusal()
        if refused:  # a config upstream answers with INVALID_PARAMS, not an exception
            log.warning("%s: %s", op, refused)
            return [INVALID] * len(keys)
        self.enter(op)
        try:
            return self.writes.put(keys, srcs, cfg, upsert=upsert, op=op, flat=flat)
        finally:
            self.exit()

    def read_batch(self, keys: list[str], dests: list[Any], op: str) -> list[int]:
        """Read each key into ``dests[i]``: a list of (addr, capacity) parts filled in order,
        or None to allocate a fresh bytes object (stored back into ``dests[i]`` as
        ``(bytes, size)``). Returns per-key bytes read or a negative code (``ReadPath``)."""
        self.enter(op)
        try:
            return self.reads.read_batch(keys, dests, op)
        finally:
            self.exit()

    def read_ranges(self, keys: list[str], reply: BatchGetReply, t_req: float, kix: np.ndarray,
                    addr: np.ndarray, off: np.ndarray, size: np.ndarray, op: str) -> np.ndarray | None:
        """``ReadPath.read_ranges`` (the caller holds the gate)."""
        return self.reads.read_ranges(keys, reply, t_req, kix, addr, off, size, op)

    def stale_reservations(self) -> list[int]:
        """``WritePath.stale_reservations``; [] when not set up."""
        w = self._writes
        return w.stale_reservations() if w is not None else []

    def remember_owned(self, key: str, replicas: Iterable[ReplicaDesc], version: Any) -> None:
        """After put_end: re-report this object after a master change if it lives in our
        segment and the put really published it (``version`` > 0)."""
        self.writes.remember_owned(key, replicas, version)

    def forget(self, keys: Iterable[str]) -> None:
        self.owned.discard(keys)

    def write_replicas(self, jobs: list[tuple[Parts, int, ReplicaDesc]], skip: set[str] | None = None) -> None:
        """``WritePath.write_replicas`` (copy/move tasks write their source's bytes with it)."""
        self.writes.write_replicas(jobs, skip)

    def pick_order(self, replicas: Sequence[ReplicaDesc]) -> list[ReplicaDesc]:
        """Memory replicas first (ours, then same host, then others), disk replicas last."""
        return self.reads.pick_order(replicas)

    def fetch_replicas(self, keys: list[str]) -> list[GetReply | int]:
        """One master round trip: a lease'd replica list (or an error code) per key."""
        return self.reads.fetch_replicas(keys)

    def leading_epoch(self) -> tuple[int, str]:
        """(epoch of the master leading now, "") by one ping, or (-1, why) when it cannot be told."""
        return self.reads.leading_epoch()

    # ================================================================== error boundary
    def call(self, fn: Callable[[], int], keepalive: Any = None, need_ready: str | None = None) -> int:
        """Run ``fn`` turning MooncakeError into its code (never raising into user code for
        runtime failures; argument errors were raised before this point)."""
        try:
            if need_ready:
                self.require_ready(need_ready)
            return fn()
        except MooncakeError as e:
            if e.code not in (NOT_FOUND, EXISTS):
                log.warning("%s", e)
            return e.code
        finally:
            del keepalive

    def call_list(self, fn: Callable[[], list[int]], n: int, keepalive: Any = None,
                  need_ready: str | None = None) -> list[int]:
        try:
            if need_ready:
                self.require_ready(need_ready)
            return fn()
        except MooncakeError as e:
            log.warning("%s", e)
            return [e.code] * n
        finally:
            del keepalive
