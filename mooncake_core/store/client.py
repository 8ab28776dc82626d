"""``MooncakeDistributedStore``: the Mooncake Store client, with upstream's Python API.

How a call flows (DESIGN §1):

* put: ``put_start`` at the master (it allocates replica ranges inside clients' mounted
  segments) -> the bytes go straight from the caller's memory into those ranges (a memcpy
  when the range is in our own segment, else one ``batch_transfer_sync_write`` per target
  segment) -> ``put_end`` (or ``put_revoke`` when a write failed).
* get: ``get_replica_list`` grants a lease -> we read one replica (own segment first, then a
  same-host one, then any) straight into the destination -> the read only counts if the
  lease is still valid afterwards (-707 otherwise: the range may have been reused).
* A heartbeat thread keeps this client alive at the master, re-mounts and re-reports our
  objects after a master restart/failover, and runs SSD-tier offload tasks.

Errors inside the library are ``MooncakeError``; at the public boundary they become the
upstream integer codes (0 / negative). Bad argument *types* and bad config values raise
``TypeError`` / ``ValueError`` naming the argument, as the pybind11 original does.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import mmap
import os
import queue
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store import tensor as _tensor
from mooncake_core.store.config import StoreConfig
from mooncake_core.store.offload import OffloadFiles, mem_view, offload_relpath
from mooncake_core.store.parallel_api import ParallelApiMixin
from mooncake_core.store.range_api import RangeApiMixin
from mooncake_core.store.tensor_api import TensorApiMixin
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.net import free_port, parse_host_port

__all__ = ["MooncakeDistributedStore", "ReplicaStatus", "ReplicateConfig", "SoftPinAction"]

log = get_logger("mooncake.store.client")

OK = 0
_NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
_EXISTS = int(ErrorCode.OBJECT_ALREADY_EXISTS)
_INVALID = int(ErrorCode.INVALID_PARAMS)
_LEASE_EXPIRED = int(ErrorCode.LEASE_EXPIRED)
_TRANSFER_FAIL = int(ErrorCode.TRANSFER_FAIL)
_INTERNAL = int(ErrorCode.INTERNAL_ERROR)
_RPC_FAIL = int(ErrorCode.RPC_FAIL)

HEARTBEAT_INTERVAL_S = float(os.environ.get("MC_STORE_HEARTBEAT_INTERVAL", "1.0"))

# --------------------------------------------------------------------------- raw memory helpers
_memmove = ctypes.memmove
_PyBytes_FromStringAndSize = ctypes.pythonapi.PyBytes_FromStringAndSize
_PyBytes_FromStringAndSize.restype = ctypes.py_object
_PyBytes_FromStringAndSize.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)


def _bytes_addr(b: bytes) -> int:
    """Address of a bytes object's payload (c_char_p aliases it; no copy)."""
    return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value or 0


def _new_bytes(size: int) -> tuple[bytes, int]:
    """A fresh, not-yet-shared bytes object of ``size`` and its payload address.

    Filling it in place before handing it out is what C extensions do; it spares the
    copy that ``bytes(bytearray)`` would make of every payload we receive.
    """
    b = _PyBytes_FromStringAndSize(None, size)
    return b, _bytes_addr(b)


def _buffer_addr(value: Any, what: str) -> tuple[int, int, Any]:
    """(address, nbytes, keepalive) of any contiguous buffer-protocol object."""
    if isinstance(value, bytes):
        return _bytes_addr(value), len(value), value
    try:
        mv = memoryview(value)
    except TypeError:
        raise TypeError(f"{what}: expected a bytes-like object, got {type(value).__name__}") from None
    if not mv.contiguous:
        raise ValueError(f"{what}: buffer must be contiguous")
    nbytes = mv.nbytes
    if nbytes == 0:
        return 0, 0, mv
    arr = np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, dtype=np.uint8)
    return int(arr.ctypes.data), nbytes, (mv, arr)


def _spans(parts: Sequence[tuple[int, int]], base: int, total: int) -> list[tuple[int, int, int]]:
    """Map the object bytes ``[0, total)`` onto ``parts`` (local (addr, len) pieces laid end
    to end): ``(local_addr, base + object_offset, length)`` per piece that is used."""
    out = []
    off = 0
    for addr, n in parts:
        if off >= total:
            break
        m = min(n, total - off)
        if m > 0:
            out.append((addr, base + off, m))
        off += m
    return out


