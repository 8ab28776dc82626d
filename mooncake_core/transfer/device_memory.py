"""Device memory (GPU) as the engine sees it: which registered ranges are on a device, and
how to copy to and from them -- without importing any device library here.

Why a module of its own: the transports and the rpc server move bytes between raw addresses
with memmove and sockets, which must never touch a device pointer (a segfault, or garbage).
Every place that touches memory asks :func:`find` first -- one tuple read when no device
memory is registered, so host-only engines pay nothing -- and hands device ranges to the
:class:`DeviceCopier` of their kind, installed by the plugin that serves that kind (the
``cuda`` plugin: ``mooncake_core/transfer/cuda/``). A kind without a copier cannot be
registered at all (``LocalSegment.add`` refuses it), so no device range is ever left to
memmove.

:class:`HostCopier` is a real copier over host memory: CPU tests install it for a device
kind to drive the staging pipeline, the rpc server's staged path and the in-process copies
with real bytes (``tests/transfer/test_device_staging.py``); the CUDA copier is thin.
"""

from __future__ import annotations

import bisect
import ctypes
import threading
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["DeviceCopier", "HostCopier", "DeviceRange", "install_copier", "uninstall_copier", "copier_for",
           "add_range", "remove_range", "find", "active", "all_device", "locate", "copy_any"]


class DeviceCopier(Protocol):
    """The few device operations the engine needs (cudaMemcpyAsync and friends).

    Addresses are ints in one unified address space (CUDA's UVA), so one ``copy_async``
    serves host->device, device->host and device->device alike. Streams are opaque."""

    kind: str

    def copy(self, dst: int, src: int, n: int) -> None:
        """Copy ``n`` bytes and wait for them."""

    def copy_async(self, dst: int, src: int, n: int, stream: Any) -> None:
        """Queue a copy on ``stream`` (host memory involved must be pinned to overlap)."""

    def copy_batch_async(self, dsts: Any, srcs: Any, sizes: Any, stream: Any, device_only: bool = False) -> None:
        """Queue many copies on ``stream`` with as few calls as the device allows (a KV block
        list is thousands of 16 KiB copies: one call each costs more than the bytes).
        ``device_only``: every address is device or pinned memory (a kernel may copy them)."""

    def new_stream(self, device: int) -> Any:
        """A stream on ``device`` for copies that overlap the caller's socket I/O."""

    def synchronize(self, stream: Any) -> None:
        """Wait until every copy queued on ``stream`` is done (raises on a device error)."""

    def alloc_pinned(self, n: int) -> int:
        """Page-locked host memory the device copies to/from asynchronously."""

    def free_pinned(self, addr: int) -> None:
        """Release :meth:`alloc_pinned` memory."""

    def device_of(self, addr: int) -> int | None:
        """The device ordinal holding ``addr``, or None for host memory (auto-detect of ``*``)."""


@dataclass(frozen=True)
class DeviceRange:
    """One registered device range: [addr, addr+length) on ``kind`` device ``device``."""

    addr: int
    length: int
    kind: str
    device: int

    @property
    def end(self) -> int:
        return self.addr + self.length


class HostCopier:
    """A :class:`DeviceCopier` over host memory (memmove; streams are no-ops): real copies, so
    what uses it -- chunking, buffer reuse, ordering, failure handling -- is tested on CPU."""

    def __init__(self, kind: str = "cuda") -> None:
        self.kind = kind
        self.copies = 0  # how many copies ran (tests assert the staged path was taken)
        self._pinned: dict[int, ctypes.Array[ctypes.c_char]] = {}

    def copy(self, dst: int, src: int, n: int) -> None:
        self.copies += 1
        ctypes.memmove(dst, src, n)

    def copy_async(self, dst: int, src: int, n: int, stream: Any) -> None:
        self.copy(dst, src, n)

    def copy_batch_async(self, dsts: Any, srcs: Any, sizes: Any, stream: Any, device_only: bool = False) -> None:
        for d, s, n in zip(dsts, srcs, sizes):
            self.copy(int(d), int(s), int(n))

    def new_stream(self, device: int) -> Any:
        return object()

    def synchronize(self, stream: Any) -> None:
        return None

    def alloc_pinned(self, n: int) -> int:
        buf = ctypes.create_string_buffer(n)
        addr = ctypes.addressof(buf)
        self._pinned[addr] = buf
        return addr

    def free_pinned(self, addr: int) -> None:
        self._pinned.pop(addr, None)

    def device_of(self, addr: int) -> int | None:
        return None  # host memory is never detected as a device; tests register with "cuda:0"


