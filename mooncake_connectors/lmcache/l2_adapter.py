"""``MooncakeStoreL2Adapter``: the Mooncake Store as the L2 tier of LMCache's multiprocess mode.

Targets LMCache 0.5.6 (``lmcache.v1.distributed.l2_adapters.base.L2AdapterInterface``), loaded
through LMCache's ``plugin`` L2 adapter type::

    python -m lmcache.v1.multiprocess.server ... --l2-adapter '{"type": "plugin",
        "module_path": "mooncake_connectors.lmcache.l2_adapter",
        "class_name": "MooncakeStoreL2Adapter",
        "adapter_params": {"master_server_address": "10.0.0.9:50051",
                           "metadata_server": "http://10.0.0.9:8080/metadata",
                           "local_hostname": "10.0.0.1", "global_segment_size": "0"}}'

Why a plugin of ours: LMCache's built-in ``mooncake_store`` L2 adapter needs its C++ extension
(``lmcache.lmcache_mooncake``) built against the original's C++ ``RealClient``; the ``plugin``
type takes any Python class implementing the interface.

Objects are the ones that built-in writes: the key is LMCache's native-connector key string
(``model@rank@group@hash[@salt]``) and the value the memory object's raw bytes, written with
``batch_put_from`` and read with ``batch_get_into`` straight from / into LMCache's L1 buffers.

The interface is non-blocking: each ``submit_*`` runs its one batched store call on a small
thread pool (``num_workers``) and signals the operation's event fd when the result is ready.
"Lock" is a client-side count, as in LMCache's native-connector adapter: the store has no lock
a client may hold, but every read is checked against the object's lease, so an object evicted
between lookup and load is a miss (bit 0), never wrong bytes. Capacity is the store's business
(it evicts on its own), so the adapter declares none and LMCache runs no global L2 eviction.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

from lmcache.lmcache_native import Bitmap
from lmcache.logging import init_logger
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface, L2TaskId
from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase
from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import _object_key_to_string
from lmcache.v1.platform import create_event_notifier

from mooncake_connectors.lmcache.settings import (
    ALREADY_EXISTS,
    NOT_FOUND,
    ConfigError,
    L2Settings,
    code_name,
    l2_settings_from,
)
from mooncake_connectors.lmcache.store_open import open_store
from mooncake_core.store import ReplicateConfig

if TYPE_CHECKING:
    from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
    from lmcache.v1.distributed.internal_api import L1MemoryDesc
    from lmcache.v1.memory_management import MemoryObj

__all__ = ["MooncakeStoreL2Adapter", "MooncakeStoreL2AdapterConfig"]

logger = init_logger(__name__)
WHERE = "LMCache --l2-adapter plugin (MooncakeStoreL2Adapter)"


class MooncakeStoreL2AdapterConfig(L2AdapterConfigBase):
    """``adapter_params`` of the plugin spec, validated (LMCache finds this class by the
    ``<class_name>Config`` convention and builds it with ``from_dict``)."""

    def __init__(self, settings: L2Settings):
        self.settings = settings

    @classmethod
    def from_dict(cls, d: dict) -> MooncakeStoreL2AdapterConfig:
        try:
            return cls(l2_settings_from(d))
        except ConfigError as e:
            logger.error("%s: bad configuration: %s", WHERE, e)
            raise

    @classmethod
    def help(cls) -> str:
        return ("Mooncake Store L2 adapter (adapter_params): master_server_address (required), "
                "metadata_server, local_hostname, global_segment_size (memory this server lends "
                "to the pool; 0 keeps objects on the store's other members only), "
                "local_buffer_size, protocol, device_name, mooncake_<store setup key>, "
                "num_workers (threads for store calls, default 2). See docs/lmcache.md.")


class MooncakeStoreL2Adapter(L2AdapterInterface):
    """LMCache L2 adapter on ``mooncake_core.store.MooncakeDistributedStore``."""

    def __init__(self, config: MooncakeStoreL2AdapterConfig | dict[str, Any],
                 l1_memory_desc: L1MemoryDesc | None = None):
        super().__init__(max_capacity_bytes=0)
        if not isinstance(config, MooncakeStoreL2AdapterConfig):
            config = MooncakeStoreL2AdapterConfig.from_dict(dict(config))
        self.settings = config.settings.store
        store = open_store(self.settings, WHERE, logger)
        self._store = store
        self._closed = False
        self._replica = ReplicateConfig()
        self._replica.replica_num = 1
        self._registered_ptr = 0
        if l1_memory_desc is not None and l1_memory_desc.ptr and l1_memory_desc.size > 0:
            if store.register_buffer(int(l1_memory_desc.ptr), int(l1_memory_desc.size)) == 0:
                self._registered_ptr = int(l1_memory_desc.ptr)
        self._store_efd = create_event_notifier()
        self._lookup_efd = create_event_notifier()
        self._load_efd = create_event_notifier()
        self._lock = threading.Lock()
        self._next_task: L2TaskId = 0
        self._stores: dict[L2TaskId, L2StoreResult] = {}
        self._lookups: dict[L2TaskId, Bitmap] = {}
        self._loads: dict[L2TaskId, Bitmap] = {}
        self._locked: dict[ObjectKey, int] = defaultdict(int)
        self._sizes: dict[ObjectKey, int] = {}  # bytes of the keys this adapter stored (usage accounting)
        self._pool = ThreadPoolExecutor(config.settings.num_workers, thread_name_prefix="mooncake-l2")
        logger.info("MooncakeStoreL2Adapter ready: master %s, segment %s, %d worker(s)",
                    self.settings.setup.get("master_server_address"), store.get_hostname(),
                    config.settings.num_workers)

    # ------------------------------------------------------------------ event fds
    def get_store_event_fd(self) -> int:
        return self._store_efd.fileno()

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._lookup_efd.fileno()

    def get_load_event_fd(self) -> int:
        return self._load_efd.fileno()

    # ------------------------------------------------------------------ plumbing
    def _submit(self, work: Callable[[L2TaskId], None]) -> L2TaskId:
        with self._lock:
            task = self._next_task
            self._next_task += 1
        self._pool.submit(work, task)
        return task

    # ------------------------------------------------------------------ store
    def submit_store_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        return self._submit(lambda task: self._store_task(task, list(keys), list(objects)))

    def _store_task(self, task: L2TaskId, keys: list[ObjectKey], objects: list[MemoryObj]) -> None:
        stored: list[ObjectKey] = []
        sizes: list[int] = []
        ok = True
        try:
            names, ptrs, lens, fresh = [], [], [], []
            seen: set[str] = set()
            for k, o in zip(keys, objects, strict=True):
                name = _object_key_to_string(k)
                if name not in seen:  # the store rejects a batch naming a key twice
                    seen.add(name)
                    names.append(name)
                    ptrs.append(int(o.data_ptr))
                    lens.append(int(o.get_size()))
                    fresh.append(k)
            rcs = self._store.batch_put_from(names, ptrs, lens, self._replica) if names else []
            failed = [(n, rc) for n, rc in zip(names, rcs) if rc < 0 and rc != ALREADY_EXISTS]
            if failed:
                ok = False
                logger.warning("L2 store of %d chunk(s): %d failed (first %s: %s)", len(names), len(failed),
                               failed[0][0], code_name(failed[0][1]))
            with self._lock:
                for k, n, rc in zip(fresh, lens, rcs):
                    if rc == 0 and k not in self._sizes:
                        self._sizes[k] = n
                        stored.append(k)
                        sizes.append(n)
        except Exception:
            ok = False
            logger.exception("L2 store of %d chunk(s) failed", len(keys))
        with self._lock:
            self._stores[task] = L2StoreResult(ok, sum(sizes))
        if stored:
            self._notify_keys_stored(stored, sizes)
        self._store_efd.notify()

    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        with self._lock:
            done, self._stores = self._stores, {}
        return done

    # ------------------------------------------------------------------ lookup and lock
    def submit_lookup_and_lock_task(self, keys: list[ObjectKey],
                                    group_layout_descs: dict[int, MemoryLayoutDesc]) -> L2TaskId:
        return self._submit(lambda task: self._lookup_task(task, list(keys)))

    def _lookup_task(self, task: L2TaskId, keys: list[ObjectKey]) -> None:
        bits = Bitmap(len(keys))
        try:
            found = self._store.batch_is_exist([_object_key_to_string(k) for k in keys]) if keys else []
        except Exception:
            logger.exception("L2 lookup of %d chunk(s) failed", len(keys))
            found = []
        with self._lock:
            for i, f in enumerate(found):
                if f == 1:  # -1 (master unreachable) is a miss
                    bits.set(i)
                    self._locked[keys[i]] += 1
            self._lookups[task] = bits
        self._lookup_efd.notify()

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._lookups.pop(task_id, None)

    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        with self._lock:
            for k in keys:
                n = self._locked.get(k, 0)
                if n <= 1:
                    self._locked.pop(k, None)
                else:
                    self._locked[k] = n - 1

    # ------------------------------------------------------------------ load
    def submit_load_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        return self._submit(lambda task: self._load_task(task, list(keys), list(objects)))

    def _load_task(self, task: L2TaskId, keys: list[ObjectKey], objects: list[MemoryObj]) -> None:
        bits = Bitmap(len(keys))
        loaded: list[ObjectKey] = []
        try:
            names = [_object_key_to_string(k) for k in keys]
            lens = [int(o.get_size()) for o in objects]
            got = self._store.batch_get_into(names, [int(o.data_ptr) for o in objects], lens) if keys else []
            odd = []
            for i, (rc, n) in enumerate(zip(got, lens)):
                if rc == n:
                    bits.set(i)
                    loaded.append(keys[i])
                elif rc != NOT_FOUND:
                    odd.append((names[i], rc, n))
            if odd:  # a plain miss (-704) is not worth a line; a size mismatch or an error is
                logger.warning("L2 load of %d chunk(s): %d not loaded (first %s: got %s for a %d-byte buffer)",
                               len(names), len(odd), odd[0][0],
                               code_name(odd[0][1]) if odd[0][1] < 0 else f"{odd[0][1]} bytes", odd[0][2])
        except Exception:
            logger.exception("L2 load of %d chunk(s) failed", len(keys))
        with self._lock:
            self._loads[task] = bits
        if loaded:
            self._notify_keys_accessed(loaded)
        self._load_efd.notify()

    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._loads.pop(task_id, None)

    # ------------------------------------------------------------------ eviction / status
    def delete(self, keys: list[ObjectKey]) -> None:
        """Remove objects from the store (LMCache's ``/cache/clear`` and L2 eviction call this)."""
        if not keys:
            return
        rcs = self._store.batch_remove([_object_key_to_string(k) for k in keys])
        gone: list[ObjectKey] = []
        sizes: list[int] = []
        with self._lock:
            for k, rc in zip(keys, rcs):
                if rc == 0 and k in self._sizes:
                    gone.append(k)
                    sizes.append(self._sizes.pop(k))
        if gone:
            self._notify_keys_deleted(gone, sizes)

    def report_status(self) -> dict[str, Any]:
        health = 1 if self._closed else self._store.health_check()
        return {"is_healthy": health == 0, "type": type(self).__name__,
                "master_server_address": self.settings.setup.get("master_server_address"),
                "store_health": health}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)  # every store call is bounded by the store's RPC/transfer timeouts
        if self._registered_ptr:
            self._store.unregister_buffer(self._registered_ptr)
        self._store.close()
        for efd in (self._store_efd, self._lookup_efd, self._load_efd):
            efd.close()
        logger.info("MooncakeStoreL2Adapter closed")