def _fingerprint(addr: int, size: int) -> bytes:
    """Cheap sampled fingerprint of ``[addr, addr+size)``: 16 x 64-byte samples.

    Recorded at put time and re-checked before re-reporting an object after a master
    restart, so that a range whose memory was meanwhile reused is never re-published.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(size.to_bytes(8, "little"))
    if size <= 1024:
        h.update(mem_view(addr, size))
        return h.digest()
    step = (size - 64) // 15
    for i in range(16):
        off = min(i * step, size - 64)
        h.update(mem_view(addr + off, 64))
    return h.digest()


# --------------------------------------------------------------------------- public config types
class SoftPinAction(enum.IntEnum):
    """Soft-pin transition committed with the object (upstream names)."""

    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ReplicaStatus(enum.IntEnum):
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class ReplicateConfig:
    """Replication settings of a put (upstream attribute names).

    ``__slots__`` makes a misspelt attribute (``cfg.replicas = 2``) an AttributeError
    instead of a silently ignored setting, as with the pybind11 original.
    """

    __slots__ = (
        "data_type",
        "dfs_replica_num",
        "group_ids",
        "nof_replica_num",
        "prefer_alloc_in_same_node",
        "preferred_nof_segments",
        "preferred_segment",
        "preferred_segments",
        "replica_num",
        "soft_pin_action",
        "soft_pin_ttl_ms",
        "with_hard_pin",
    )

    def __init__(self) -> None:
        self.replica_num: int = 1
        self.nof_replica_num: int = 0
        self.dfs_replica_num: int = 0
        self.soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE
        self.soft_pin_ttl_ms: int | None = None
        self.with_hard_pin: bool = False
        self.preferred_segment: str = ""
        self.preferred_segments: list[str] = []
        self.preferred_nof_segments: list[str] = []
        self.prefer_alloc_in_same_node: bool = False
        self.data_type: int = 0
        self.group_ids: list[str] | None = None

    # Older Mooncake releases spelled soft pinning as a boolean.
    @property
    def with_soft_pin(self) -> bool:
        return self.soft_pin_action == SoftPinAction.ENABLE

    @with_soft_pin.setter
    def with_soft_pin(self, value: bool) -> None:
        self.soft_pin_action = SoftPinAction.ENABLE if value else SoftPinAction.DISABLE

    def __repr__(self) -> str:
        return (f"ReplicateConfig: {{ replica_num: {self.replica_num}, soft_pin_action: "
                f"{SoftPinAction(self.soft_pin_action).name}, soft_pin_ttl_ms: {self.soft_pin_ttl_ms}, "
                f"with_hard_pin: {int(bool(self.with_hard_pin))}, preferred_segments: "
                f"{self._segments()} }}")

    __str__ = __repr__

    def _segments(self) -> list[str]:
        segs = list(self.preferred_segments or [])
        if self.preferred_segment and self.preferred_segment not in segs:
            segs.insert(0, self.preferred_segment)
        return segs

    def validate(self) -> None:
        """Raise TypeError/ValueError naming the bad field."""
        if isinstance(self.replica_num, bool) or not isinstance(self.replica_num, int):
            raise TypeError(f"ReplicateConfig.replica_num: expected int, got {type(self.replica_num).__name__}")
        if not 1 <= self.replica_num <= 64:
            raise ValueError(f"ReplicateConfig.replica_num: must be in 1..64, got {self.replica_num}")
        try:
            SoftPinAction(self.soft_pin_action)
        except ValueError:
            raise ValueError(f"ReplicateConfig.soft_pin_action: not a SoftPinAction: {self.soft_pin_action!r}") from None
        if self.soft_pin_ttl_ms is not None:
            if isinstance(self.soft_pin_ttl_ms, bool) or not isinstance(self.soft_pin_ttl_ms, int):
                raise TypeError("ReplicateConfig.soft_pin_ttl_ms: expected int milliseconds or None")
            if self.soft_pin_ttl_ms < 0:
                raise ValueError(f"ReplicateConfig.soft_pin_ttl_ms: must be >= 0, got {self.soft_pin_ttl_ms}")
            if self.soft_pin_action != SoftPinAction.ENABLE:
                raise ValueError("ReplicateConfig.soft_pin_ttl_ms is valid only with SoftPinAction.ENABLE")
        if not isinstance(self.preferred_segment, str):
            raise TypeError("ReplicateConfig.preferred_segment: expected str")
        if not isinstance(self.preferred_segments, (list, tuple)) or not all(
                isinstance(s, str) for s in self.preferred_segments):
            raise TypeError("ReplicateConfig.preferred_segments: expected a list of str")

    def to_msg(self) -> Any:
        from mooncake_core.store.protocol import (
            ReplicateConfigMsg,  # master engineer's module
        )

        self.validate()
        return ReplicateConfigMsg(
            replica_num=int(self.replica_num),
            soft_pin=SoftPinAction(self.soft_pin_action) == SoftPinAction.ENABLE,
            soft_pin_ttl_ms=self.soft_pin_ttl_ms,
            with_hard_pin=bool(self.with_hard_pin),
            preferred_segments=self._segments(),
        )


# --------------------------------------------------------------------------- internals
@dataclass(slots=True)
class _Owned:
    """An object whose replica lives in our segment and which we wrote (for re-reporting)."""

    key: str
    replica: Any
    fingerprint: bytes
    seq: int
    version: int = 0  # what put_end returned: the highest version of a key wins a re-report


class OwnedIndex:
    """Objects this client wrote into its own segment, for re-reporting after a master change.

    Pure and thread-safe. Bounded by the segment: adding a range drops every older entry
    overlapping it -- the master only hands out free ranges, so an overlapped entry was
    evicted/removed meanwhile and its bytes are gone. That keeps the index at most one entry
    per live range however many objects were evicted behind our back.
    """

    def __init__(self) -> None:
        from sortedcontainers import SortedDict

        self._lock = threading.Lock()
        self._by_key: dict[str, _Owned] = {}
        self._by_addr: Any = SortedDict()  # start address -> _Owned
        self._seq = 0

    def __len__(self) -> int:
        return len(self._by_key)

    def _drop(self, e: _Owned) -> None:
        if self._by_key.get(e.key) is e:
            del self._by_key[e.key]
        if self._by_addr.get(e.replica.addr) is e:
            del self._by_addr[e.replica.addr]

    def add(self, key: str, replica: Any, fingerprint: bytes, version: int = 0) -> None:
        lo, hi = replica.addr, replica.addr + max(replica.size, 1)
        with self._lock:
            old = self._by_key.get(key)
            if old is not None:
                self._drop(old)
            i = self._by_addr.bisect_left(lo)
            if i > 0:
                i -= 1
            overlapped = []
            for start in self._by_addr.islice(i):
                if start >= hi:
                    break
                e = self._by_addr[start]
                if start + max(e.replica.size, 1) > lo:
                    overlapped.append(e)
            for e in overlapped:
                self._drop(e)
            self._seq += 1
            e = _Owned(key, replica, fingerprint, self._seq, version)
            self._by_key[key] = e
            self._by_addr[lo] = e

    def discard(self, keys: Iterable[str]) -> None:
        with self._lock:
            for k in keys:
                e = self._by_key.get(k)
                if e is not None:
                    self._drop(e)

    def discard_removed(self, removed: Iterable[tuple[str, int]], all_before: int = 0) -> None:
        """Drop entries the master reported removed/overwritten: ``(key, stamp)`` drops that
        key's entry if it is not newer than the removal; ``all_before`` drops every entry at
        or below it. A newer write of the same key (higher version) stays."""
        with self._lock:
            for k, stamp in removed:
                e = self._by_key.get(k)
                if e is not None and e.version <= stamp:
                    self._drop(e)
            if all_before:
                for e in [e for e in self._by_key.values() if e.version <= all_before]:
                    self._drop(e)

    def entries(self, pred: Any = None) -> list[_Owned]:
        """A snapshot of the entries whose key satisfies ``pred`` (all when None)."""
        with self._lock:
            return [e for k, e in self._by_key.items() if pred is None or pred(k)]

    def discard_entries(self, entries: Iterable[_Owned]) -> None:
        with self._lock:
            for e in entries:
                self._drop(e)

    def clear(self) -> None:
        with self._lock:
            self._by_key.clear()
            self._by_addr.clear()

    def newest_first(self) -> list[_Owned]:
        with self._lock:
            return sorted(self._by_key.values(), key=lambda e: e.seq, reverse=True)


_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_libc: Any = None


def _madvise_populate(addr: int, length: int) -> bool:
    """Fault in writable pages of ``[addr, addr+length)`` without changing their contents."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        _libc.madvise.restype = ctypes.c_int
    return _libc.madvise(addr, length, _MADV_POPULATE_WRITE) == 0  # ctypes drops the GIL


_PAGE = mmap.PAGESIZE
_PREFAULT_MIN = 1 << 20
_PREFAULT_READS = os.environ.get("MC_STORE_PREFAULT", "1") != "0" and sys.platform.startswith("linux")


def _populate_range(addr: int, size: int) -> None:
    """Fault in the whole pages inside ``[addr, addr+size)`` in one syscall before a transfer
    writes there: cheaper than taking each page fault inside process_vm_readv/recv."""
    lo = (addr + _PAGE - 1) & ~(_PAGE - 1)
    hi = (addr + size) & ~(_PAGE - 1)
    if hi > lo:
        _madvise_populate(lo, hi - lo)


class _Segment:
    """Anonymous mmap'ed memory, registered with the TE; owned by this client.

    Pages are populated by a background thread (``MADV_POPULATE_WRITE``, which never
    changes contents, so it is safe while peers already write into the segment): otherwise
    the first write by a peer into every fresh page pays a page fault inside the transfer.
    ``MC_STORE_PREFAULT=0`` turns that off (memory is then committed lazily).
    """

    CHUNK = 32 << 20

    def __init__(self, size: int):
        self.size = size
        self.mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        # opt-in transparent huge pages (fewer page faults); measured *slower* for
        # process_vm_writev into fresh memory on our reference machine, hence off by default
        if os.environ.get("MC_STORE_HUGEPAGES") == "1" and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self.mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        self._anchor = ctypes.c_char.from_buffer(self.mm)
        self.addr = ctypes.addressof(self._anchor)
        self._stop = threading.Event()
        self._populater: threading.Thread | None = None
        if os.environ.get("MC_STORE_PREFAULT", "1") != "0" and sys.platform.startswith("linux"):
            self._populater = threading.Thread(target=self._populate, name="mooncake-segment-populate",
                                               daemon=True)
            self._populater.start()

    def _populate(self) -> None:
        off = 0
        while off < self.size and not self._stop.is_set():
            n = min(self.CHUNK, self.size - off)
            if not _madvise_populate(self.addr + off, n):
                return  # old kernel or no memory to commit: stay lazy
            off += n

    def close(self) -> None:
        self._stop.set()
        if self._populater is not None:
            self._populater.join(timeout=30)
        self._anchor = None  # type: ignore[assignment]
        try:
            self.mm.close()
        except BufferError:  # a view still alive somewhere; let GC unmap it
            pass


def _unresponsive(engine: Any, t0: float) -> bool:
    """A transfer that failed after at least half the engine's timeout hit an unresponsive
    peer (stopped, cut off), not a quick refusal: retrying it costs another full timeout."""
    return time.monotonic() - t0 >= 0.5 * float(getattr(engine, "timeout", 30.0) or 30.0)


def _check_key(key: Any, what: str) -> str:
    if not isinstance(key, str):
        raise TypeError(f"{what}: key must be str, got {type(key).__name__} ({key!r:.60})")
    if not key:
        raise ValueError(f"{what}: key must be a non-empty string")
    return key


def _check_keys(keys: Any, what: str) -> list[str]:
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
        raise TypeError(f"{what}: keys must be a list of str, got {type(keys).__name__}")
    return [_check_key(k, what) for k in keys]


def _check_int(value: Any, what: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what}: expected int, got {type(value).__name__} ({value!r:.60})")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{what}: must be >= {minimum}, got {value}")
    return value


def _check_config(config: Any, what: str) -> ReplicateConfig:
    if config is None:
        return ReplicateConfig()
    if not isinstance(config, ReplicateConfig):
        raise TypeError(f"{what}: config must be a ReplicateConfig, got {type(config).__name__}")
    config.validate()
    return config


def _has_port(hostname: str) -> bool:
    try:
        parse_host_port(hostname, what="local_hostname")
        return True
    except ValueError:
        return False


def _host_of(segment_name: str) -> str:
    return segment_name.rsplit(":", 1)[0] if ":" in segment_name else segment_name


