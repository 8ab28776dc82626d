"""Managed buffers: ``allocate_managed_buffer`` / ``free_managed_buffer`` over registered pools.

Why shared memory: each pool chunk is a memfd mapping (anonymous shared memory with a file
descriptor), so a future same-host transport can map it by fd without a copy; today the
chunk is simply registered like any other region. Allocation inside a chunk uses the
project's best-fit ``RangeAllocator``; a request bigger than a chunk gets a chunk of its own.
Pools are created on demand (MC_MANAGED_POOL_SIZE, default 64 MiB) and registered through
the callback the engine passes in, so peers can reach managed buffers immediately.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from dataclasses import dataclass
from typing import Callable

from mooncake_core import envs
from mooncake_core.utils.range_allocator import RangeAllocator

DEFAULT_POOL = 64 << 20  # the default of MC_MANAGED_POOL_SIZE (envs.py)


@dataclass
class _Chunk:
    mm: mmap.mmap
    anchor: ctypes.Array  # keeps the address export alive
    addr: int
    size: int
    alloc: RangeAllocator


class ManagedPool:
    def __init__(self, register: Callable[[int, int], int], unregister: Callable[[int], int],
                 chunk_size: int | None = None):
        self._register = register
        self._unregister = unregister
        self.chunk_size = chunk_size or envs.MC_MANAGED_POOL_SIZE
        self._chunks: list[_Chunk] = []
        self._lock = threading.Lock()

    def _new_chunk(self, size: int) -> _Chunk | None:
        size = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        try:
            fd = os.memfd_create("mooncake-managed", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, size)
                mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
        except (OSError, AttributeError):
            try:
                mm = mmap.mmap(-1, size)
            except OSError:
                return None
        anchor = (ctypes.c_char * size).from_buffer(mm)
        addr = ctypes.addressof(anchor)
        if self._register(addr, size) != 0:
            del anchor
            mm.close()
            return None
        ch = _Chunk(mm, anchor, addr, size, RangeAllocator(size, 64))
        self._chunks.append(ch)
        return ch

    def allocate(self, length: int) -> int:
        """Address of a fresh buffer of ``length`` bytes, or 0 on failure (Mooncake's contract)."""
        if not isinstance(length, int) or length <= 0:
            return 0
        with self._lock:
            for ch in self._chunks:
                off = ch.alloc.allocate(length)
                if off is not None:
                    return ch.addr + off
            new = self._new_chunk(max(self.chunk_size, length))
            if new is None:
                return 0
            ch = new
            off = ch.alloc.allocate(length)
            return 0 if off is None else ch.addr + off

    def free(self, addr: int, length: int) -> int:
        with self._lock:
            for ch in self._chunks:
                if ch.addr <= addr < ch.addr + ch.size:
                    try:
                        ch.alloc.free(addr - ch.addr)
                    except (KeyError, ValueError):
                        return -1
                    if ch.alloc.used == 0 and ch.size > self.chunk_size:
                        self._drop(ch)  # dedicated big chunk: give it back to the OS
                    return 0
        return -1

    def _drop(self, ch: _Chunk, unregister: bool = True) -> None:
        if unregister:
            self._unregister(ch.addr)
        self._chunks.remove(ch)
        del ch.anchor
        try:
            ch.mm.close()
        except BufferError:
            pass

    def close(self) -> None:
        with self._lock:
            for ch in list(self._chunks):
                self._drop(ch, unregister=False)  # engine is closing: nothing left to publish
