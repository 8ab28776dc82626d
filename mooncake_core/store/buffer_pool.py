"""``BufferPool`` / ``RegisteredBufferPool``: registered memory handed out as leases (the
original's ``mooncake.buffer_pool``, same constructor, methods and errors).

Why: zero-copy calls (``put_from``, ``get_into``, ``batch_*_into``) need memory registered
with the store; registering per call costs a Transfer Engine round of work, so a program
keeps buffers registered and leases them out. The pool owns one registered arena of the
store's ``local_buffer_size`` bytes (carved with the best-fit ``RangeAllocator``); when that
is full a lease gets its own "overflow" buffer, registered on acquire and unregistered on
release, until ``max_bytes`` (default twice the local buffer) are leased. Past that,
``acquire`` waits (or raises with ``block=False`` / after ``timeout``), as the original does.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from typing import Any

import numpy as np

from mooncake_core.utils.range_allocator import RangeAllocator

__all__ = ["BufferLease", "BufferPool", "RegisteredBufferLease", "RegisteredBufferPool"]


def _aligned(size: int, alignment: int) -> tuple[np.ndarray, int]:
    """A numpy byte array holding ``size`` bytes at an ``alignment``-aligned address."""
    raw = np.empty(size + alignment, np.uint8)
    off = (-int(raw.ctypes.data)) % alignment
    return raw, int(raw.ctypes.data) + off


class BufferLease:
    """``size`` bytes of registered memory at ``ptr``; ``buffer`` is a writable memoryview.
    ``release()`` (or leaving a ``with`` block) gives them back to the pool."""

    def __init__(self, pool: BufferPool, ptr: int, size: int, region: int) -> None:
        self._pool: BufferPool | None = pool
        self._ptr, self._size, self._region = ptr, size, region
        # every view handed out references this exporter, and the exporter the lease: a live
        # view keeps the lease (so its memory) alive, and release() can see that views exist
        self._exporter: Any = (ctypes.c_ubyte * size).from_address(ptr)
        setattr(self._exporter, "lease", self)  # noqa: B010 - ctypes instances take attributes

    @property
    def ptr(self) -> int:
        if self._pool is None:
            raise RuntimeError("buffer lease is closed")
        return self._ptr

    @property
    def size(self) -> int:
        return self._size

    @property
    def buffer(self) -> memoryview:
        if self._pool is None:
            raise RuntimeError("buffer lease is closed")
        return memoryview(self._exporter).cast("B")

    def release(self) -> None:
        if self._pool is not None and sys.getrefcount(self._exporter) > 2:  # ours + the call's argument
            raise RuntimeError("cannot release buffer while exported views exist")
        self._drop()

    def _drop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            setattr(self._exporter, "lease", None)  # noqa: B010
            pool._give_back(self._region)  # noqa: SLF001 - the lease and its pool are one unit

    def __enter__(self) -> BufferLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:  # a lease dropped without release() still returns its memory
        try:
            self._drop()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class BufferPool:
    """Leases of registered memory for zero-copy store calls (see the module docstring)."""

    def __init__(self, store: Any, max_bytes: int = 0, min_size_class: int = 64 * 1024,
                 max_size_class: int | None = None, alignment: int = 8 * 1024 * 1024,
                 block_on_exhaustion: bool = True, default_timeout: float | None = None,
                 max_regions: int | None = None, prewarm_size: int | None = None, prewarm_count: int = 0) -> None:
        if store is None or not getattr(store, "local_buffer_size", 0):
            raise RuntimeError("BufferPool requires a store configured with a local buffer "
                               "(setup(..., local_buffer_size > 0, ...))")
        if min_size_class <= 0 or alignment <= 0:
            raise RuntimeError("min_size_class and alignment must be positive")
        if alignment < 8 or alignment & (alignment - 1):
            raise RuntimeError("alignment must be a power of two and at least sizeof(void*)")
        local = int(store.local_buffer_size)
        self._store = store
        self.max_bytes = 2 * local if max_bytes == 0 else max(max_bytes, local)
        self.max_size_class = self.max_bytes if max_size_class is None else max_size_class
        self.alignment = alignment
        self.block_on_exhaustion = block_on_exhaustion
        self.default_timeout = default_timeout
        self.max_regions = max_regions
        # the arena: the store's local buffer size, registered once
        self._arena_keep, self._arena = _aligned(local, alignment)
        if store.register_buffer(self._arena, local) != 0:
            raise RuntimeError("local buffer registration failed")
        self._alloc = RangeAllocator(local, 64)
        self._cond = threading.Condition()
        self._leased: dict[int, tuple[int, int, Any]] = {}  # region id -> (ptr, size, overflow keepalive | None)
        self._next = 0
        self._total = 0
        self._closed = False
        del prewarm_size, prewarm_count  # leases are carved on demand (the original's prewarm is a no-op too)

    # ------------------------------------------------------------------ leases
    def acquire(self, size: int, block: bool | None = None, timeout: float | None = None) -> BufferLease:
        block = self.block_on_exhaustion if block is None else block
        timeout = self.default_timeout if timeout is None else timeout
        if timeout is not None and timeout < 0:
            raise RuntimeError("timeout must be non-negative")
        need = max(int(size), 1)
        if need > self.max_bytes:
            raise RuntimeError("requested buffer size exceeds pool capacity")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._raise_if_closed()
                lease = self._try_acquire(need, int(size))
                if lease is not None:
                    return lease
                if not block:
                    raise RuntimeError("buffer pool is exhausted")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RuntimeError("timed out waiting for buffer")
                self._cond.wait(left)

    buffer = acquire  # the original's alias

    def _try_acquire(self, need: int, size: int) -> BufferLease | None:
        if self._total + need > self.max_bytes:
            return None
        if self.max_regions is not None and len(self._leased) >= self.max_regions:
            return None
        off = self._alloc.allocate(need)
        if off is not None:
            ptr, keep = self._arena + off, None
        else:  # the arena is full: an overflow buffer of its own
            keep, ptr = _aligned(need, self.alignment)
            if self._store.register_buffer(ptr, need) != 0:
                raise RuntimeError("overflow buffer registration failed")
        self._next += 1
        self._leased[self._next] = (ptr, need, keep)
        self._total += need
        return BufferLease(self, ptr, size, self._next)

    def _give_back(self, region: int) -> None:
        with self._cond:
            got = self._leased.pop(region, None)
            if got is None:
                raise RuntimeError("buffer lease is not active")
            ptr, need, keep = got
            self._total -= need
            if keep is None:
                self._alloc.free(ptr - self._arena)
            elif self._store.unregister_buffer(ptr) != 0:
                raise RuntimeError("overflow buffer unregistration failed")
            self._cond.notify_all()

    def prewarm(self, size: int, count: int) -> None:
        """Accepted for the original's interface; leases are carved on demand."""

    # ------------------------------------------------------------------ lifecycle
    def _raise_if_closed(self) -> None:
        if self._closed:
            raise RuntimeError("buffer pool is closed")

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            if self._leased:
                raise RuntimeError("cannot close buffer pool with active leases")
            self._closed = True
            self._cond.notify_all()
        self._store.unregister_buffer(self._arena)


RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease
