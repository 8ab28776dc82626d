"""``MooncakeCoreConnector``: LMCache's remote connector on the Mooncake Store, natively.

Targets LMCache 0.5.6 (``lmcache.v1.storage_backend.connector.base_connector.RemoteConnector``).
What it does differently from LMCache's built-in ``mooncakestore://`` adapter, and why:

* every data call is batched and zero-copy from LMCache's own memory objects, in both of
  LMCache's modes: with ``save_chunk_meta`` (the default) one object = LMCache's metadata
  header + the KV bytes, written with ``batch_put_from_multi_buffers`` and read with
  ``batch_get_into_multi_buffers`` (the built-in copies through ``put_parts`` /
  ``batch_get_buffer``); without it, ``batch_put_from`` / ``batch_get_into``. The stored
  objects are byte-identical to the built-in's, so switching adapters keeps the cache;
* existence is one ``batch_is_exist`` per lookup (the built-in asks key by key);
* a put is never abandoned while it still reads LMCache's memory (the built-in stops waiting
  after ``transfer_timeout`` and LMCache may then reuse the buffer under the running copy);
* ``get`` works (LMCache's recovery check after a failure uses it), ``ping`` is the store's
  ``health_check`` (0 healthy, 1 not set up, 2 master unreachable);
* a construction failure is logged as an error naming the key to fix, then raised (LMCache
  swallows the exception, keeps the backend empty and retries from its health monitor).

Writes are never done twice: the store refuses a second put of a key (already stored or in
flight) before any byte moves, so also the double backend LMCache builds when ``remote_url``
and this plugin are both configured costs one master round trip, not a second copy; the
connector still logs that configuration as an error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np
from lmcache.logging import init_logger
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from mooncake_connectors.lmcache.settings import (
    NOT_FOUND,
    ConfigError,
    code_name,
    settings_from,
)
from mooncake_connectors.lmcache.store_open import open_store
from mooncake_core.pd.keys import leading_hits  # pure: 1 = present, anything else ends the run
from mooncake_core.store import MooncakeDistributedStore, ReplicateConfig

__all__ = ["MooncakeCoreConnector"]

logger = init_logger(__name__)

class MooncakeCoreConnector(RemoteConnector):
    """LMCache remote connector backed by ``mooncake_core.store.MooncakeDistributedStore``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend: Any, config: Any,
                 metadata: Any, plugin_name: Optional[str] = None):
        super().__init__(config, metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.plugin_name = plugin_name or "mooncake_core"
        self._registered_ptr: int | None = None
        self.store: MooncakeDistributedStore | None = None
        where = f"LMCache remote_storage_plugins[{self.plugin_name!r}] (MooncakeCoreConnector)"
        try:
            self.settings = settings_from(config.extra_config,
                                          blocking_timeout_secs=getattr(config, "blocking_timeout_secs", 10))
        except ConfigError as e:
            logger.error("%s: bad configuration: %s", where, e)
            raise
        if getattr(config, "remote_url", None):
            logger.error("%s: remote_url=%r is set as well: LMCache then runs a second remote backend "
                         "next to this one (every chunk is looked up and offered twice; the store "
                         "writes it once). Remove remote_url from the LMCache config.",
                         where, config.remote_url)
        store = open_store(self.settings, where, logger)
        self.store = store
        try:
            self.replica_config = ReplicateConfig()
            self.replica_config.replica_num = 1
            if self.settings.prefer_local_alloc:
                self.replica_config.preferred_segment = store.get_hostname()
            self._register_cpu_buffer()
        except BaseException:
            store.close()  # LMCache drops this object: do not leave a mounted segment behind
            raise
        logger.info("MooncakeCoreConnector ready: master %s, segment %s, chunk metadata %s",
                    self.settings.setup.get("master_server_address"), store.get_hostname(),
                    "stored with each chunk" if self.save_chunk_meta else "local (zero-copy layout)")

    # ------------------------------------------------------------------ helpers
    def _register_cpu_buffer(self) -> None:
        """Register LMCache's CPU arena with the store's engine once (as the built-in does)."""
        allocator = getattr(self.local_cpu_backend, "memory_allocator", None)
        buf = getattr(getattr(allocator, "pin_allocator", None), "buffer", None)
        if buf is None:
            return  # scheduler role / no arena: nothing to read into
        rc = self.store.register_buffer(int(buf.data_ptr()), int(buf.numel() * buf.element_size()))
        if rc == 0:
            self._registered_ptr = int(buf.data_ptr())
        else:
            logger.warning("register_buffer of LMCache's %d-byte CPU buffer failed (%d); transfers "
                           "still work, without the registration", buf.numel() * buf.element_size(), rc)

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a blocking store call off the event loop, *to its end*: a put still reading
        LMCache's memory objects must not be abandoned (the caller frees them on return)."""
        fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            await asyncio.wait({fut})
            raise

    def _allocate(self, n: int) -> list[Optional[MemoryObj]]:
        objs = None
        if n > 1 and hasattr(self.local_cpu_backend, "batched_allocate"):
            objs = self.local_cpu_backend.batched_allocate(self.meta_shapes, self.meta_dtypes, n, self.meta_fmt)
        if objs is None:
            objs = [self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
                    for _ in range(n)]
        return list(objs)

    def _finish(self, key: str, obj: MemoryObj, nbytes: int) -> Optional[MemoryObj]:
        """A read of ``nbytes`` KV bytes into ``obj``: the object (shortened for a partial
        chunk), or None (released) when the size cannot be a chunk of this model."""
        try:
            return obj if nbytes == self.full_chunk_size_bytes else self.reshape_partial_chunk(obj, nbytes)
        except ValueError as e:
            logger.warning("%s: stored object does not fit this model's chunk layout: %s", key, e)
            obj.ref_count_down()
            return None

    def _check_header(self, key: str, hdr: bytes, nbytes: int) -> bool:
        md = RemoteMetadata.deserialize(hdr)
        if md.length != nbytes or md.dtypes != list(self.meta_dtypes) or md.fmt != self.meta_fmt:
            logger.warning("%s: stored chunk metadata (length %d, dtypes %s, fmt %s) does not match "
                           "%d bytes of %s/%s; treating it as a miss", key, md.length, md.dtypes, md.fmt,
                           nbytes, self.meta_dtypes, self.meta_fmt)
            return False
        return True

    # ------------------------------------------------------------------ blocking cores
    def _contains(self, keys: list[str]) -> int:
        return leading_hits(self.store.batch_is_exist(keys)) if keys else 0

    def _get_many(self, keys: list[CacheEngineKey]) -> list[Optional[MemoryObj]]:
        n = len(keys)
        objs = self._allocate(n)
        idx = [i for i, o in enumerate(objs) if o is not None and o.raw_tensor is not None]
        if len(idx) < n:
            logger.warning("batched_get: LMCache's CPU buffer had room for %d of %d chunks", len(idx), n)
        out: list[Optional[MemoryObj]] = [None] * n
        if not idx:
            return out
        names = [keys[i].to_string() for i in idx]
        full = self.full_chunk_size_bytes
        try:
            if self.save_chunk_meta:
                h = self.remote_metadata_bytes
                hdrs = np.empty((len(idx), h), dtype=np.uint8)
                base = int(hdrs.ctypes.data)
                got = self.store.batch_get_into_multi_buffers(
                    names, [[base + j * h, objs[i].data_ptr] for j, i in enumerate(idx)],
                    [[h, full]] * len(idx))
            else:
                got = self.store.batch_get_into(names, [objs[i].data_ptr for i in idx], [full] * len(idx))
        except Exception:
            for i in idx:
                objs[i].ref_count_down()
            raise
        failed: list[tuple[str, int]] = []
        for j, (i, rc) in enumerate(zip(idx, got)):
            obj = objs[i]
            nbytes = rc - self.remote_metadata_bytes if self.save_chunk_meta else rc
            if rc <= 0 or nbytes <= 0 or (self.save_chunk_meta and not self._check_header(
                    names[j], hdrs[j].tobytes(), nbytes)):
                obj.ref_count_down()
                if rc < 0 and rc != NOT_FOUND:
                    failed.append((names[j], rc))
                continue
            out[i] = self._finish(names[j], obj, nbytes)
        if failed:  # a plain miss (-704) is not worth a line; anything else is
            logger.warning("read of %d chunk(s): %d failed (first %s: %s)", len(names), len(failed),
                           failed[0][0], code_name(failed[0][1]))
        return out

    def _put_many(self, keys: Sequence[CacheEngineKey], objs: Sequence[MemoryObj]) -> list[int]:
        seen: set[str] = set()
        names, items = [], []
        for k, o in zip(keys, objs):
            s = k.to_string()
            if s not in seen:  # the store rejects a batch naming a key twice
                seen.add(s)
                names.append(s)
                items.append(o)
        if not names:
            return []
        t0 = time.monotonic()
        if self.save_chunk_meta:
            h = self.remote_metadata_bytes
            hdrs = np.zeros((len(items), h), dtype=np.uint8)
            for j, o in enumerate(items):
                RemoteMetadata(o.get_size(), o.get_shapes(), o.get_dtypes(),
                               o.get_memory_format()).serialize_into(memoryview(hdrs[j]))
            base = int(hdrs.ctypes.data)
            rcs = self.store.batch_put_from_multi_buffers(
                names, [[base + j * h, o.data_ptr] for j, o in enumerate(items)],
                [[h, o.get_size()] for o in items], self.replica_config)
        else:
            rcs = self.store.batch_put_from(names, [o.data_ptr for o in items], [o.get_size() for o in items],
                                            self.replica_config)
        failed = [(k, rc) for k, rc in zip(names, rcs) if rc < 0]
        if failed:
            logger.warning("put of %d chunk(s): %d failed (first %s: %s)", len(names), len(failed),
                           failed[0][0], code_name(failed[0][1]))
        dt = time.monotonic() - t0
        if dt > self.settings.transfer_timeout:
            logger.warning("put of %d chunk(s) took %.1f s (transfer_timeout %.1f s)", len(names), dt,
                           self.settings.transfer_timeout)
        return rcs

    # ------------------------------------------------------------------ RemoteConnector API
    async def exists(self, key: CacheEngineKey) -> bool:
        return await self._run(self.exists_sync, key)

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self.store.is_exist(key.to_string()) == 1

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list[CacheEngineKey]) -> int:
        return self._contains([k.to_string() for k in keys])

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey], pin: bool = False) -> int:
        return await self._run(self._contains, [k.to_string() for k in keys])

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: list[CacheEngineKey]) -> list[Optional[MemoryObj]]:
        if not keys:
            return []
        return await self._run(self._get_many, list(keys))

    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return (await self.batched_get([key]))[0]

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: list[CacheEngineKey]) -> list[MemoryObj]:
        """The leading run of hits, in one batched read (later hits are released)."""
        out: list[MemoryObj] = []
        broken = False
        for o in await self.batched_get(keys):
            broken = broken or o is None
            if not broken:
                out.append(o)
            elif o is not None:
                o.ref_count_down()
        return out

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: list[CacheEngineKey], memory_objs: list[MemoryObj]) -> None:
        if keys:
            await self._run(self._put_many, keys, memory_objs)

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        await self._run(self._put_many, [key], [memory_obj])

    def remove_sync(self, key: CacheEngineKey) -> bool:
        return self.store.remove(key.to_string()) == 0

    async def list(self) -> list[str]:
        """Not offered: the store has no key listing (LMCache's built-in returns nothing either)."""
        return []

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        """The store's ``health_check``: 0 healthy, 1 not set up / closed, 2 master unreachable."""
        store = self.store
        return 1 if store is None else int(await self._run(store.health_check))

    async def close(self) -> None:
        store, self.store = self.store, None
        if store is None:
            return
        if self._registered_ptr is not None:
            store.unregister_buffer(self._registered_ptr)
            self._registered_ptr = None
        await self._run(store.close)
        logger.info("MooncakeCoreConnector closed")

    def __repr__(self) -> str:
        return f"<MooncakeCoreConnector plugin={self.plugin_name!r}>"
