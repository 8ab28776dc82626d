"""The core of one store client: state, lifecycle and the whole-object data path.

How a call flows (docs/store.md):

* put: ``put_start`` at the master (it allocates replica ranges inside clients' mounted
  segments) -> the bytes go straight from the caller's memory into those ranges (a memcpy
  when the range is in our own segment, else one ``batch_transfer_sync_write`` per target
  segment) -> ``put_end`` (or ``put_revoke`` when a write failed).
* get: ``get_replica_list`` grants a lease -> we read one replica (own segment first, then a
  same-host one, then any) straight into the destination -> the read only counts if the
  lease is still valid afterwards (-707 otherwise: the range may have been reused).
* background work (heartbeat, re-mount and re-report after a master change, SSD-tier
  offload, promotion of disk hits) is ``maintenance.Maintenance``'s.

Errors inside are ``MooncakeError``; ``call`` / ``call_list`` turn them into the upstream
integer codes at the public boundary. ``StoreCore`` satisfies ``internals.StoreInternals``,
which is all the API delegates know of it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from mooncake_core import envs
from mooncake_core.errors import MooncakeError
from mooncake_core.store import batch_path, single_put
from mooncake_core.store.codes import EXISTS, INTERNAL, INVALID, LEASE_EXPIRED, NOT_FOUND, OK, RPC_FAIL, TRANSFER_FAIL
from mooncake_core.store.config import StoreConfig
from mooncake_core.store.internals import EngineLike, Parts
from mooncake_core.store.maintenance import Maintenance
from mooncake_core.store.master_client import MasterClient
from mooncake_core.store.memory import (PREFAULT_MIN, buffer_addr, fingerprint, fingerprint_in, fingerprints,
                                        host_bytes, memmove, new_bytes, populate_range, prefault_enabled, spans)
from mooncake_core.store.offload import OffloadFiles, mem_view
from mooncake_core.transfer import device_memory
from mooncake_core.store.owned import OwnedIndex
from mooncake_core.store.protocol import GetReply, ReplicaDesc, ReplicateConfigMsg
from mooncake_core.store.segment import StoreSegment
from mooncake_core.store.space_wait import start_put
from mooncake_core.store.types import ReplicateConfig
from mooncake_core.store.validate import has_port, host_of
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.net import (SEGMENT_PORT_RANGE, endpoint_host, free_port_in_range, is_loopback,
                                     loopback_warning)

__all__ = ["StoreCore"]

log = get_logger("mooncake.store.client")



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


def _unresponsive(engine: Any, t0: float) -> bool:
    """A transfer that failed after at least half the engine's timeout hit an unresponsive
    peer (stopped, cut off), not a quick refusal: retrying it costs another full timeout."""
    return time.monotonic() - t0 >= 0.5 * float(getattr(engine, "timeout", 30.0) or 30.0)


class StoreCore:
    """State and data path of one ``MooncakeDistributedStore`` (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.ready = False
        self.cfg: StoreConfig | None = None
        self._engine: Any = None
        self._own_engine = False
        self._master: MasterClient | None = None
        self.client_id = ""
        self.segment: StoreSegment | None = None
        self.segment_name = ""
        self.local_buffer_size = 0  # setup's local_buffer_size: the most one bytes-value put may stage
        self.host = ""
        self.owned = OwnedIndex()
        self.registered: dict[int, int] = {}
        self.offload: OffloadFiles | None = None
        self.master_epoch = 0  # epoch of the master our segment is mounted at (0 = not yet)
        self.mounted = False  # a master accepted our segment: close() unmounts it (else nothing to undo)
        self.maintenance = Maintenance(self)
        self._metrics: dict[str, Any] | None = None
        self._children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}  # see count()
        self._msgs: dict[tuple, ReplicateConfigMsg] = {}  # see _placement()
        self.single = single_put.ReservationSlot()  # our next single put's reservation
        self.batch = single_put.ReservationSlot()  # our next batch put's (batch_path.BatchReservation)
        self._http_server: Any = None
        # data-path calls in flight: close() waits for them before unmapping our segment, so
        # a concurrent memcpy from/to it never touches freed memory
        self._inflight = 0
        self._inflight_cv = threading.Condition()

    @property
    def master(self) -> MasterClient:
        m = self._master
        if m is None:
            raise MooncakeError(INVALID, "store is not set up (call setup() first) or is closed")
        return m

    @property
    def engine(self) -> EngineLike:
        e = self._engine
        if e is None:
            raise MooncakeError(INVALID, "store is not set up (call setup() first) or is closed")
        return e

    @property
    def engine_or_none(self) -> Any:
        return self._engine

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
                                    f"{cfg.protocol!r}) failed with {rc}: {te.last_error or 'see the log'}")
            engine = te
            self._own_engine = True
        self._engine = engine
        self.segment_name = _engine_segment_name(engine, cfg.local_hostname)
        self.host = host_of(self.segment_name)
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
            self.segment = seg
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
                self.offload = OffloadFiles(path)
        self._setup_metrics(cfg)
        self.ready = True
        self.maintenance.start()
        log.info("store client ready", extra={"segment": self.segment_name, "client_id": self.client_id,
                                               "segment_bytes": cfg.global_segment_size,
                                               "master": cfg.master_server_addr})

    def _use_offload_dir(self, root: str) -> None:
        try:
            self.offload = OffloadFiles(root)
        except OSError as e:
            log.warning("cannot use SSD tier dir %s: %s", root, e)

    def mount(self) -> None:
        """Mount our segment at the master (again, after a master change)."""
        seg = self.segment
        assert seg is not None
        reply = self.master.mount_segment(self.client_id, self.segment_name, seg.addr, seg.size, self.master_epoch)
        self.master_epoch = reply.epoch  # a reservation of another epoch is not used (single_put)
        self.mounted = True
        if reply.root_fs_dir and reply.enable_offload and self.offload is None:
            self._use_offload_dir(reply.root_fs_dir)

    def _setup_metrics(self, cfg: StoreConfig) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        reg = CollectorRegistry()
        self._metrics = {
            "registry": reg,
            "ops": Counter("mooncake_store_client_ops", "Store client operations", ["op", "result"], registry=reg),
            "bytes": Counter("mooncake_store_client_bytes", "Payload bytes moved", ["op"], registry=reg),
            "latency": Histogram("mooncake_store_client_latency_seconds", "Operation latency", ["op"],
                                 registry=reg),
        }
        if cfg.enable_client_http_server:
            from prometheus_client import start_http_server

            self._http_server = start_http_server(cfg.client_http_port, registry=reg)

    def stale_reservations(self) -> list[int]:
        """Addresses of our reservations held unused past their age, dropped here: the
        heartbeat lets the master free them (``ReservationSlot.release_stale``)."""
        now = time.monotonic()
        return self.single.release_stale(now) + self.batch.release_stale(now)

    def count(self, op: str, rc: int, nbytes: int = 0, t0: float | None = None) -> None:
        m = self._metrics
        if m is None:
            return
        # the labelled children are looked up once per (op, result): ``labels()`` costs a few
        # microseconds (argument checks, a lock, a dict), a share of every single put and get
        result = "ok" if rc >= 0 else str(rc)
        ch = self._children.get((op, result))
        if ch is None:
            ch = self._children[(op, result)] = (m["ops"].labels(op, result), m["bytes"].labels(op),
                                                  m["latency"].labels(op))
        ch[0].inc()
        if nbytes:
            ch[1].inc(nbytes)
        if t0 is not None:
            ch[2].observe(time.perf_counter() - t0)

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
        self.segment = None
        self.mounted = False
        self._engine = None
        self._master = None
        self.owned.clear()
        self.single.clear()
        self.batch.clear()

    def _release_engine(self) -> None:
        """Unregister our memory; close the engine if we started it (an engine handed to
        ``setup`` belongs to the caller)."""
        engine = self._engine
        for addr in ([self.segment.addr] if self.segment is not None else []) + list(self.registered):
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

    # ================================================================== data path: writes
    def write_replicas(self, jobs: list[tuple[Parts, int, ReplicaDesc]], skip: set[str] | None = None) -> None:
        """Write ``(source parts, object size, replica)`` jobs: memcpy into our own segment,
        one ``batch_transfer_sync_write`` per remote segment. Raises MooncakeError(-800).
        ``skip``: segments that just timed out (not tried again; a failing one that took that
        long is added), so one dead peer costs a batch one timeout, not one per key."""
        skip = set() if skip is None else skip
        remote: dict[str, tuple[list[int], list[int], list[int]]] = {}
        mine = self.segment_name if self.segment is not None else None
        for parts, total, rep in jobs:
            own = rep.segment_name == mine
            if own and len(parts) == 1 and parts[0][1] >= total:  # one piece into our memory
                if total:
                    memmove(rep.addr, parts[0][0], total)
                continue
            for src, dst, n in spans(parts, rep.addr, total):
                if own:
                    memmove(dst, src, n)
                else:
                    lists = remote.setdefault(rep.segment_name, ([], [], []))
                    lists[0].append(src)
                    lists[1].append(dst)
                    lists[2].append(n)
        for seg_name, (srcs, dsts, lens) in remote.items():
            if seg_name in skip:
                raise MooncakeError(TRANSFER_FAIL, f"segment {seg_name} did not answer a moment ago; not retried")
            t0 = time.monotonic()
            rc = self.engine.batch_transfer_sync_write(seg_name, srcs, dsts, lens)
            if rc is None or rc < 0:
                if _unresponsive(self.engine, t0):
                    skip.add(seg_name)
                raise MooncakeError(TRANSFER_FAIL, f"write of {sum(lens)} bytes to segment {seg_name} failed ({rc})")

    def put_many(self, keys: list[str], srcs: list[Parts] | None, cfg: ReplicateConfig, *, upsert: bool,
                 op: str, flat: tuple[list[int], list[int], list[Any] | None] | None = None) -> list[int]:
        """Core of every put: returns one code per key. ``srcs[i]`` = the (address, size)
        parts whose concatenation is object i; or ``flat`` = (addresses, sizes, the bytes
        objects or None) when every object is one piece (``srcs`` may then be None). A batch
        goes the array path either way (batch_path.put_flat / put_parts)."""
        refused = cfg.refusal()
        if refused:  # a config upstream answers with INVALID_PARAMS, not an exception
            log.warning("%s: %s", op, refused)
            return [INVALID] * len(keys)
        self.enter(op)
        try:
            if len(keys) > 1:
                if flat is not None:
                    got = batch_path.put_flat(self, keys, flat[0], flat[1], flat[2], self._placement(cfg),
                                              upsert=upsert, op=op)
                else:
                    assert srcs is not None
                    got = batch_path.put_parts(self, keys, srcs, self._placement(cfg), upsert=upsert, op=op)
                if got is not None:
                    return got
            if srcs is None:
                assert flat is not None
                srcs = [[(a, s)] for a, s in zip(flat[0], flat[1])]
            return self._put_many_locked(keys, srcs, cfg, upsert=upsert, op=op)
        finally:
            self.exit()

    def _placement(self, cfg: ReplicateConfig) -> ReplicateConfigMsg:
        """The placement message of ``cfg`` (validated by the caller), built once per distinct
        config: a fresh one (``to_msg`` validates again) costs ~10 us, a share of every single
        put. The cached messages are shared: nothing below mutates them (they are encoded)."""
        segs = cfg.preferred_segments
        ck: tuple | None = (cfg.replica_num, cfg.soft_pin_action, cfg.soft_pin_ttl_ms, bool(cfg.with_hard_pin),
                            cfg.preferred_segment, tuple(segs) if isinstance(segs, (list, tuple)) else segs,
                            bool(cfg.prefer_alloc_in_same_node) and self.segment is not None, self.segment_name)
        try:
            msg = self._msgs.get(ck) if ck is not None else None
        except TypeError:  # an unhashable field: build it every time
            msg, ck = None, None
        if msg is not None:
            return msg
        msg = cfg.to_msg()
        if cfg.prefer_alloc_in_same_node and self.segment is not None \
                and self.segment_name not in msg.preferred_segments:
            msg.preferred_segments.insert(0, self.segment_name)  # local first: a memcpy
        if ck is not None and len(self._msgs) < 256:
            self._msgs[ck] = msg
        return msg

    def _put_many_locked(self, keys: list[str], srcs: list[Parts], cfg: ReplicateConfig, *, upsert: bool,
                         op: str) -> list[int]:
        t0 = time.perf_counter()
        msg = self._placement(cfg)
        master = self.master
        n = len(keys)
        sizes = [parts[0][1] if len(parts) == 1 else sum(sz for _, sz in parts) for parts in srcs]
        if n == 1 and not upsert and self.single.enabled:
            return [single_put.put(self, keys[0], srcs[0], sizes[0], msg, op, t0)]
        allocs: list[list[ReplicaDesc] | int]
        try:
            if n == 1:
                try:
                    allocs = [start_put(lambda: master.upsert_start(self.client_id, keys[0], sizes[0], msg) if upsert
                                        else master.put_start(self.client_id, keys[0], sizes[0], msg))]
                except MooncakeError as e:
                    allocs = [e.code]
            elif upsert:
                allocs = list(master.batch_upsert_start(self.client_id, keys, sizes, msg))
            else:
                allocs = list(master.batch_put_start(self.client_id, keys, sizes, msg))
        except MooncakeError as e:
            return [e.code] * n
        return self.finish_puts(keys, srcs, sizes, allocs, upsert=upsert, op=op, t0=t0)

    def finish_puts(self, keys: list[str], srcs: list[Parts], sizes: list[int], allocs: list[list[ReplicaDesc] | int],
                    *, upsert: bool, op: str, t0: float) -> list[int]:
        """The per-key rest of a put once the master placed it: write, then end/revoke."""
        master = self.master
        n = len(keys)
        results = [OK] * n
        started: list[int] = []
        reps: dict[int, list[ReplicaDesc]] = {}
        for i, a in enumerate(allocs):
            if isinstance(a, int):
                # put of an existing key keeps the old value and counts as success
                results[i] = OK if (a == EXISTS and not upsert) else a
            else:
                started.append(i)
                reps[i] = a
        # write, then end/revoke
        done: list[int] = []
        failed: list[int] = []
        if started:
            jobs = [(srcs[i], sizes[i], rep) for i in started for rep in reps[i]]
            dead: set[str] = set()
            try:
                self.write_replicas(jobs, dead)
                done = started
            except MooncakeError as e:
                # retry key by key so one bad peer fails only its keys (and a peer that timed
                # out is not waited for again)
                if len(started) == 1:
                    failed = started
                    log.warning("%s: %s", op, e)
                else:
                    for i in started:
                        try:
                            self.write_replicas([(srcs[i], sizes[i], rep) for rep in reps[i]], dead)
                            done.append(i)
                        except MooncakeError as e2:
                            log.warning("%s of %r: %s", op, keys[i], e2)
                            failed.append(i)
        if failed:
            fk = [keys[i] for i in failed]
            try:
                if len(fk) == 1:
                    master.put_revoke(self.client_id, fk[0])
                else:
                    master.batch_put_revoke(self.client_id, fk)
            except MooncakeError as e:
                log.warning("put_revoke after failed write: %s", e)
            for i in failed:
                results[i] = TRANSFER_FAIL
        if done:
            dk = [keys[i] for i in done]
            try:
                end_rcs: list[int | None]
                if len(dk) == 1:
                    end_rcs = [master.put_end(self.client_id, dk[0])]
                else:
                    end_rcs = [*master.batch_put_end(self.client_id, dk)] or [None] * len(dk)
            except MooncakeError as e:
                end_rcs = [e.code] * len(dk)
            published = []
            for i, rc in zip(done, end_rcs):
                if isinstance(rc, int) and rc < 0:
                    results[i] = rc
                    continue
                if upsert and rc == 0:
                    # published nothing: the master no longer knew this put (it changed during
                    # the write) and the key is back with another value. 0 would tell the caller
                    # its value replaced the old one while every reader keeps the old one.
                    results[i] = NOT_FOUND
                    log.warning("%s of %r: the master lost the put in progress (restart or failover "
                                "during the write); the value was not published", op, keys[i])
                    self.owned.discard([keys[i]])
                    continue
                published.append((keys[i], reps[i], rc))
            self.remember_owned_many(published)
        total = sum(sizes[i] for i in range(n) if results[i] == OK)
        self.count(op, min(results) if results else OK, total, t0)
        return results

    def remember_owned(self, key: str, replicas: Iterable[ReplicaDesc], version: Any) -> None:
        """After put_end: re-report this object after a master change if it lives in our
        segment and the put really published it (``version`` > 0)."""
        self.remember_owned_many([(key, replicas, version)])

    def remember_owned_many(self, published: Sequence[tuple[str, Iterable[ReplicaDesc], Any]]) -> None:
        """``remember_owned`` of every ``(key, replicas, version)`` of a batch: one pass, one
        lock, fingerprints of all of them at once."""
        seg = self.segment
        if seg is None or not published:
            return
        name = self.segment_name
        if len(published) == 1 and seg.view is not None:  # a single put: no numpy (fixed costs)
            key, replicas, version = published[0]
            mine = next((r for r in replicas if r.segment_name == name), None)
            if not isinstance(version, int) or version <= 0 or mine is None:
                self.owned.discard([key])
            else:
                off = mine.addr - seg.addr
                fp = fingerprint_in(seg.view, off, mine.size) if 0 <= off <= seg.size - mine.size \
                    else fingerprint(mine.addr, mine.size)
                self.owned.add(key, mine, fp, version)
            return
        keys: list[str] = []
        addrs: list[int] = []
        sizes: list[int] = []
        versions: list[int] = []
        gone: list[str] = []
        for key, replicas, version in published:
            if not isinstance(version, int) or version <= 0:
                gone.append(key)  # nothing published (lost to an existing value): not ours
                continue
            for rep in replicas:
                if rep.segment_name == name:
                    keys.append(key)
                    addrs.append(rep.addr)
                    sizes.append(rep.size)
                    versions.append(version)
                    break
            else:
                gone.append(key)
        if gone:
            self.owned.discard(gone)
        if keys:
            a, m = np.array(addrs, np.int64), np.array(sizes, np.int64)
            self.owned.add_batch(name, keys, a, m, self._fingerprints(seg, a, m), np.array(versions, np.int64))

    @staticmethod
    def _fingerprints(seg: StoreSegment, addrs: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """Fingerprints of replicas as written, from our own memory (all at once over a view
        of the segment; a range outside it, never expected, is read on its own)."""
        view = seg.view
        offs = addrs - seg.addr
        if view is not None and bool(((offs >= 0) & (offs + sizes <= seg.size)).all()):
            return fingerprints(view, offs, sizes)
        return np.array([fingerprint(a, m) for a, m in zip(addrs.tolist(), sizes.tolist())], np.uint64)

    def forget(self, keys: Iterable[str]) -> None:
        self.owned.discard(keys)

    # ================================================================== data path: reads
    def pick_order(self, replicas: Sequence[ReplicaDesc]) -> list[ReplicaDesc]:
        """Memory replicas first (ours, then same host, then others), disk replicas last."""
        def rank(r: ReplicaDesc) -> int:
            if r.kind == "disk":
                return 3
            if r.segment_name == self.segment_name:
                return 0
            if host_of(r.segment_name) == self.host:
                return 1
            return 2
        return sorted((r for r in replicas if r.status == "complete"), key=rank)

    def read_replica(self, rep: ReplicaDesc, parts: Parts, size: int) -> None:
        """Read the ``size``-byte object of replica ``rep`` into the destination parts."""
        if rep.kind == "disk":
            if self.offload is None:
                raise MooncakeError(NOT_FOUND, "object is only on the SSD tier and no root_fs_dir is configured")
            if len(parts) == 1 and device_memory.find(parts[0][0], size) is None:
                self.offload.read_into(rep.path, mem_view(parts[0][0], size), size)
            else:
                tmp = bytearray(size)
                self.offload.read_into(rep.path, memoryview(tmp), size)
                tmp_addr = buffer_addr(tmp, "tmp")[0]
                for dst, off, n in spans(parts, 0, size):
                    memmove(dst, tmp_addr + off, n)
            return
        pieces = spans(parts, rep.addr, size)
        if rep.segment_name == self.segment_name and self.segment is not None:
            for dst, src, n in pieces:
                memmove(dst, src, n)
            return
        rc = self.engine.batch_transfer_sync_read(rep.segment_name, [d for d, _, _ in pieces],
                                                  [r for _, r, _ in pieces], [n for _, _, n in pieces])
        if rc is None or rc < 0:
            raise MooncakeError(TRANSFER_FAIL, f"read of {size} bytes from segment {rep.segment_name} failed ({rc})")

    def read_batch(self, keys: list[str], dests: list[Any], op: str) -> list[int]:
        """Read each key into ``dests[i]``: a list of (addr, capacity) parts filled in order,
        or None to allocate a fresh bytes object (stored back into ``dests[i]`` as
        ``(bytes, size)``). Returns per-key bytes read or a negative code."""
        self.enter(op)
        try:
            return self._read_within_leases(keys, dests, op, [d is None for d in dests], 0)
        finally:
            self.exit()

    #: how many times a batch that outlived its lease is split and its late keys read again
    LEASE_SPLITS = 6

    def _read_within_leases(self, keys: list[str], dests: list[Any], op: str, fresh: list[bool],
                            depth: int) -> list[int]:
        """One batched read; then the keys whose read outlived its lease (-707: their bytes
        may come from a reused range, so they were discarded) are read again under fresh
        leases -- in two halves, each of which may split again, up to LEASE_SPLITS times, so a
        batch too large for one lease (original #3076 with a short --default_kv_lease_ttl)
        still completes, and every byte returned was read while its own lease held. A single
        late key is read once more."""
        if len(keys) > 1:
            got = batch_path.read_flat(self, keys, dests, op)
            results = got if got is not None else self._read_batch_locked(keys, dests, op)
        else:
            results = self._read_batch_locked(keys, dests, op)
        late = [i for i, r in enumerate(results) if r == LEASE_EXPIRED]
        if not late or depth >= self.LEASE_SPLITS or (len(late) == 1 and depth > 0):
            return results
        log.info("%s: %d of %d key(s) outlived their lease; reading them again in %s", op, len(late), len(keys),
                 "two halves" if len(late) > 1 else "a second read")
        half = (len(late) + 1) // 2
        for part in (late[:half], late[half:]):
            if not part:
                continue
            sub = [None if fresh[i] else dests[i] for i in part]
            again = self._read_within_leases([keys[i] for i in part], sub, op, [fresh[i] for i in part], depth + 1)
            for j, i in enumerate(part):
                results[i] = again[j]
                if fresh[i]:
                    dests[i] = sub[j]
        return results

    def fetch_replicas(self, keys: list[str]) -> list[GetReply | int]:
        """One master round trip: a lease'd replica list (or an error code) per key."""
        master = self.master
        if len(keys) == 1:
            try:
                return [master.get_replica_list(keys[0])]
            except MooncakeError as e:
                return [e.code]
        return list(master.batch_get_replica_list(keys))

    def _read_batch_locked(self, keys: list[str], dests: list[Any], op: str, retry: bool = True,
                           fetched: tuple[float, list[GetReply | int]] | None = None) -> list[int]:
        """``fetched``: (when the lease was asked for, the replies) already in hand."""
        t0 = time.perf_counter()
        fresh = [d is None for d in dests]
        n = len(keys)
        results: list[int] = [0] * n
        if fetched is not None:
            t_req, replies = fetched
        else:
            t_req = time.monotonic()
            try:
                replies = self.fetch_replicas(keys)
            except MooncakeError as e:
                return [e.code] * n
        remote: dict[str, list[tuple[int, Parts, int, list[ReplicaDesc]]]] = {}
        deadlines = [0.0] * n
        read_parts: list[Parts | None] = [None] * n
        pending_promote: list[int] = []
        prefault = prefault_enabled()
        for i, reply in enumerate(replies):
            if isinstance(reply, int):
                results[i] = reply
                continue
            deadlines[i] = t_req + reply.lease_ttl_ms / 1000.0
            order = self.pick_order(reply.replicas)
            if not order:
                results[i] = NOT_FOUND
                continue
            size = order[0].size
            if dests[i] is None:
                b, addr = new_bytes(size)
                dests[i] = (b, size)
                parts = [(addr, size)]
                if size >= PREFAULT_MIN and prefault:
                    populate_range(addr, size)
            else:
                parts = dests[i]
                cap = sum(c for _, c in parts)
                if cap < size:
                    results[i] = INVALID
                    log.warning("%s(%r): buffer of %d bytes is smaller than the object (%d bytes)",
                                op, keys[i], cap, size)
                    continue
            read_parts[i] = parts
            results[i] = size
            first = order[0]
            if first.kind != "disk" and first.segment_name != self.segment_name and size > 0:
                remote.setdefault(first.segment_name, []).append((i, parts, size, order))
                continue
            try:
                if size:
                    self._read_with_fallback(order, parts, size)
                if first.kind == "disk":
                    pending_promote.append(i)
            except MooncakeError as e:
                results[i] = e.code
        # one batched read per remote segment
        for seg_name, items in remote.items():
            locs: list[int] = []
            rems: list[int] = []
            lens: list[int] = []
            for _, parts, size, order in items:
                for d, r, m in spans(parts, order[0].addr, size):
                    locs.append(d)
                    rems.append(r)
                    lens.append(m)
            t0 = time.monotonic()
            rc = self.engine.batch_transfer_sync_read(seg_name, locs, rems, lens)
            if rc is not None and rc >= 0:
                continue
            # retry one by one to isolate the failing key/replica -- but a segment that did not
            # answer for half a timeout is not asked again: only the other replicas are tried
            gone = _unresponsive(self.engine, t0)
            for i, parts, size, order in items:
                try:
                    self._read_with_fallback([r for r in order if not (gone and r.segment_name == seg_name)],
                                             parts, size, first_error=rc)
                except MooncakeError as e:
                    results[i] = e.code
        now = time.monotonic()
        for i in range(n):
            if results[i] >= 0 and not isinstance(replies[i], int) and now >= deadlines[i]:
                log.warning("%s(%r): lease expired during the read; result discarded", op, keys[i])
                results[i] = LEASE_EXPIRED
        stale = self._confirm_epochs(replies, results, keys, (now - t_req) * 1000.0, op)
        if stale and retry:
            # the master changed under a long read: read those keys again under fresh leases
            # (their owners re-report them to the new master); once, so a flapping master
            # cannot keep us here
            sub_dests = [None if fresh[i] else dests[i] for i in stale]
            again = self._read_batch_locked([keys[i] for i in stale], sub_dests, op, retry=False)
            for j, i in enumerate(stale):
                results[i] = again[j]
                if fresh[i]:
                    dests[i] = sub_dests[j]
        for i in pending_promote:
            got = read_parts[i]
            if results[i] >= 0 and got is not None:
                d = dests[i][0]
                # get(): the fresh bytes object is immutable, share it; get_into: the caller
                # owns the buffer, so the (disk-path only) promotion takes a copy
                data = d if isinstance(d, bytes) else b"".join(
                    host_bytes(a, m) for a, _, m in spans(got, 0, results[i]))
                self.maintenance.promote(keys[i], data)
        self.count(op, min(results) if results else OK, sum(r for r in results if r > 0), t0)
        return results

    def leading_epoch(self) -> tuple[int, str]:
        """(epoch of the master leading now, "") by one ping, or (-1, why) when it cannot be
        told (unreachable, or the address answering is no longer the leader)."""
        try:
            info = self.master.ping(timeout=2.0)
        except MooncakeError as e:
            return -1, str(e)
        if not info.is_leader:
            return -1, f"{self.master.address} is no longer the master leader"
        return info.epoch, ""

    def _confirm_epochs(self, replies: list[GetReply | int], results: list[int], keys: list[str],
                        elapsed_ms: float, op: str) -> list[int]:
        """A read that took longer than the master's ``confirm_after_ms`` is trusted only if
        the master that granted its lease still leads: a new master (restart or HA failover)
        does not know those leases, and may hand the ranges to new puts once its recovery
        hold has passed. One ping answers for the whole batch; any doubt fails the read
        with -707 (lease expired) -- a miss, never foreign bytes. Returns the indices failed
        because a *different* master now leads (worth one retry)."""
        epochs = {r.epoch for i, r in enumerate(replies)
                  if results[i] >= 0 and isinstance(r, GetReply) and 0 < r.confirm_after_ms < elapsed_ms}
        if not epochs:
            return []
        current, why = self.leading_epoch()
        if current > 0:
            why = f"the master changed during the read (epoch {min(epochs)} -> {current})"
        if epochs == {current}:
            return []
        failed = [i for i, r in enumerate(replies)
                  if results[i] >= 0 and isinstance(r, GetReply) and r.epoch in epochs and r.epoch != current]
        for i in failed:
            results[i] = LEASE_EXPIRED
        log.warning("%s: %d key(s) (first %r) read for %.0f ms under leases that cannot be confirmed: "
                    "%s; results discarded (-707)%s", op, len(failed), keys[failed[0]], elapsed_ms, why,
                    "; reading them again" if current > 0 else "")
        return failed if current > 0 else []

    def _read_with_fallback(self, order: Sequence[ReplicaDesc], parts: Parts, size: int,
                            first_error: Any = None) -> None:
        last: MooncakeError | None = None
        for rep in order:
            try:
                self.read_replica(rep, parts, size)
                return
            except MooncakeError as e:
                last = e
        if last is None:
            raise MooncakeError(TRANSFER_FAIL, f"no readable replica (transfer returned {first_error})")
        raise last

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