_lock = threading.Lock()
_copiers: dict[str, DeviceCopier] = {}
#: (starts, ranges) published as one tuple (copy-on-write, read without a lock on the hot path)
_ranges: tuple[list[int], list[DeviceRange]] = ([], [])


def install_copier(kind: str, copier: DeviceCopier) -> None:
    """Make ``kind`` memory registrable in this process, copied by ``copier``."""
    with _lock:
        _copiers[kind] = copier


def uninstall_copier(kind: str) -> None:
    with _lock:
        _copiers.pop(kind, None)


def copier_for(kind: str) -> DeviceCopier | None:
    return _copiers.get(kind)


def add_range(addr: int, length: int, kind: str, device: int) -> None:
    """A device region was registered (by any engine of this process)."""
    global _ranges
    with _lock:
        starts, ranges = list(_ranges[0]), list(_ranges[1])
        i = bisect.bisect_left(starts, addr)
        starts.insert(i, addr)
        ranges.insert(i, DeviceRange(addr, length, kind, device))
        _ranges = (starts, ranges)


def remove_range(addr: int) -> None:
    global _ranges
    with _lock:
        starts, ranges = list(_ranges[0]), list(_ranges[1])
        i = bisect.bisect_left(starts, addr)
        if i < len(starts) and starts[i] == addr:
            del starts[i], ranges[i]
            _ranges = (starts, ranges)


def active() -> bool:
    """True when any device range is registered in this process (else every check is skipped)."""
    return bool(_ranges[0])


def find(addr: int, length: int = 1) -> DeviceRange | None:
    """The registered device range holding [addr, addr+length), or None (host memory)."""
    starts, ranges = _ranges
    if not starts:
        return None
    i = bisect.bisect_right(starts, addr) - 1
    if i < 0:
        return None
    r = ranges[i]
    return r if addr + max(length, 1) <= r.end else None


_arrays_of: tuple[Any, Any, Any] = (None, None, None)  # (the _ranges snapshot, starts, ends) as numpy


def all_device(addrs: Any, lengths: Any) -> bool:
    """Is every [addr, addr+length) inside one registered device range? (vectorized; numpy arrays)"""
    import numpy as np
    global _arrays_of
    snap = _ranges
    if not snap[0]:
        return False
    if _arrays_of[0] is not snap:  # rebuilt only when a device region comes or goes
        _arrays_of = (snap, np.asarray(snap[0], dtype=np.int64), np.asarray([r.end for r in snap[1]], dtype=np.int64))
    s, e = _arrays_of[1], _arrays_of[2]
    a = np.asarray(addrs, dtype=np.int64)
    i = np.searchsorted(s, a, side="right") - 1
    return bool((i >= 0).all() and (a + np.asarray(lengths, dtype=np.int64) <= e[np.maximum(i, 0)]).all())


def locate(addr: int) -> str | None:
    """"cuda:N" when an installed copier says ``addr`` is device memory (the ``*`` location's
    auto-detect, as the original does for GPU pointers), else None."""
    for kind, c in list(_copiers.items()):
        dev = c.device_of(addr)
        if dev is not None:
            return f"{kind}:{dev}"
    return None


def copy_any(dst: int, src: int, n: int) -> None:
    """memmove, or the device copier when either side is registered device memory (the
    in-process transport: one call whatever the mix of host and device)."""
    r = find(dst, n) or find(src, n)
    if r is None:
        ctypes.memmove(dst, src, n)
        return
    c = _copiers.get(r.kind)
    if c is None:
        raise RuntimeError(f"{r.kind} memory at {r.addr:#x} has no copier installed")
    c.copy(dst, src, n)
