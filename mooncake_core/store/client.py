"""``MooncakeDistributedStore``: the Mooncake Store client, with upstream's Python API.

This module is the public façade (docs/architecture.md): every method of upstream's
``MooncakeDistributedStore`` is here with its signature and contract, and forwards to one of
four API families -- delegates typed against ``internals.StoreInternals``:

* ``object_api.ObjectApi``   -- bytes, zero-copy buffers, existence / size / removal;
* ``tensor_api.TensorApi``   -- torch tensors, ``_into``/``_from`` buffers, TP shards;
* ``parallel_api.ParallelApi`` -- ``*_tensor_with_parallelism*``;
* ``range_api.RangeApi``     -- byte ranges, put/get sessions, replica clearing.

State, lifecycle and the whole-object data path are ``core.StoreCore``'s; background work
(heartbeat, re-mount, offload, promotion) ``maintenance.Maintenance``'s. How a put and a get
flow is described in ``core.py`` and docs/store.md.

Errors inside the library are ``MooncakeError``; at the public boundary they become the
upstream integer codes (0 / negative). Bad argument *types* and malformed calls raise
``TypeError`` / ``ValueError`` naming the argument, as the pybind11 original does; where the
original answers a bad *value* with a code (setup's sizes, mismatched batch list lengths, a
soft-pin TTL without soft pinning) so do we, logging what was wrong.
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mooncake_core.store.codes import EXIST_ERROR, INVALID, OK
from mooncake_core.store.config import DummyAttach, StoreConfig
from mooncake_core.store.core import StoreCore
from mooncake_core.store.object_api import ObjectApi
from mooncake_core.store.parallel_api import ParallelApi
from mooncake_core.store.pool_api import PoolApi
from mooncake_core.store.protocol import ReplicaDesc
from mooncake_core.store.range_api import RangeApi
from mooncake_core.store.shm import Region
from mooncake_core.store.tensor_api import TensorApi
from mooncake_core.store.tensor_io import TensorIO
from mooncake_core.store.types import BufferHandle, QueryTaskResponse, ReplicaStatus, ReplicateConfig, SoftPinAction
from mooncake_core.utils.log import get_logger

__all__ = ["EXIST_ERROR", "MooncakeDistributedStore", "ReplicaStatus", "ReplicateConfig", "SoftPinAction"]

log = get_logger("mooncake.store.client")

if TYPE_CHECKING:
    from mooncake_core.store.dummy_client import DummyClient


class MooncakeDistributedStore:
    """Mooncake Store client. Create, ``setup(...)``, use, ``close()``.

    Thread-safe: many threads may put/get concurrently through one instance.
    """

    def __init__(self) -> None:
        self._core = StoreCore()
        self._objects = ObjectApi(self._core)
        self._tensors = TensorApi(self._core, self._objects)
        self._ranges = RangeApi(self._core)
        self._parallel = ParallelApi(self._objects, self._tensors, self._ranges)
        self._pool = PoolApi(self._core)
        self._core.local.extra_regions = self._pool.mounted_regions  # replicas may lie in memory it mounted
        self._pool.tasks_busy = self._core.maintenance.replica_tasks.busy
        self._core.maintenance.after_remount.append(self._pool.remount)
        self._tensor_io = TensorIO(self._tensors)
        self._at_exit: Callable[[], None] | None = None
        self._dummy: DummyClient | None = None
        self._pool_regions: dict[int, Region] = {}

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
        Returns 0, or a negative Mooncake code: -600 for an invalid value (logged, naming the
        field: upstream answers ``"50%"`` with a code, not an exception), or the code of the
        service that could not be reached. Arguments of the wrong kind raise TypeError.

        A dict naming ``client_server_address`` ("host:port" of this node's ``mooncake_client``)
        attaches as a dummy instead: ``setup_dummy(mem_pool_size, local_buffer_size, address)``
        (both sizes optional; the keys a full client's dict carries for the pool are the
        service's own and are not used). Returns ``setup_dummy``'s code (0 / -1).
        """
        if DummyAttach.wanted(local_hostname):
            return self._setup_dummy_from_dict(local_hostname)
        try:
            cfg = self._setup_config(local_hostname, metadata_server, global_segment_size, local_buffer_size,
                                     protocol, rdma_devices, master_server_addr, enable_ssd_offload,
                                     ssd_offload_path, tenant_id, enable_client_http_server, client_http_port)
        except ValueError as e:
            log.error("store setup refused: %s", e)
            return INVALID
        rc = self._core.start(cfg, engine)
        if rc == OK:
            self._close_at_exit()
        return rc

    def _setup_dummy_from_dict(self, config: Any) -> int:
        try:
            attach = DummyAttach.from_dict(config)
        except ValueError as e:
            log.error("store setup refused: %s", e)
            return -1
        if attach.ignored:
            log.info("setup(config): attaching to mooncake_client at %s as a dummy client; %s belong to the "
                     "service and are not used here", attach.server_address, ", ".join(attach.ignored))
        return self.setup_dummy(attach.mem_pool_size, attach.local_buffer_size, attach.server_address)

    @staticmethod
    def _setup_config(local_hostname: Any, metadata_server: Any, global_segment_size: Any, local_buffer_size: Any,
                      protocol: str, rdma_devices: str, master_server_addr: str, enable_ssd_offload: Any,
                      ssd_offload_path: str, tenant_id: str, enable_client_http_server: Any,
                      client_http_port: int) -> StoreConfig:
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
        return cfg

    def _close_at_exit(self) -> None:
        """A script that ends without ``close()`` is closed quietly at exit, before the
        Transfer Engine it set up (atexit runs last-registered first; the engine registered its
        own hook during setup): torn down after its engine, the store would log the failed
        unregistration of memory the closed engine no longer has."""
        ref = weakref.ref(self)

        def close_quietly() -> None:
            store = ref()
            if store is not None and store._core.ready:
                store._core.teardown(quiet=True)
        self._at_exit = close_quietly
        atexit.register(close_quietly)

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """Attach to the node's ``mooncake_client`` at ``server_address`` ("host:port", this
        host) as a *dummy* client: no segment here; every call runs on the service's store and
        bytes move through memory both processes map (``alloc_from_mem_pool`` buffers; a
        ``local_buffer_size`` staging window per calling thread). ``mem_pool_size`` bounds the
        ``alloc_from_mem_pool`` total. Objects stored belong to the service's pool: they outlive
        this process. 0, or -1 with the reason logged (service not running, refused...)."""
        from mooncake_core.store.dummy_client import DummyClient

        if self._dummy is not None or self._core.ready:
            log.error("setup_dummy: this store is already set up")
            return -1
        backend = DummyClient()
        rc = backend.setup(mem_pool_size, local_buffer_size, server_address)
        if rc != 0:
            return rc
        self._dummy = backend
        local = {"register_buffer", "unregister_buffer", "alloc_from_mem_pool", "health_check", "get_hostname"}
        for name in _FORWARDED:
            setattr(self, name, getattr(backend, name) if name in local else backend.forwarder(name))
        return 0

    def alloc_from_mem_pool(self, size: int) -> int:
        """A buffer of ``size`` bytes for zero-copy ``put_from``/``get_into`` (0 on failure).
        On a dummy client it is memory shared with ``mooncake_client``; on a full client,
        page-aligned memory of this process (freed by ``close``)."""
        from mooncake_core.store.shm import create_region

        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            log.error("alloc_from_mem_pool: size must be a positive integer, got %r", size)
            return 0
        try:
            r = create_region(size, "mooncake-pool")
        except OSError as e:
            log.error("alloc_from_mem_pool(%d): %s", size, e)
            return 0
        self._pool_regions[r.addr] = r
        return r.addr

    def close(self) -> int:
        """Stop the heartbeat, unmount our segment (its objects leave the pool), free memory.
        A dummy client detaches (its objects stay in the service's pool)."""
        if self._dummy is not None:
            dummy, self._dummy = self._dummy, None
            for name in _FORWARDED:
                self.__dict__.pop(name, None)
            return dummy.close()
        if self._at_exit is not None:
            atexit.unregister(self._at_exit)
            self._at_exit = None
        self._pool.close()  # memory it mounted leaves the pool first
        rc = self._core.close()
        regions, self._pool_regions = self._pool_regions, {}
        for r in regions.values():
            r.close()
        return rc

    def __enter__(self) -> MooncakeDistributedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            core = getattr(self, "_core", None)
            if core is not None and core.ready:
                core.teardown(quiet=True)
        except Exception:  # noqa: BLE001
            pass

    @property
    def local_buffer_size(self) -> int:
        """setup's local_buffer_size (0 before setup): what a ``BufferPool`` registers as its arena."""
        return self._core.local_buffer_size

    def get_hostname(self) -> str:
        """Our segment name ("host:port"), as other clients see it in replica descriptors."""
        return self._core.segment_name

    def health_check(self) -> int:
        """0 healthy, 1 not set up / closed, 2 master unreachable (upstream convention)."""
        return self._core.health_check()

    # ================================================================== objects: bytes, buffers, exist/size/remove
    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Store ``value`` (any bytes-like) under ``key``. 0 on success (also when the key
        already exists: objects are immutable, the old value stays); negative code on error."""
        return self._objects.put(key, value, config)

    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Insert or replace ``key`` (readers holding a lease on the old value keep it).
        0 only when this value was published; -704 when the master changed during the
        write and lost the put in progress (the old value, if any, stays: retry)."""
        return self._objects.upsert(key, value, config)

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        """Store the concatenation of ``parts`` as one object (written part by part, no join)."""
        return self._objects.put_parts(key, *parts, config=config)

    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        return self._objects.upsert_parts(key, *parts, config=config)

    def put_batch(self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None) -> int:
        """Store many objects in one master round trip. 0, or the first error code."""
        return self._objects.put_batch(keys, values, config)

    def upsert_batch(self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None) -> int:
        return self._objects.upsert_batch(keys, values, config)

    def get(self, key: str) -> bytes:
        """The bytes stored under ``key``; ``b''`` if missing (or on any error)."""
        return self._objects.get(key)

    def get_batch(self, keys: list[str]) -> list[bytes]:
        """One ``bytes`` per key (``b''`` for a miss)."""
        return self._objects.get_batch(keys)

    def get_buffer(self, key: str) -> BufferHandle | None:
        """The object as a ``BufferHandle`` (bytes with upstream's ``ptr()``/``size()``), or None."""
        return self._objects.get_buffer(key)

    def batch_get_buffer(self, keys: list[str]) -> list[BufferHandle | None]:
        """One buffer-protocol object per key (None for a miss)."""
        return self._objects.batch_get_buffer(keys)

    def get_replica_desc(self, key: str) -> list[ReplicaDesc]:
        """Replica descriptors of ``key`` (segment_name, addr, size, kind, path, status); [] if missing."""
        return self._objects.get_replica_desc(key)

    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[ReplicaDesc]]:
        return self._objects.batch_get_replica_desc(keys)

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Register caller memory for zero-copy ``put_from``/``get_into``. 0 or negative."""
        return self._objects.register_buffer(buffer_ptr, size)

    def unregister_buffer(self, buffer_ptr: int) -> int:
        return self._objects.unregister_buffer(buffer_ptr)

    def put_from(self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None) -> int:
        """Store ``size`` bytes at ``buffer_ptr`` (written straight from that memory)."""
        return self._objects.put_from(key, buffer_ptr, size, config)

    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None) -> int:
        return self._objects.upsert_from(key, buffer_ptr, size, config)

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Read ``key`` into ``[buffer_ptr, buffer_ptr+size)``: bytes read, or negative
        (-704 missing, -600 buffer too small, -707 lease expired, -800 transfer, -900 RPC)."""
        return self._objects.get_into(key, buffer_ptr, size)

    def batch_put_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                       config: ReplicateConfig | None = None) -> list[int]:
        return self._objects.batch_put_from(keys, buffer_ptrs, sizes, config)

    def batch_upsert_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                          config: ReplicateConfig | None = None) -> list[int]:
        return self._objects.batch_upsert_from(keys, buffer_ptrs, sizes, config)

    def batch_get_into(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]:
        """Per key: bytes read or a negative code. Every read is checked against its lease."""
        return self._objects.batch_get_into(keys, buffer_ptrs, sizes)

    def batch_put_from_multi_buffers(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                     all_sizes: list[list[int]],
                                     config: ReplicateConfig | None = None) -> list[int]:
        """Object i = the concatenation of buffers ``all_buffer_ptrs[i]`` (scatter-gather, no copy)."""
        return self._objects.batch_put_from_multi_buffers(keys, all_buffer_ptrs, all_sizes, config)

    def batch_get_into_multi_buffers(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                     all_sizes: list[list[int]],
                                     prefer_alloc_in_same_node: bool = False) -> list[int]:
        """Read object i into the buffers of ``all_buffer_ptrs[i]`` in order; bytes read or <0."""
        return self._objects.batch_get_into_multi_buffers(keys, all_buffer_ptrs, all_sizes,
                                                          prefer_alloc_in_same_node)

    def is_exist(self, key: str) -> int:
        """1 exists, 0 does not, -1 error (upstream convention).

        The -1 is :data:`EXIST_ERROR`, an int that is *falsy*: callers that test the result
        as a truth value (LMCache's Mooncake adapter does ``if store.is_exist(k)``) read an
        unreachable master as a miss, not as a hit, while ``== -1`` / ``< 0`` still hold."""
        return self._objects.is_exist(key)

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        """Per key 1 / 0, or :data:`EXIST_ERROR` (a falsy -1) for every key on an error."""
        return self._objects.batch_is_exist(keys)

    def get_size(self, key: str) -> int:
        """Object size in bytes, or negative (-704 missing)."""
        return self._objects.get_size(key)

    def remove(self, key: str, force: bool = False) -> int:
        """0, -704 missing, -706 leased (unless ``force``)."""
        return self._objects.remove(key, force)

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Number of objects removed, or negative."""
        return self._objects.remove_by_regex(regex_pattern, force)

    def remove_all(self, force: bool = False) -> int:
        """Number of objects removed, or negative."""
        return self._objects.remove_all(force)

    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]:
        """One code per key: 0, -704, -706."""
        return self._objects.batch_remove(keys, force)

    # ================================================================== tensors: whole, into/from buffers, TP shards
    def put_tensor(self, key: str, tensor: Any) -> int:
        return self._tensors.put_tensor(key, tensor)

    def pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        """Store a torch tensor (header + raw elements, written from the tensor's memory)."""
        return self._tensors.pub_tensor(key, tensor, config)

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        return self._tensors.upsert_tensor(key, tensor)

    def upsert_pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        return self._tensors.upsert_pub_tensor(key, tensor, config)

    def get_tensor(self, key: str) -> Any:
        """The tensor stored with ``put_tensor``, or None if missing."""
        return self._tensors.get_tensor(key)

    def batch_put_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        return self._tensors.batch_put_tensor(keys, tensors_list)

    def batch_pub_tensor(self, keys: list[str], tensors_list: list[Any],
                         config: ReplicateConfig | None = None) -> list[int]:
        return self._tensors.batch_pub_tensor(keys, tensors_list, config)

    def batch_get_tensor(self, keys: list[str]) -> list[Any]:
        return self._tensors.batch_get_tensor(keys)

    def put_tensor_with_tp(self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> int:
        """Split along ``split_dim`` into ``tp_size`` uniform shards stored as
        ``{key}_tp_{rank}`` (-600 for an uneven split, as the original)."""
        return self._tensors.put_tensor_with_tp(key, tensor, tp_rank, tp_size, split_dim)

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> Any:
        """Rank ``tp_rank``'s shard of a ``tp_size`` split of ``key`` (the whole tensor when
        tp_size <= 1). Written with another TP size, the shard is cut from the stored shards
        (only the overlapping bytes are read); None on a miss or a non-uniform split."""
        return self._parallel.get_tensor_with_tp(key, tp_rank, tp_size, split_dim)

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        """Read the tensor object ``key`` into ``[buffer_ptr, buffer_ptr+size)`` and return a
        tensor aliasing the element bytes there; None if missing, too big for the buffer
        (logged), or not a tensor. The buffer must outlive the returned tensor."""
        return self._tensors.get_tensor_into(key, buffer_ptr, size)

    def batch_get_tensor_into(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[Any]:
        """``get_tensor_into`` for many keys in one master round trip; one tensor/None per key."""
        return self._tensors.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Store the serialized tensor object held at ``buffer_ptr`` (e.g. what
        ``get_tensor_into`` read). 0, -600 if the buffer does not hold one, or a store code."""
        return self._tensors.put_tensor_from(key, buffer_ptr, size)

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """``put_tensor_from`` that replaces an existing object."""
        return self._tensors.upsert_tensor_from(key, buffer_ptr, size)

    def batch_put_tensor_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]:
        """Batch ``put_tensor_from``; any invalid buffer fails the whole batch with -600."""
        return self._tensors.batch_put_tensor_from(keys, buffer_ptrs, sizes)

    def batch_upsert_tensor_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]:
        """Batch ``upsert_tensor_from``."""
        return self._tensors.batch_upsert_tensor_from(keys, buffer_ptrs, sizes)

    def batch_upsert_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        """Insert or replace many tensors in one master round trip; one code per key."""
        return self._tensors.batch_upsert_tensor(keys, tensors_list)

    def batch_upsert_pub_tensor(self, keys: list[str], tensors_list: list[Any], config: Any = None) -> list[int]:
        """``batch_upsert_tensor`` with a ReplicateConfig."""
        return self._tensors.batch_upsert_pub_tensor(keys, tensors_list, config)

    def pub_tensor_with_tp(self, key: str, tensor: Any, config: Any = None, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> int:
        """Split ``tensor`` into ``tp_size`` uniform shards along ``split_dim`` and store all
        of them as ``{key}_tp_{rank}`` with ``config``. 0, -600 for an uneven split or a bad
        ``split_dim``, or a store code. (``tp_rank`` is accepted for upstream compatibility.)"""
        return self._tensors.pub_tensor_with_tp(key, tensor, config, tp_rank, tp_size, split_dim)

    def batch_put_tensor_with_tp(self, base_keys: list[str], tensors_list: list[Any], tp_rank: int = 0,
                                 tp_size: int = 1, split_dim: int = 0) -> list[int]:
        """``put_tensor_with_tp`` for many tensors in one batch; one code per base key."""
        return self._tensors.batch_put_tensor_with_tp(base_keys, tensors_list, tp_rank, tp_size, split_dim)

    def batch_pub_tensor_with_tp(self, base_keys: list[str], tensors_list: list[Any], config: Any = None,
                                 tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> list[int]:
        """``pub_tensor_with_tp`` for many tensors in one batch; one code per base key."""
        return self._tensors.batch_pub_tensor_with_tp(base_keys, tensors_list, config, tp_rank, tp_size, split_dim)

    def batch_get_tensor_with_tp(self, base_keys: list[str], tp_rank: int = 0, tp_size: int = 1) -> list[Any]:
        """Rank ``tp_rank``'s shard of each base key (the whole tensor when tp_size <= 1), cut
        from the stored split when it was written with another TP size; None per miss."""
        return self._parallel.batch_get_tensor_with_tp(base_keys, tp_rank, tp_size)

    def put_tensor_with_tp_from(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int = 0) -> int:
        """Like ``put_tensor_with_tp`` for a *full* tensor held serialized at ``buffer_ptr``
        (header + elements): its shards are stored as ``{key}_tp_{rank}``."""
        return self._tensors.put_tensor_with_tp_from(key, buffer_ptr, size, tp_rank, tp_size, split_dim)

    def batch_put_tensor_with_tp_from(self, base_keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                      tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> list[int]:
        """Batch ``put_tensor_with_tp_from``; a buffer that is not a tensor object gets -600
        (the others are still stored)."""
        return self._tensors.batch_put_tensor_with_tp_from(base_keys, buffer_ptrs, sizes, tp_rank, tp_size,
                                                           split_dim)

    def get_tensor_with_tp_into(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int = 0) -> Any:
        """``get_tensor_into`` of rank ``tp_rank``'s shard of a ``tp_size`` split (assembled in
        the buffer from the stored shards when written with another TP size), or of ``key``
        itself when tp_size <= 1."""
        return self._parallel.get_tensor_with_tp_into(key, buffer_ptr, size, tp_rank, tp_size, split_dim)

    def batch_get_tensor_with_tp_into(self, base_keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                      tp_rank: int = 0, tp_size: int = 1) -> list[Any]:
        """``batch_get_tensor_into`` of rank ``tp_rank``'s shards."""
        return self._parallel.batch_get_tensor_with_tp_into(base_keys, buffer_ptrs, sizes, tp_rank, tp_size)

    # ================================================================== tensors with parallelism
    def put_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: Any = None, config: Any = None,
                                    writer_partition: Any = None) -> int:
        """Store ``tensor`` as the object named by ``parallelism`` (full tensor when None), or
        the ``writer_partition`` ``(rank, size, split_dim)`` slice of it. 0 or negative."""
        return self._parallel.put_tensor_with_parallelism(key, tensor, parallelism, config, writer_partition)

    def upsert_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: Any = None, config: Any = None,
                                       writer_partition: Any = None) -> int:
        """``put_tensor_with_parallelism`` that replaces an existing object."""
        return self._parallel.upsert_tensor_with_parallelism(key, tensor, parallelism, config, writer_partition)

    def put_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism: Any = None,
                                         config: Any = None, writer_partition: Any = None) -> int:
        """``put_tensor_with_parallelism`` of the tensor serialized at ``buffer_ptr``."""
        return self._parallel.put_tensor_with_parallelism_from(key, buffer_ptr, size, parallelism, config,
                                                               writer_partition)

    def upsert_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism: Any = None,
                                            config: Any = None, writer_partition: Any = None) -> int:
        return self._parallel.upsert_tensor_with_parallelism_from(key, buffer_ptr, size, parallelism, config,
                                                                  writer_partition)

    def batch_put_tensor_with_parallelism(self, keys: list[str], tensors_list: list[Any], parallelisms: Any = None,
                                          config: Any = None, writer_partitions: Any = None) -> list[int]:
        """Batch ``put_tensor_with_parallelism``; one code per key."""
        return self._parallel.batch_put_tensor_with_parallelism(keys, tensors_list, parallelisms, config,
                                                                writer_partitions)

    def batch_upsert_tensor_with_parallelism(self, keys: list[str], tensors_list: list[Any],
                                             parallelisms: Any = None, config: Any = None,
                                             writer_partitions: Any = None) -> list[int]:
        return self._parallel.batch_upsert_tensor_with_parallelism(keys, tensors_list, parallelisms, config,
                                                                   writer_partitions)

    def batch_put_tensor_with_parallelism_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                               parallelisms: Any = None, config: Any = None,
                                               writer_partitions: Any = None) -> list[int]:
        """Batch ``put_tensor_with_parallelism_from``; a buffer that is not a tensor gets -600."""
        return self._parallel.batch_put_tensor_with_parallelism_from(keys, buffer_ptrs, sizes, parallelisms, config,
                                                                     writer_partitions)

    def batch_upsert_tensor_with_parallelism_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                                  parallelisms: Any = None, config: Any = None,
                                                  writer_partitions: Any = None) -> list[int]:
        return self._parallel.batch_upsert_tensor_with_parallelism_from(keys, buffer_ptrs, sizes, parallelisms,
                                                                        config, writer_partitions)

    def get_tensor_with_parallelism(self, key: str, target: Any = None) -> Any:
        """The tensor ``target`` asks for (see module doc), or None."""
        return self._parallel.get_tensor_with_parallelism(key, target)

    def get_tensor_with_parallelism_into(self, key: str, buffer_ptr: int, size: int, target: Any = None) -> Any:
        """``get_tensor_with_parallelism`` into a buffer (serialized layout, as
        ``get_tensor_into``); the returned tensor aliases the buffer. A stored object is read
        straight in; an assembled one (full / sliced) is copied in once."""
        return self._parallel.get_tensor_with_parallelism_into(key, buffer_ptr, size, target)

    def batch_get_tensor_with_parallelism(self, keys: list[str], targets: Any = None) -> list[Any]:
        """One tensor/None per key (``targets``: one ReadTarget/None per key, or None)."""
        return self._parallel.batch_get_tensor_with_parallelism(keys, targets)

    def batch_get_tensor_with_parallelism_into(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                               targets: Any = None) -> list[Any]:
        return self._parallel.batch_get_tensor_with_parallelism_into(keys, buffer_ptrs, sizes, targets)

    # ================================================================== ranges: byte ranges, sessions, replica clearing
    def get_into_ranges(self, buffer_ptrs: list[int], all_keys: list[list[str]],
                        all_dst_offsets: list[list[list[int]]], all_src_offsets: list[list[list[int]]],
                        all_sizes: list[list[list[int]]]) -> list[list[list[int]]]:
        """Read byte ranges of many objects into registered buffers (buffer-major).

        ``results[i][j][k]`` = bytes read for fragment k of key ``all_keys[i][j]`` into
        ``buffer_ptrs[i] + all_dst_offsets[i][j][k]`` from object offset
        ``all_src_offsets[i][j][k]``, or a negative code: -600 (bad shape, unregistered or
        overflowing destination, source range past the object), -704 missing, -707 lease
        expired, -800 transfer failure. Fragments succeed or fail independently."""
        return self._ranges.get_into_ranges(buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes)

    def batch_get_into_multi_buffer_ranges(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                           all_sizes: list[list[int]],
                                           all_src_offsets: list[list[int]]) -> list[int]:
        """Object ``keys[i]``'s range ``[all_src_offsets[i][k], +all_sizes[i][k])`` into
        buffer ``all_buffer_ptrs[i][k]``. Per key: total bytes read, or the first negative
        code among its ranges. Uses the replica lists cached by ``batch_get_session_start``
        when present (upstream requires a session; here one is optional -- without it the
        replicas are looked up in the same call)."""
        return self._ranges.batch_get_into_multi_buffer_ranges(keys, all_buffer_ptrs, all_sizes, all_src_offsets)

    def batch_get_session_start(self, keys: list[str]) -> list[int]:
        """Look the replicas of ``keys`` up once (one master round trip) and cache them for
        the ranged reads that follow. Per key: 0, or -704 missing / another negative code."""
        return self._ranges.batch_get_session_start(keys)

    def batch_get_session_end(self, keys: list[str]) -> int:
        """Forget the cached replica lists of ``keys``. Always 0 (as upstream)."""
        return self._ranges.batch_get_session_end(keys)

    def batch_put_session_start(self, keys: list[str], sizes: list[int], config: Any = None) -> list[int]:
        """Reserve objects of ``sizes`` bytes without writing them (put_start only); fill
        them with ``batch_put_from_multi_buffer_ranges`` and publish with
        ``batch_put_session_end``. Per key: 0, -705 already exists, -600 bad arguments,
        -200 no space. Objects stay invisible to readers until the session ends. Writes must
        happen within ``MC_STORE_PUT_SESSION_MAX_S`` (25 s)."""
        return self._ranges.batch_put_session_start(keys, sizes, config)

    def batch_put_from_multi_buffer_ranges(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                           all_sizes: list[list[int]],
                                           all_dst_offsets: list[list[int]]) -> list[int]:
        """Write buffer ``all_buffer_ptrs[i][k]`` (``all_sizes[i][k]`` bytes) at offset
        ``all_dst_offsets[i][k]`` of the object reserved by ``batch_put_session_start``.
        Per key: bytes written, or -600 (no open session, range past the object),
        -800 transfer failure."""
        return self._ranges.batch_put_from_multi_buffer_ranges(keys, all_buffer_ptrs, all_sizes, all_dst_offsets)

    def batch_put_session_end(self, keys: list[str]) -> list[int]:
        """Publish the objects of open put sessions (put_end). Per key: 0, or -600 (no open
        session, or not every byte written yet -- the session then stays open), or the
        master's code."""
        return self._ranges.batch_put_session_end(keys)

    def batch_put_session_revoke(self, keys: list[str]) -> list[int]:
        """Abandon open put sessions (put_revoke frees the reserved space). Per key: 0 or -600."""
        return self._ranges.batch_put_session_revoke(keys)

    def batch_replica_clear(self, keys: list[str], segment_name: str = '') -> list[str]:
        """Drop the replicas on ``segment_name`` (every replica when "") of those ``keys``
        whose read leases have expired; an object left without a replica is removed.
        Returns the keys cleared (leased, missing, or with no replica there: skipped, as
        the original)."""
        return self._pool.batch_replica_clear(keys, segment_name)

    def put_from_with_metadata(self, key: str, buffer_ptr: int, metadata_buffer_ptr: int, size: int,
                               metadata_size: int, config: Any = None) -> int:
        """Store ``metadata`` followed by ``data`` as one object of ``metadata_size + size``
        bytes, both written straight from their buffers (no join). 0 or negative."""
        return self._ranges.put_from_with_metadata(key, buffer_ptr, metadata_buffer_ptr, size, metadata_size,
                                                   config)

    # ================================================================== pool management: tasks, memory
    def create_copy_task(self, key: str, targets: list[str]) -> tuple[tuple[int, int], int]:
        """Copy ``key`` onto the segments ``targets`` (those holding it already are skipped).
        Returns ``(task_id, 0)``, or ``((0, 0), code)``: -704 missing key, -600 unknown
        segment. The client holding the source replica carries it out; see ``query_task``."""
        return self._pool.create_copy_task(key, targets)

    def create_move_task(self, key: str, source: str, target: str) -> tuple[tuple[int, int], int]:
        """Move ``key``'s replica on segment ``source`` to ``target``: ``(task_id, 0)`` or
        ``((0, 0), code)`` (-704 missing key or no replica on ``source``, -600 unknown
        segment or ``source == target``). Concurrent moves of one key run one at a time."""
        return self._pool.create_move_task(key, source, target)

    def query_task(self, task_id: tuple[int, int]) -> tuple[QueryTaskResponse | None, int]:
        """``(QueryTaskResponse, 0)``, or ``(None, -600)`` for a task id the master does not know."""
        return self._pool.query_task(task_id)

    def mount_segment(self, path: str, size: int, offset: int = 0, protocol: str = "tcp",
                      location: str = "") -> dict[str, Any]:
        """Give the pool ``size`` bytes of the file ``path`` from ``offset`` (page-aligned),
        mapped shared: ``{"ret": 0, "segment_ids": [id]}``, or ret -1 (logged: no such file,
        range past its end, unaligned offset)."""
        return self._pool.mount_segment(path, size, offset, protocol, location)

    def allocate_and_mount_segment(self, size: int, protocol: str = "tcp", location: str = "") -> dict[str, Any]:
        """Give the pool ``size`` more bytes of this client's memory (rounded up to 4 MiB):
        ``{"ret": 0, "segment_ids": [id], "allocated_size": n}``, or ret -1."""
        return self._pool.allocate_and_mount_segment(size, protocol, location)

    def unmount_segment(self, segment_ids: list[str], grace_period_seconds: int = 0) -> int:
        """Take segments of ``mount_segment`` out of the pool. With a grace period they are
        drained first (objects moved, or left on their other replicas) and go when that is
        done or the period is over; at once otherwise (their replicas are dropped). 0, or -1
        for an id not mounted with ``mount_segment`` (the first error)."""
        return self._pool.unmount_segment(segment_ids, grace_period_seconds)

    def unmount_and_free_segment(self, segment_ids: list[str], grace_period_seconds: int = 0) -> int:
        """``unmount_segment`` for segments of ``allocate_and_mount_segment`` (their memory is freed)."""
        return self._pool.unmount_and_free_segment(segment_ids, grace_period_seconds)

    def unmount_local_disk_segment(self, grace_period_seconds: int = 0) -> int:
        """The original drains a client's own SSD segment here. 0: this store has none -- its
        SSD tier is shared by every client (``root_fs_dir``) and stays."""
        if isinstance(grace_period_seconds, bool) or not isinstance(grace_period_seconds, int) \
                or grace_period_seconds < 0:
            raise TypeError("unmount_local_disk_segment: grace_period_seconds must be an int >= 0")
        log.warning("unmount_local_disk_segment: no client-local disk segment here (the SSD tier is shared "
                    "under the master's root_fs_dir); nothing to drain")
        return OK

    def get_offload_rpc_read_count(self) -> int:
        """Reads of SSD-tier objects served through another client's RPC. Always 0 here:
        every client reads the shared tier's files (``root_fs_dir``) itself."""
        return 0

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int = 16 * 1024 * 1024) -> int:
        """The original's one-call setup: ``setup`` with its defaults (local hostname
        "localhost", a 1 GiB local buffer) and the metadata server / master from the
        environment (``MOONCAKE_TE_META_DATA_SERVER``, ``MOONCAKE_MASTER``), contributing
        ``mount_segment_size`` bytes. 0, or setup's code (-600 when already set up)."""
        if self._core.ready:
            log.error("init_all: this store is already set up")
            return INVALID
        cfg = StoreConfig.load_from_env() if _env_configured() else None
        meta = cfg.metadata_server if cfg is not None else "P2PHANDSHAKE"
        master = cfg.master_server_addr if cfg is not None else "127.0.0.1:50051"
        return self.setup("localhost", meta, mount_segment_size, 1024 * 1024 * 1024, protocol, device_name, master)

    # ================================================================== tensors: files, CUDA destinations
    def save_tensor_to_safetensor(self, key: str, file_name: str | None = None) -> int:
        """Write the tensor stored under ``key`` to a safetensors file (``file_name``, default
        ``key``). 0, -704 when no tensor is stored there, -600 when the file cannot be written."""
        return self._tensor_io.save_tensor_to_safetensor(key, file_name)

    def load_tensor_from_safetensor(self, key: str | None = None, file_name: str | None = None) -> Any:
        """Store the tensor of a safetensors file under ``key`` (default: the file name) and
        return it; None when the file cannot be read or the put fails."""
        return self._tensor_io.load_tensor_from_safetensor(key, file_name)

    def get_tensor_into_cuda(self, key: str, tensor: Any) -> int:
        """Read the stored tensor ``key`` into the preallocated CUDA ``tensor`` (same dtype and
        element count): bytes written, or negative (-704 missing, -600 mismatch or a
        destination that is not on a GPU)."""
        return self._tensor_io.get_tensor_into_cuda(key, tensor)

    def batch_get_tensor_into_cuda(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        """``get_tensor_into_cuda`` per key."""
        return self._tensor_io.batch_get_tensor_into_cuda(keys, tensors_list)


#: the methods a dummy client forwards to mooncake_client (or answers itself): every public
#: method but its own lifecycle
_FORWARDED = tuple(n for n in vars(MooncakeDistributedStore)
                   if not n.startswith("_") and callable(vars(MooncakeDistributedStore)[n])
                   and n not in ("setup", "setup_dummy", "close"))


def _env_configured() -> bool:
    from mooncake_core import envs

    return bool(envs.MOONCAKE_CONFIG_PATH or envs.MOONCAKE_MASTER)