class MooncakeDistributedStore(TensorApiMixin, ParallelApiMixin, RangeApiMixin):
    """Mooncake Store client. Create, ``setup(...)``, use, ``close()``.

    Thread-safe: many threads may put/get concurrently through one instance.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._ready = False
        self._cfg: StoreConfig | None = None
        self._engine: Any = None
        self._own_engine = False
        self._master: Any = None
        self._client_id = ""
        self._segment: _Segment | None = None
        self._segment_name = ""
        self._host = ""
        self._owned = OwnedIndex()
        self._registered: dict[int, int] = {}
        self._offload: OffloadFiles | None = None
        self._hb_thread: threading.Thread | None = None
        self._hb_stop = threading.Event()
        self._metrics: Any = None
        self._http_server: Any = None
        self._promote_q: queue.Queue[Any] | None = None
        self._offload_q: queue.Queue[Any] | None = None
        self._offload_thread: threading.Thread | None = None
        self._offload_pending: set[str] = set()
        self._remount_pending = False
        self._master_epoch = 0  # epoch of the master our segment is mounted at (0 = not yet)
        # data-path calls in flight: close() waits for them before unmapping our segment, so
        # a concurrent memcpy from/to it never touches freed memory
        self._inflight = 0
        self._inflight_cv = threading.Condition()

    # ================================================================== setup / teardown
    def setup(self, local_hostname: Any = None, metadata_server: Any = None,
              global_segment_size: Any = 16 * 1024 * 1024, local_buffer_size: Any = 16 * 1024 * 1024,
              protocol: str = "tcp", rdma_devices: str = "", master_server_addr: str = "127.0.0.1:50051",
              engine: Any = None, enable_ssd_offload: Any = False, ssd_offload_path: str = "",
              tenant_id: str = "default", enable_client_http_server: Any = False,
              client_http_port: int = 9300) -> int:
        """Connect to the master, start the TE, contribute ``global_segment_size`` bytes.

        Forms: ``setup(local_hostname, metadata_server, ...)`` (upstream argument order),
        ``setup({"local_hostname": ..., ...})``, or ``setup()`` (``MOONCAKE_CONFIG_PATH`` /
        ``MOONCAKE_MASTER`` env, as upstream's ``MooncakeConfig.load_from_env``).
        Returns 0, or a negative Mooncake code when a service cannot be reached. Invalid
        values raise ValueError/TypeError naming the field.
        """
        if isinstance(local_hostname, dict):
            if metadata_server is not None:
                raise TypeError("setup(config): pass either a dict or positional arguments, not both")
            cfg = StoreConfig.from_dict(local_hostname)
        elif local_hostname is None and metadata_server is None:
            cfg = StoreConfig.load_from_env()
        else:
            if local_hostname is None or metadata_server is None:
                raise TypeError("setup: local_hostname and metadata_server are both required")
            cfg = StoreConfig(
                local_hostname=local_hostname, metadata_server=metadata_server,
                global_segment_size=global_segment_size, local_buffer_size=local_buffer_size,
                protocol=protocol, rdma_devices=rdma_devices, master_server_addr=master_server_addr,
                enable_ssd_offload=enable_ssd_offload, ssd_offload_path=ssd_offload_path,
                tenant_id=tenant_id, enable_client_http_server=enable_client_http_server,
                client_http_port=client_http_port,
            )
        if os.environ.get("MC_STORE_RPC_TIMEOUT"):
            cfg.rpc_timeout = float(os.environ["MC_STORE_RPC_TIMEOUT"])
        with self._lock:
            if self._ready:
                raise RuntimeError("setup: this store is already set up (call close() first)")
            try:
                self._setup(cfg, engine)
            except MooncakeError as e:
                log.error("store setup failed: %s", e, extra={"master": cfg.master_server_addr})
                self._teardown(quiet=True)
                return e.code
            except OSError as e:
                log.error("store setup failed: %s", e)
                self._teardown(quiet=True)
                return _INTERNAL
            except BaseException:
                self._teardown(quiet=True)
                raise
        return OK

    def _setup(self, cfg: StoreConfig, engine: Any) -> None:
        from mooncake_core.store.master_client import (
            MasterClient,  # master engineer's module
        )

        self._cfg = cfg
        self._client_id = uuid.uuid4().hex
        # 1. Transfer Engine: our segment's name is its local_hostname ("host:port").
        if engine is None:
            from mooncake_core.engine import TransferEngine

            engine = TransferEngine()
            te_host = cfg.local_hostname
            if cfg.metadata_server.upper() != "P2PHANDSHAKE" and not _has_port(te_host):
                # segment names must be unique per process: like upstream, add a port
                te_host = f"{te_host}:{free_port()}"
            rc = engine.initialize(te_host, cfg.metadata_server, cfg.protocol, cfg.rdma_devices)
            if rc != 0:
                raise MooncakeError(rc if rc < 0 else _INTERNAL,
                                    f"TransferEngine.initialize({te_host!r}, {cfg.metadata_server!r}, "
                                    f"{cfg.protocol!r}) failed with {rc}: "
                                    f"{getattr(engine, 'last_error', '') or 'see the log'}")
            self._own_engine = True
        self._engine = engine
        self._segment_name = self._engine_segment_name(engine, cfg.local_hostname)
        self._host = _host_of(self._segment_name)
        # 2. master connection
        self._master = MasterClient(cfg.master_server_addr, timeout=cfg.rpc_timeout)
        # 3. contribute memory
        if cfg.global_segment_size > 0:
            seg = _Segment(cfg.global_segment_size)
            self._segment = seg
            rc = engine.register_memory(seg.addr, seg.size, "cpu:0")
            if rc not in (0, None):
                raise MooncakeError(_INTERNAL, f"register_memory of the {seg.size}-byte segment failed: {rc}")
            self._mount()
        else:
            # no segment to mount: still check the master is there, and learn its SSD-tier dir
            info = self._master.ping()
            if getattr(info, "enable_offload", False) and info.root_fs_dir and not cfg.ssd_offload_path:
                try:
                    self._offload = OffloadFiles(info.root_fs_dir)
                except OSError as e:
                    log.warning("cannot use SSD tier dir %s: %s", info.root_fs_dir, e)
        if cfg.enable_ssd_offload or cfg.ssd_offload_path:
            path = cfg.ssd_offload_path or os.environ.get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "")
            if path:
                self._offload = OffloadFiles(path)
        self._setup_metrics(cfg)
        self._ready = True
        self._hb_stop.clear()
        self._hb_thread = threading.Thread(target=self._heartbeat_loop, name="mooncake-store-heartbeat",
                                           daemon=True)
        self._hb_thread.start()
        log.info("store client ready", extra={"segment": self._segment_name, "client_id": self._client_id,
                                               "segment_bytes": cfg.global_segment_size,
                                               "master": cfg.master_server_addr})

    @staticmethod
    def _engine_segment_name(engine: Any, local_hostname: str) -> str:
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

    def _mount(self) -> None:
        seg = self._segment
        assert seg is not None
        reply = self._master.mount_segment(self._client_id, self._segment_name, seg.addr, seg.size,
                                           self._master_epoch)
        self._master_epoch = getattr(reply, "epoch", 0) or 0
        root = getattr(reply, "root_fs_dir", None) if reply is not None else None
        if root and getattr(reply, "enable_offload", True) and self._offload is None:
            try:
                self._offload = OffloadFiles(root)
            except OSError as e:
                log.warning("cannot use SSD tier dir %s: %s", root, e)

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

    def _count(self, op: str, rc: int, nbytes: int = 0, t0: float | None = None) -> None:
        m = self._metrics
        if m is None:
            return
        m["ops"].labels(op, "ok" if rc >= 0 else str(rc)).inc()
        if nbytes:
            m["bytes"].labels(op).inc(nbytes)
        if t0 is not None:
            m["latency"].labels(op).observe(time.perf_counter() - t0)

    def close(self) -> int:
        """Stop the heartbeat, unmount our segment (its objects leave the pool), free memory."""
        with self._lock:
            if not self._ready and self._engine is None and self._master is None:
                return OK
            self._teardown(quiet=False)
        return OK

    def _teardown(self, quiet: bool) -> None:
        with self._inflight_cv:
            self._ready = False
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
        if self._offload_q is not None:
            self._offload_q.put(None)
            if self._offload_thread is not None and self._offload_thread is not threading.current_thread():
                self._offload_thread.join(timeout=30)
            self._offload_q = None
            self._offload_thread = None
        drained = self._wait_drained(30.0)
        if self._master is not None and self._segment is not None:
            try:
                self._master.unmount_segment(self._client_id, self._segment_name)
            except Exception as e:  # noqa: BLE001 - best effort on the way out
                if not quiet:
                    log.warning("unmount_segment at close failed: %s", e)
        if self._engine is not None:
            if self._segment is not None:
                try:
                    self._engine.unregister_memory(self._segment.addr)
                except Exception:  # noqa: BLE001
                    pass
            for addr in list(self._registered):
                try:
                    self._engine.unregister_memory(addr)
                except Exception:  # noqa: BLE001
                    pass
            if self._own_engine:
                for name in ("close", "shutdown"):
                    fn = getattr(self._engine, name, None)
                    if callable(fn):
                        try:
                            fn()
                        except Exception:  # noqa: BLE001
                            pass
                        break
        self._registered.clear()
        if self._master is not None:
            fn = getattr(self._master, "close", None)
            if callable(fn):
                try:
                    fn()
                except Exception:  # noqa: BLE001
                    pass
        if self._http_server is not None:
            try:
                self._http_server[0].shutdown()
            except Exception:  # noqa: BLE001
                pass
            self._http_server = None
        if self._segment is not None:
            if drained:
                self._segment.close()
            else:  # a call is still running against it: leak the mapping rather than crash
                log.warning("close(): data-path calls still running after 30 s; segment memory kept mapped")
        self._segment = None
        self._engine = None
        self._master = None
        self._owned.clear()

    def __enter__(self) -> MooncakeDistributedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            if self._ready:
                self._teardown(quiet=True)
        except Exception:  # noqa: BLE001
            pass

    def get_hostname(self) -> str:
        """Our segment name ("host:port"), as other clients see it in replica descriptors."""
        return self._segment_name

    def health_check(self) -> int:
        """0 healthy, 1 not set up / closed, 2 master unreachable (upstream convention)."""
        if not self._ready:
            return 1
        try:
            self._master.exist_key("__mooncake_health__")
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

    def _enter(self, what: str) -> None:
        with self._inflight_cv:
            self._require_ready(what)
            self._inflight += 1

    def _exit(self) -> None:
        with self._inflight_cv:
            self._inflight -= 1
            if self._inflight == 0:
                self._inflight_cv.notify_all()

    def _require_ready(self, what: str) -> None:
        if not self._ready:
            raise MooncakeError(_INVALID, f"{what}: store is not set up (call setup() first) or is closed")

    # ================================================================== heartbeat, remount, offload
    def _heartbeat_loop(self) -> None:
        failures = 0
        while not self._hb_stop.wait(HEARTBEAT_INTERVAL_S):
            master = self._master
            if master is None:
                return
            try:
                reply = master.heartbeat(self._client_id)
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
                # the master says "need_remount" once (on our first call after its restart);
                # remember it until the re-mount and re-report really went through
                if getattr(reply, "need_remount", False):
                    self._remount_pending = True
                # removals first: a master that expired us sends what was removed meanwhile
                # with its need_remount, and those objects must not be re-reported
                removed = getattr(reply, "removed", None)
                all_before = getattr(reply, "removed_all_before", 0)
                if removed or all_before:
                    self._owned.discard_removed(removed or [], all_before)
                if self._remount_pending:
                    self._remount()
                    self._remount_pending = False
                tasks = getattr(reply, "offload_tasks", None) or []
                if tasks:
                    self._queue_offload(tasks)
            except MooncakeError as e:
                log.warning("heartbeat follow-up failed: %s", e)
            except Exception:
                log.exception("heartbeat follow-up error")

    def _remount(self) -> None:
        """After a master restart/failover: mount again and re-report objects we own whose
        memory provably still holds what we wrote (fingerprint check, newest wins on overlap).

        Fingerprints are checked *before* mounting: once mounted, the new master may hand our
        ranges to other writers; the report follows the mount immediately and the master
        refuses any reported range it has meanwhile allocated, so a lost race loses the
        object (it is a cache) but never publishes foreign bytes under our key."""
        if self._segment is None:
            return
        taken: list[tuple[int, int]] = []
        report = []
        versions: list[int] = []
        stale = []
        for e in self._owned.newest_first():
            r = e.replica
            lo, hi = r.addr, r.addr + r.size
            if any(lo < b and a < hi for a, b in taken) or _fingerprint(r.addr, r.size) != e.fingerprint:
                stale.append(e)
                continue
            taken.append((lo, hi))
            report.append((e.key, r))
            versions.append(e.version)
        self._mount()
        accepted = self._master.report_objects(self._client_id, report, versions) if report else 0
        self._owned.discard_entries(stale)
        log.info("re-mounted segment after master change", extra={"segment": self._segment_name,
                                                                    "reported": len(report),
                                                                    "accepted": accepted,
                                                                    "dropped": len(stale)})

    def _queue_offload(self, tasks: list[Any]) -> None:
        """Offload tasks run on their own thread: writing files must never delay heartbeats
        (a client silent for ``client_ttl`` loses its segment)."""
        with self._lock:
            if self._offload_q is None:
                self._offload_q = queue.Queue()
                self._offload_thread = threading.Thread(target=self._offload_loop, args=(self._offload_q,),
                                                        name="mooncake-store-offload", daemon=True)
                self._offload_thread.start()
            q = self._offload_q
        for t in tasks:
            if t.key not in self._offload_pending:
                self._offload_pending.add(t.key)
                q.put(t)

    def _offload_loop(self, q: queue.Queue[Any]) -> None:
        while True:
            task = q.get()
            if task is None:
                return
            try:
                if self._ready:
                    self._run_offload(task)
            except MooncakeError as e:
                log.warning("offload of %r: %s", task.key, e)
            except Exception:
                log.exception("offload of %r failed", task.key)
            finally:
                self._offload_pending.discard(task.key)

    def _run_offload(self, task: Any) -> None:
        key, replica = task.key, task.replica
        seg = self._segment
        ok = False
        path = offload_relpath(key)
        if self._offload is None or seg is None:
            log.warning("offload task for %r but no SSD tier directory configured", key)
        elif not (seg.addr <= replica.addr and replica.addr + replica.size <= seg.addr + seg.size):
            log.warning("offload task for %r points outside our segment", key)
        else:
            try:
                self._offload.write_from(path, replica.addr, replica.size)
                ok = True
            except OSError as e:
                log.warning("offload of %r failed: %s", key, e)
        if ok:
            self._master.offload_done(self._client_id, key, path, replica.size)
        else:
            self._master.offload_failed(self._client_id, key)
        self._owned.discard([key])

    # ================================================================== data path: writes
    def _write_replicas(self, jobs: list[tuple[list[tuple[int, int]], int, Any]],
                        skip: set[str] | None = None) -> None:
        """Write ``(source parts, object size, replica)`` jobs: memcpy into our own segment,
        one ``batch_transfer_sync_write`` per remote segment. Raises MooncakeError(-800).
        ``skip``: segments that just timed out (not tried again; a failing one that took that
        long is added), so one dead peer costs a batch one timeout, not one per key."""
        skip = set() if skip is None else skip
        remote: dict[str, tuple[list[int], list[int], list[int]]] = {}
        for parts, total, rep in jobs:
            own = rep.segment_name == self._segment_name and self._segment is not None
            for src, dst, n in _spans(parts, rep.addr, total):
                if own:
                    _memmove(dst, src, n)
                else:
                    lists = remote.setdefault(rep.segment_name, ([], [], []))
                    lists[0].append(src)
                    lists[1].append(dst)
                    lists[2].append(n)
        for seg_name, (srcs, dsts, lens) in remote.items():
            if seg_name in skip:
                raise MooncakeError(_TRANSFER_FAIL, f"segment {seg_name} did not answer a moment ago; not retried")
            t0 = time.monotonic()
            rc = self._engine.batch_transfer_sync_write(seg_name, srcs, dsts, lens)
            if rc is None or rc < 0:
                if _unresponsive(self._engine, t0):
                    skip.add(seg_name)
                raise MooncakeError(_TRANSFER_FAIL, f"write of {sum(lens)} bytes to segment {seg_name} failed ({rc})")

    def _put_many(self, keys: list[str], srcs: list[list[tuple[int, int]]], cfg: ReplicateConfig,
                  *, upsert: bool, op: str) -> list[int]:
        """Core of every put: returns one code per key. ``srcs[i]`` = the (address, size)
        parts whose concatenation is object i (one part for plain puts)."""
        self._enter(op)
        try:
            return self._put_many_locked(keys, srcs, cfg, upsert=upsert, op=op)
        finally:
            self._exit()

    def _put_many_locked(self, keys: list[str], srcs: list[list[tuple[int, int]]], cfg: ReplicateConfig,
                         *, upsert: bool, op: str) -> list[int]:
        t0 = time.perf_counter()
        msg = cfg.to_msg()
        if cfg.prefer_alloc_in_same_node and self._segment is not None \
                and self._segment_name not in msg.preferred_segments:
            msg.preferred_segments.insert(0, self._segment_name)  # local first: a memcpy
        master = self._master
        n = len(keys)
        sizes = [sum(sz for _, sz in parts) for parts in srcs]
        results = [OK] * n
        allocs: list[Any] = [None] * n
        try:
            if n == 1:
                try:
                    if upsert:
                        allocs[0] = master.upsert_start(self._client_id, keys[0], sizes[0], msg)
                    else:
                        allocs[0] = master.put_start(self._client_id, keys[0], sizes[0], msg)
                except MooncakeError as e:
                    allocs[0] = e.code
            elif upsert:
                allocs = list(master.batch_upsert_start(self._client_id, keys, sizes, msg))
            else:
                allocs = list(master.batch_put_start(self._client_id, keys, sizes, msg))
        except MooncakeError as e:
            return [e.code] * n
        started: list[int] = []
        for i, a in enumerate(allocs):
            if isinstance(a, int):
                # put of an existing key keeps the old value and counts as success
                results[i] = OK if (a == _EXISTS and not upsert) else a
            else:
                started.append(i)
        # write, then end/revoke
        done: list[int] = []
        failed: list[int] = []
        if started:
            jobs = [(srcs[i], sizes[i], rep) for i in started for rep in allocs[i]]
            dead: set[str] = set()
            try:
                self._write_replicas(jobs, dead)
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
                            self._write_replicas([(srcs[i], sizes[i], rep) for rep in allocs[i]], dead)
                            done.append(i)
                        except MooncakeError as e2:
                            log.warning("%s of %r: %s", op, keys[i], e2)
                            failed.append(i)
        if failed:
            fk = [keys[i] for i in failed]
            try:
                if len(fk) == 1:
                    master.put_revoke(self._client_id, fk[0])
                else:
                    master.batch_put_revoke(self._client_id, fk)
            except MooncakeError as e:
                log.warning("put_revoke after failed write: %s", e)
            for i in failed:
                results[i] = _TRANSFER_FAIL
        if done:
            dk = [keys[i] for i in done]
            try:
                if len(dk) == 1:
                    end_rcs: list[Any] = [master.put_end(self._client_id, dk[0])]
                else:
                    end_rcs = list(master.batch_put_end(self._client_id, dk) or [None] * len(dk))
            except MooncakeError as e:
                end_rcs = [e.code] * len(dk)
            for i, rc in zip(done, end_rcs):
                if isinstance(rc, int) and rc < 0:
                    results[i] = rc
                    continue
                if upsert and rc == 0:
                    # published nothing: the master no longer knew this put (it changed during
                    # the write) and the key is back with another value. 0 would tell the caller
                    # its value replaced the old one while every reader keeps the old one.
                    results[i] = _NOT_FOUND
                    log.warning("%s of %r: the master lost the put in progress (restart or failover "
                                "during the write); the value was not published", op, keys[i])
                    self._owned.discard([keys[i]])
                    continue
                self._remember_owned(keys[i], allocs[i], rc)
        total = sum(sizes[i] for i in range(n) if results[i] == OK)
        self._count(op, min(results) if results else OK, total, t0)
        return results

    def _remember_owned(self, key: str, replicas: Iterable[Any], version: Any) -> None:
        """After put_end: re-report this object after a master change if it lives in our
        segment and the put really published it (``version`` > 0)."""
        if self._segment is None:
            return
        if not isinstance(version, int) or version <= 0:
            self._owned.discard([key])  # nothing published (lost to an existing value): not ours
            return
        for rep in replicas:
            if rep.segment_name == self._segment_name:
                # fingerprint of the replica as written, taken from our own memory
                self._owned.add(key, rep, _fingerprint(rep.addr, rep.size) if rep.size else b"", version)
                return
        self._owned.discard([key])

    def _forget(self, keys: Iterable[str]) -> None:
        self._owned.discard(keys)

    # ================================================================== data path: reads
    def _pick_order(self, replicas: Sequence[Any]) -> list[Any]:
        """Memory replicas first (ours, then same host, then others), disk replicas last."""
        def rank(r: Any) -> int:
            if getattr(r, "kind", "memory") == "disk":
                return 3
            if r.segment_name == self._segment_name:
                return 0
            if _host_of(r.segment_name) == self._host:
                return 1
            return 2
        usable = [r for r in replicas if str(getattr(r, "status", "complete")).lower() in ("complete", "3")]
        return sorted(usable, key=rank)

    def _read_replica(self, rep: Any, parts: list[tuple[int, int]], size: int) -> None:
        """Read the ``size``-byte object of replica ``rep`` into the destination parts."""
        if getattr(rep, "kind", "memory") == "disk":
            if self._offload is None:
                raise MooncakeError(_NOT_FOUND, "object is only on the SSD tier and no root_fs_dir is configured")
            if len(parts) == 1:
                self._offload.read_into(rep.path, mem_view(parts[0][0], size), size)
            else:
                tmp = bytearray(size)
                self._offload.read_into(rep.path, memoryview(tmp), size)
                tmp_addr = _buffer_addr(tmp, "tmp")[0]
                for dst, off, n in _spans(parts, 0, size):
                    _memmove(dst, tmp_addr + off, n)
            return
        spans = _spans(parts, rep.addr, size)
        if rep.segment_name == self._segment_name and self._segment is not None:
            for dst, src, n in spans:
                _memmove(dst, src, n)
            return
        rc = self._engine.batch_transfer_sync_read(rep.segment_name, [d for d, _, _ in spans],
                                                   [r for _, r, _ in spans], [n for _, _, n in spans])
        if rc is None or rc < 0:
            raise MooncakeError(_TRANSFER_FAIL, f"read of {size} bytes from segment {rep.segment_name} failed ({rc})")

    def _read_batch(self, keys: list[str], dests: list[Any], op: str) -> list[int]:
        """Read each key into ``dests[i]``: a list of (addr, capacity) parts filled in order,
        or None to allocate a fresh bytes object (stored back into ``dests[i]`` as
        ``(bytes, size)``). Returns per-key bytes read or a negative code."""
        self._enter(op)
        try:
            return self._read_batch_locked(keys, dests, op)
        finally:
            self._exit()

    def _read_batch_locked(self, keys: list[str], dests: list[Any], op: str, retry: bool = True) -> list[int]:
        t0 = time.perf_counter()
        fresh = [d is None for d in dests]
        master = self._master
        n = len(keys)
        results: list[int] = [0] * n
        t_req = time.monotonic()
        try:
            if n == 1:
                try:
                    replies: list[Any] = [master.get_replica_list(keys[0])]
                except MooncakeError as e:
                    replies = [e.code]
            else:
                replies = list(master.batch_get_replica_list(keys))
        except MooncakeError as e:
            return [e.code] * n
        remote: dict[str, list[tuple[int, list[tuple[int, int]], int, Any]]] = {}
        deadlines = [0.0] * n
        read_parts: list[Any] = [None] * n
        pending_promote: list[int] = []
        for i, reply in enumerate(replies):
            if isinstance(reply, int):
                results[i] = reply
                continue
            deadlines[i] = t_req + reply.lease_ttl_ms / 1000.0
            order = self._pick_order(reply.replicas)
            if not order:
                results[i] = _NOT_FOUND
                continue
            size = order[0].size
            if dests[i] is None:
                b, addr = _new_bytes(size)
                dests[i] = (b, size)
                parts = [(addr, size)]
                if size >= _PREFAULT_MIN and _PREFAULT_READS:
                    _populate_range(addr, size)
            else:
                parts = dests[i]
                cap = sum(c for _, c in parts)
                if cap < size:
                    results[i] = _INVALID
                    log.warning("%s(%r): buffer of %d bytes is smaller than the object (%d bytes)",
                                op, keys[i], cap, size)
                    continue
            read_parts[i] = parts
            results[i] = size
            first = order[0]
            if getattr(first, "kind", "memory") != "disk" and first.segment_name != self._segment_name \
                    and size > 0:
                remote.setdefault(first.segment_name, []).append((i, parts, size, order))
                continue
            try:
                if size:
                    self._read_with_fallback(order, parts, size)
                if getattr(first, "kind", "memory") == "disk":
                    pending_promote.append(i)
            except MooncakeError as e:
                results[i] = e.code
        # one batched read per remote segment
        for seg_name, items in remote.items():
            locs: list[int] = []
            rems: list[int] = []
            lens: list[int] = []
            for _, parts, size, order in items:
                for d, r, m in _spans(parts, order[0].addr, size):
                    locs.append(d)
                    rems.append(r)
                    lens.append(m)
            t0 = time.monotonic()
            rc = self._engine.batch_transfer_sync_read(seg_name, locs, rems, lens)
            if rc is not None and rc >= 0:
                continue
            # retry one by one to isolate the failing key/replica -- but a segment that did not
            # answer for half a timeout is not asked again: only the other replicas are tried
            gone = _unresponsive(self._engine, t0)
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
                results[i] = _LEASE_EXPIRED
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
            if results[i] >= 0:
                d = dests[i][0]
                # get(): the fresh bytes object is immutable, share it; get_into: the caller
                # owns the buffer, so the (disk-path only) promotion takes a copy
                data = d if isinstance(d, bytes) else b"".join(
                    mem_view(a, m) for a, _, m in _spans(read_parts[i], 0, results[i]))
                self._promote(keys[i], data)
        self._count(op, min(results) if results else OK, sum(r for r in results if r > 0), t0)
        return results

    def _leading_epoch(self) -> tuple[int, str]:
        """(epoch of the master leading now, "") by one ping, or (-1, why) when it cannot be
        told (unreachable, or the address answering is no longer the leader)."""
        try:
            info = self._master.ping(timeout=2.0)
        except MooncakeError as e:
            return -1, str(e)
        if not getattr(info, "is_leader", True):
            return -1, f"{self._master.address} is no longer the master leader"
        return int(getattr(info, "epoch", 0) or 0), ""

    def _confirm_epochs(self, replies: list[Any], results: list[int], keys: list[str],
                        elapsed_ms: float, op: str) -> list[int]:
        """A read that took longer than the master's ``confirm_after_ms`` is trusted only if
        the master that granted its lease still leads: a new master (restart or HA failover)
        does not know those leases, and may hand the ranges to new puts once its recovery
        hold has passed. One ping answers for the whole batch; any doubt fails the read
        with -707 (lease expired) -- a miss, never foreign bytes. Returns the indices failed
        because a *different* master now leads (worth one retry)."""
        epochs = {r.epoch for i, r in enumerate(replies)
                  if results[i] >= 0 and not isinstance(r, int)
                  and 0 < getattr(r, "confirm_after_ms", 0) < elapsed_ms}
        if not epochs:
            return []
        current, why = self._leading_epoch()
        if current > 0:
            why = f"the master changed during the read (epoch {min(epochs)} -> {current})"
        if epochs == {current}:
            return []
        failed = [i for i, r in enumerate(replies)
                  if results[i] >= 0 and not isinstance(r, int) and r.epoch in epochs and r.epoch != current]
        for i in failed:
            results[i] = _LEASE_EXPIRED
        log.warning("%s: %d key(s) (first %r) read for %.0f ms under leases that cannot be confirmed: "
                    "%s; results discarded (-707)%s", op, len(failed), keys[failed[0]], elapsed_ms, why,
                    "; reading them again" if current > 0 else "")
        return failed if current > 0 else []

    def _read_with_fallback(self, order: Sequence[Any], parts: list[tuple[int, int]], size: int,
                            first_error: Any = None) -> None:
        last: MooncakeError | None = None
        for rep in order:
            try:
                self._read_replica(rep, parts, size)
                return
            except MooncakeError as e:
                last = e
        if last is None:
            raise MooncakeError(_TRANSFER_FAIL, f"no readable replica (transfer returned {first_error})")
        raise last

    def _promote(self, key: str, data: bytes) -> None:
        """Promotion on hit: a disk-only object read back is put into memory again, in the
        background (the get does not wait for it). Memory may be full right now -- the
        eviction that makes room is itself an offload the owner performs within a heartbeat
        -- so a -200 is retried a few times."""
        with self._lock:
            if self._promote_q is None:
                self._promote_q = queue.Queue(maxsize=256)
                threading.Thread(target=self._promote_loop, args=(self._promote_q,),
                                 name="mooncake-store-promote", daemon=True).start()
        try:
            self._promote_q.put_nowait((key, data, 0))
        except queue.Full:
            log.debug("promotion queue full, skipping %r", key)

    def _promote_loop(self, q: queue.Queue[Any]) -> None:
        while True:
            item = q.get()
            if item is None or not self._ready:
                return
            key, data, attempt = item
            try:
                rc = self._put_many([key], [[(_bytes_addr(data), len(data))]], ReplicateConfig(),
                                    upsert=False, op="promote")[0]
            except Exception as e:  # noqa: BLE001 - promotion is best effort
                log.debug("promotion of %r failed: %s", key, e)
                continue
            if rc == int(ErrorCode.NO_AVAILABLE_HANDLE) and attempt < 8:
                time.sleep(0.25)
                try:
                    q.put_nowait((key, data, attempt + 1))
                except queue.Full:
                    pass

    # ================================================================== public API: bytes
    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Store ``value`` (any bytes-like) under ``key``. 0 on success (also when the key
        already exists: objects are immutable, the old value stays); negative code on error."""
        key = _check_key(key, "put")
        cfg = _check_config(config, "put")
        addr, size, keep = _buffer_addr(value, "put: value")
        return self._call(lambda: self._put_many([key], [[(addr, size)]], cfg, upsert=False, op="put")[0], keep)

    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Insert or replace ``key`` (readers holding a lease on the old value keep it).
        0 only when this value was published; -704 when the master changed during the
        write and lost the put in progress (the old value, if any, stays: retry)."""
        key = _check_key(key, "upsert")
        cfg = _check_config(config, "upsert")
        addr, size, keep = _buffer_addr(value, "upsert: value")
        self._forget([key])
        return self._call(lambda: self._put_many([key], [[(addr, size)]], cfg, upsert=True, op="upsert")[0], keep)

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        """Store the concatenation of ``parts`` as one object (written part by part, no join)."""
        return self._parts(key, parts, config, upsert=False, op="put_parts")

    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        return self._parts(key, parts, config, upsert=True, op="upsert_parts")

    def _parts(self, key: str, parts: tuple, config: Any, *, upsert: bool, op: str) -> int:
        key = _check_key(key, op)
        cfg = _check_config(config, op)
        bufs = [_buffer_addr(p, f"{op}: parts[{i}]") for i, p in enumerate(parts)]
        if upsert:
            self._forget([key])
        return self._call(lambda: self._put_many([key], [[(a, n) for a, n, _ in bufs if n]], cfg, upsert=upsert,
                                                 op=op)[0], bufs)

    def put_batch(self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None) -> int:
        """Store many objects in one master round trip. 0, or the first error code."""
        rcs = self._batch_put(keys, values, config, upsert=False, op="put_batch")
        return next((rc for rc in rcs if rc < 0), OK) if isinstance(rcs, list) else rcs

    def upsert_batch(self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None) -> int:
        rcs = self._batch_put(keys, values, config, upsert=True, op="upsert_batch")
        return next((rc for rc in rcs if rc < 0), OK) if isinstance(rcs, list) else rcs

    def _batch_put(self, keys: Any, values: Any, config: Any, *, upsert: bool, op: str) -> list[int] | int:
        keys = _check_keys(keys, op)
        if not isinstance(values, (list, tuple)):
            raise TypeError(f"{op}: values must be a list of bytes-like objects, got {type(values).__name__}")
        if len(keys) != len(values):
            raise ValueError(f"{op}: {len(keys)} keys but {len(values)} values")
        if len(set(keys)) != len(keys):
            raise ValueError(f"{op}: duplicate keys in one batch")
        cfg = _check_config(config, op)
        if not keys:
            return []
        bufs = [_buffer_addr(v, f"{op}: values[{i}]") for i, v in enumerate(values)]
        if upsert:
            self._forget(keys)
        return self._call_list(lambda: self._put_many(keys, [[(a, s)] for a, s, _ in bufs], cfg, upsert=upsert,
                                                      op=op), len(keys), bufs)

    def get(self, key: str) -> bytes:
        """The bytes stored under ``key``; ``b''`` if missing (or on any error)."""
        key = _check_key(key, "get")
        dests: list[Any] = [None]
        rc = self._call(lambda: self._read_batch([key], dests, "get")[0])
        if rc < 0 or dests[0] is None:
            return b""
        return dests[0][0]

    def get_batch(self, keys: list[str]) -> list[bytes]:
        """One ``bytes`` per key (``b''`` for a miss)."""
        keys = _check_keys(keys, "get_batch")
        if not keys:
            return []
        dests: list[Any] = [None] * len(keys)
        rcs = self._call_list(lambda: self._read_batch(keys, dests, "get_batch"), len(keys))
        return [dests[i][0] if rcs[i] >= 0 and dests[i] is not None else b"" for i in range(len(keys))]

    def get_buffer(self, key: str) -> memoryview | None:
        """The object as a buffer-protocol object (a memoryview over fresh bytes), or None."""
        data = self.get(key)
        return memoryview(data) if data or self.is_exist(key) == 1 else None

    def batch_get_buffer(self, keys: list[str]) -> list[memoryview | None]:
        """One buffer-protocol object per key (None for a miss)."""
        keys = _check_keys(keys, "batch_get_buffer")
        return [memoryview(d) if d else None for d in self.get_batch(keys)]

    def get_replica_desc(self, key: str) -> list[Any]:
        """Replica descriptors of ``key`` (segment_name, addr, size, kind, path, status); [] if missing."""
        key = _check_key(key, "get_replica_desc")
        try:
            self._require_ready("get_replica_desc")
            return list(self._master.get_replica_list(key).replicas)
        except MooncakeError as e:
            if e.code != _NOT_FOUND:
                log.warning("get_replica_desc(%r): %s", key, e)
            return []

    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[Any]]:
        keys = _check_keys(keys, "batch_get_replica_desc")
        return {k: self.get_replica_desc(k) for k in keys}

    # ================================================================== public API: zero-copy
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Register caller memory for zero-copy ``put_from``/``get_into``. 0 or negative."""
        buffer_ptr = _check_int(buffer_ptr, "register_buffer: buffer_ptr", minimum=1)
        size = _check_int(size, "register_buffer: size", minimum=1)
        try:
            self._require_ready("register_buffer")
            rc = self._engine.register_memory(buffer_ptr, size, "cpu:0")
        except MooncakeError as e:
            log.error("%s", e)
            return e.code
        if rc not in (0, None):
            return int(rc)
        self._registered[buffer_ptr] = size
        return OK

    def unregister_buffer(self, buffer_ptr: int) -> int:
        buffer_ptr = _check_int(buffer_ptr, "unregister_buffer: buffer_ptr", minimum=1)
        if buffer_ptr not in self._registered:
            log.warning("unregister_buffer: %#x was not registered", buffer_ptr)
            return _INVALID
        del self._registered[buffer_ptr]
        try:
            rc = self._engine.unregister_memory(buffer_ptr)
        except Exception as e:  # noqa: BLE001
            log.warning("unregister_memory(%#x): %s", buffer_ptr, e)
            return _INTERNAL
        return OK if rc in (0, None) else int(rc)

    def put_from(self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None) -> int:
        """Store ``size`` bytes at ``buffer_ptr`` (written straight from that memory)."""
        key = _check_key(key, "put_from")
        buffer_ptr = _check_int(buffer_ptr, "put_from: buffer_ptr", minimum=1)
        size = _check_int(size, "put_from: size")
        cfg = _check_config(config, "put_from")
        return self._call(lambda: self._put_many([key], [[(buffer_ptr, size)]], cfg, upsert=False, op="put_from")[0])

    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None) -> int:
        key = _check_key(key, "upsert_from")
        buffer_ptr = _check_int(buffer_ptr, "upsert_from: buffer_ptr", minimum=1)
        size = _check_int(size, "upsert_from: size")
        cfg = _check_config(config, "upsert_from")
        self._forget([key])
        return self._call(lambda: self._put_many([key], [[(buffer_ptr, size)]], cfg, upsert=True,
                                                 op="upsert_from")[0])

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Read ``key`` into ``[buffer_ptr, buffer_ptr+size)``: bytes read, or negative
        (-704 missing, -600 buffer too small, -707 lease expired, -800 transfer, -900 RPC)."""
        key = _check_key(key, "get_into")
        buffer_ptr = _check_int(buffer_ptr, "get_into: buffer_ptr", minimum=1)
        size = _check_int(size, "get_into: size")
        return self._call(lambda: self._read_batch([key], [[(buffer_ptr, size)]], "get_into")[0])

    def batch_put_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                       config: ReplicateConfig | None = None) -> list[int]:
        return self._batch_from(keys, buffer_ptrs, sizes, config, upsert=False, op="batch_put_from")

    def batch_upsert_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                          config: ReplicateConfig | None = None) -> list[int]:
        return self._batch_from(keys, buffer_ptrs, sizes, config, upsert=True, op="batch_upsert_from")

    def _batch_from(self, keys: Any, ptrs: Any, sizes: Any, config: Any, *, upsert: bool, op: str) -> list[int]:
        keys = _check_keys(keys, op)
        ptrs, sizes = self._check_ptr_lists(op, keys, ptrs, sizes)
        if len(set(keys)) != len(keys):
            raise ValueError(f"{op}: duplicate keys in one batch")
        cfg = _check_config(config, op)
        if not keys:
            return []
        if upsert:
            self._forget(keys)
        return self._call_list(lambda: self._put_many(keys, [[ps] for ps in zip(ptrs, sizes)], cfg, upsert=upsert, op=op),
                               len(keys))

    def batch_get_into(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]:
        """Per key: bytes read or a negative code. Every read is checked against its lease."""
        keys = _check_keys(keys, "batch_get_into")
        ptrs, sizes = self._check_ptr_lists("batch_get_into", keys, buffer_ptrs, sizes)
        if not keys:
            return []
        dests: list[Any] = [[ps] for ps in zip(ptrs, sizes)]
        return self._call_list(lambda: self._read_batch(keys, dests, "batch_get_into"), len(keys))

    def batch_put_from_multi_buffers(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                     all_sizes: list[list[int]], config: ReplicateConfig | None = None) -> list[int]:
        """Object i = the concatenation of buffers ``all_buffer_ptrs[i]`` (scatter-gather, no copy)."""
        keys = _check_keys(keys, "batch_put_from_multi_buffers")
        parts = self._check_multi("batch_put_from_multi_buffers", keys, all_buffer_ptrs, all_sizes)
        if len(set(keys)) != len(keys):
            raise ValueError("batch_put_from_multi_buffers: duplicate keys in one batch")
        cfg = _check_config(config, "batch_put_from_multi_buffers")
        if not keys:
            return []
        return self._call_list(lambda: self._put_many(keys, parts, cfg, upsert=False,
                                                      op="batch_put_from_multi_buffers"), len(keys))

    def batch_get_into_multi_buffers(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                     all_sizes: list[list[int]], prefer_alloc_in_same_node: bool = False) -> list[int]:
        """Read object i into the buffers of ``all_buffer_ptrs[i]`` in order; bytes read or <0."""
        keys = _check_keys(keys, "batch_get_into_multi_buffers")
        parts = self._check_multi("batch_get_into_multi_buffers", keys, all_buffer_ptrs, all_sizes)
        if not keys:
            return []
        return self._call_list(lambda: self._read_batch(keys, list(parts), "batch_get_into_multi_buffers"),
                               len(keys))

    @staticmethod
    def _check_multi(op: str, keys: list[str], all_ptrs: Any, all_sizes: Any) -> list[list[tuple[int, int]]]:
        if not isinstance(all_ptrs, (list, tuple)) or not isinstance(all_sizes, (list, tuple)):
            raise TypeError(f"{op}: all_buffer_ptrs and all_sizes must be lists of lists of int")
        if not len(keys) == len(all_ptrs) == len(all_sizes):
            raise ValueError(f"{op}: {len(keys)} keys, {len(all_ptrs)} pointer lists, {len(all_sizes)} size lists "
                             "(must match)")
        out = []
        for i, (ptrs, sizes) in enumerate(zip(all_ptrs, all_sizes)):
            if not isinstance(ptrs, (list, tuple)) or not isinstance(sizes, (list, tuple)) or len(ptrs) != len(sizes):
                raise ValueError(f"{op}: all_buffer_ptrs[{i}] and all_sizes[{i}] must be lists of equal length")
            out.append([(_check_int(p, f"{op}: all_buffer_ptrs[{i}]", minimum=1),
                         _check_int(n, f"{op}: all_sizes[{i}]")) for p, n in zip(ptrs, sizes)])
        return out

    @staticmethod
    def _check_ptr_lists(op: str, keys: list[str], ptrs: Any, sizes: Any) -> tuple[list[int], list[int]]:
        if not isinstance(ptrs, (list, tuple)) or not isinstance(sizes, (list, tuple)):
            raise TypeError(f"{op}: buffer_ptrs and sizes must be lists of int")
        if not len(keys) == len(ptrs) == len(sizes):
            raise ValueError(f"{op}: {len(keys)} keys, {len(ptrs)} buffer_ptrs, {len(sizes)} sizes (must match)")
        return ([_check_int(p, f"{op}: buffer_ptrs[{i}]", minimum=1) for i, p in enumerate(ptrs)],
                [_check_int(s, f"{op}: sizes[{i}]") for i, s in enumerate(sizes)])

    # ================================================================== public API: metadata ops
    def is_exist(self, key: str) -> int:
        """1 exists, 0 does not, -1 error (upstream convention)."""
        key = _check_key(key, "is_exist")
        try:
            self._require_ready("is_exist")
            return 1 if self._master.exist_key(key) else 0
        except MooncakeError as e:
            log.warning("is_exist(%r): %s", key, e)
            return -1

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        keys = _check_keys(keys, "batch_is_exist")
        if not keys:
            return []
        try:
            self._require_ready("batch_is_exist")
            return [1 if x else 0 for x in self._master.batch_exist_key(keys)]
        except MooncakeError as e:
            log.warning("batch_is_exist: %s", e)
            return [-1] * len(keys)

    def get_size(self, key: str) -> int:
        """Object size in bytes, or negative (-704 missing)."""
        key = _check_key(key, "get_size")
        return self._call(lambda: int(self._master.get_size(key)), need_ready="get_size")

    def remove(self, key: str, force: bool = False) -> int:
        """0, -704 missing, -706 leased (unless ``force``)."""
        key = _check_key(key, "remove")
        if not isinstance(force, bool):
            raise TypeError(f"remove: force must be bool, got {type(force).__name__}")

        def run() -> int:
            self._master.remove(key, force)
            self._forget([key])
            return OK
        return self._call(run, need_ready="remove")

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Number of objects removed, or negative."""
        if not isinstance(regex_pattern, str):
            raise TypeError(f"remove_by_regex: regex_pattern must be str, got {type(regex_pattern).__name__}")
        if not isinstance(force, bool):
            raise TypeError(f"remove_by_regex: force must be bool, got {type(force).__name__}")
        import re

        try:
            compiled = re.compile(regex_pattern)
        except re.error as e:
            raise ValueError(f"remove_by_regex: invalid regular expression {regex_pattern!r}: {e}") from None

        def run() -> int:
            n = int(self._master.remove_by_regex(regex_pattern, force))
            self._forget_removed(force, lambda k: compiled.search(k) is not None)
            return n
        return self._call(run, need_ready="remove_by_regex")

    def remove_all(self, force: bool = False) -> int:
        """Number of objects removed, or negative."""
        if not isinstance(force, bool):
            raise TypeError(f"remove_all: force must be bool, got {type(force).__name__}")

        def run() -> int:
            n = int(self._master.remove_all(force))
            self._forget_removed(force, None)
            return n
        return self._call(run, need_ready="remove_all")

    def _forget_removed(self, force: bool, pred: Any) -> None:
        """After remove_all / remove_by_regex: stop re-reporting the owned objects that are
        gone. Without ``force`` the master skipped leased ones; those stay in the index (or a
        master change would lose them), so ask which of the matching keys still exist."""
        entries = self._owned.entries(pred)
        if force or not entries:
            self._owned.discard_entries(entries)
            return
        gone = []
        for i in range(0, len(entries), 4096):
            chunk = entries[i:i + 4096]
            exists = self._master.batch_exist_key([e.key for e in chunk])
            gone.extend(e for e, x in zip(chunk, exists) if not x)
        self._owned.discard_entries(gone)

    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]:
        """One code per key: 0, -704, -706."""
        keys = _check_keys(keys, "batch_remove")
        if not isinstance(force, bool):
            raise TypeError(f"batch_remove: force must be bool, got {type(force).__name__}")
        if not keys:
            return []

        def run() -> list[int]:
            rcs = [int(x) for x in self._master.batch_remove(keys, force)]
            self._forget([k for k, rc in zip(keys, rcs) if rc == 0])
            return rcs
        return self._call_list(run, len(keys), need_ready="batch_remove")

    # ================================================================== public API: tensors
    def put_tensor(self, key: str, tensor: Any) -> int:
        return self.pub_tensor(key, tensor)

    def pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        """Store a torch tensor (header + raw elements, written from the tensor's memory)."""
        return self._tensor_put(key, tensor, config, upsert=False, op="put_tensor")

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        return self._tensor_put(key, tensor, None, upsert=True, op="upsert_tensor")

    def upsert_pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        return self._tensor_put(key, tensor, config, upsert=True, op="upsert_pub_tensor")

    def _tensor_put(self, key: str, tensor: Any, config: Any, *, upsert: bool, op: str) -> int:
        key = _check_key(key, op)
        cfg = _check_config(config, op)
        header, payload, keep = _tensor.tensor_payload(tensor)
        # two parts, header + the tensor's own memory: written without a staging copy
        parts = [(_bytes_addr(header), len(header))]
        if len(payload):
            parts.append((_buffer_addr(payload, op)[0], len(payload)))
        if upsert:
            self._forget([key])
        return self._call(lambda: self._put_many([key], [parts], cfg, upsert=upsert, op=op)[0],
                          (header, payload, keep))

    def get_tensor(self, key: str) -> Any:
        """The tensor stored with ``put_tensor``, or None if missing."""
        key = _check_key(key, "get_tensor")
        _tensor.require_torch()
        size = self.get_size(key)
        if size < 0:
            return None
        buf = np.empty(size, dtype=np.uint8)
        rc = self._call(lambda: self._read_batch([key], [[(int(buf.ctypes.data), size)]], "get_tensor")[0])
        if rc < 0:
            return None
        return _tensor.tensor_from_buffer(buf[:rc])

    def batch_put_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        keys = _check_keys(keys, "batch_put_tensor")
        if not isinstance(tensors_list, (list, tuple)) or len(tensors_list) != len(keys):
            raise ValueError("batch_put_tensor: tensors_list must be a list as long as keys")
        return [self.put_tensor(k, t) for k, t in zip(keys, tensors_list)]

    def batch_pub_tensor(self, keys: list[str], tensors_list: list[Any],
                         config: ReplicateConfig | None = None) -> list[int]:
        keys = _check_keys(keys, "batch_pub_tensor")
        if not isinstance(tensors_list, (list, tuple)) or len(tensors_list) != len(keys):
            raise ValueError("batch_pub_tensor: tensors_list must be a list as long as keys")
        return [self.pub_tensor(k, t, config) for k, t in zip(keys, tensors_list)]

    def batch_get_tensor(self, keys: list[str]) -> list[Any]:
        keys = _check_keys(keys, "batch_get_tensor")
        return [self.get_tensor(k) for k in keys]

    def put_tensor_with_tp(self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> int:
        """Split along ``split_dim`` into ``tp_size`` uniform shards stored as
        ``{key}_tp_{rank}`` (-600 for an uneven split, as the original)."""
        return self.pub_tensor_with_tp(key, tensor, None, tp_rank, tp_size, split_dim)

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> Any:
        if tp_size <= 1:
            return self.get_tensor(key)
        return self.get_tensor(f"{key}_tp_{tp_rank}")

    # ================================================================== error boundary
    def _call(self, fn: Any, keepalive: Any = None, need_ready: str | None = None) -> int:
        """Run ``fn`` turning MooncakeError into its code (never raising into user code for
        runtime failures; argument errors were raised before this point)."""
        try:
            if need_ready:
                self._require_ready(need_ready)
            return fn()
        except MooncakeError as e:
            if e.code not in (_NOT_FOUND, _EXISTS):
                log.warning("%s", e)
            return e.code
        finally:
            del keepalive

    def _call_list(self, fn: Any, n: int, keepalive: Any = None, need_ready: str | None = None) -> list[int]:
        try:
            if need_ready:
                self._require_ready(need_ready)
            return fn()
        except MooncakeError as e:
            log.warning("%s", e)
            return [e.code] * n
        finally:
            del keepalive
