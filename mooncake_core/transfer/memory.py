"""Raw memory access and the table of registered regions.

Why this module exists: the engine moves bytes between *addresses* (ints), exactly like
Mooncake, so that any buffer a process owns -- bytearray, numpy array, mmap, torch CPU
tensor -- can be a source or destination without copying it into a Python object first.
``memview`` wraps an address range in a writable ``memoryview`` (format 'B') that sockets
can ``recv_into`` / ``sendmsg`` directly (zero copy). ``RegionTable`` is pure logic: it
answers "is [addr, addr+len) entirely inside one registered region?", which is the safety
check every remote request must pass before memory is touched.
"""

from __future__ import annotations

import bisect
import ctypes
import threading
from dataclasses import dataclass, field

_PyMemoryView_FromMemory = ctypes.pythonapi.PyMemoryView_FromMemory
_PyMemoryView_FromMemory.restype = ctypes.py_object
_PyMemoryView_FromMemory.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int]
_PyBUF_READ = 0x100
_PyBUF_WRITE = 0x200

WILDCARD_LOCATION = "*"


def memview(addr: int, length: int, writable: bool = True) -> memoryview:
    """A memoryview over ``length`` bytes at ``addr`` (no copy; caller guarantees validity)."""
    if addr <= 0 or length < 0:
        raise ValueError(f"invalid memory range addr={addr:#x} length={length}")
    return _PyMemoryView_FromMemory(addr, length, _PyBUF_WRITE if writable else _PyBUF_READ)


def memcopy(dst: int, src: int, length: int) -> None:
    """memmove between two raw addresses (releases the GIL inside libc for large copies)."""
    ctypes.memmove(dst, src, length)


def buffer_address(obj) -> tuple[int, int]:
    """(addr, nbytes) of a writable buffer-protocol object, numpy array or torch tensor."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # torch.Tensor
        return int(obj.data_ptr()), int(obj.numel() * obj.element_size())
    if hasattr(obj, "ctypes") and hasattr(obj, "nbytes"):  # numpy
        return int(obj.ctypes.data), int(obj.nbytes)
    mv = memoryview(obj)
    if mv.readonly:
        raise ValueError("buffer is read-only; register a writable buffer")
    c = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return ctypes.addressof(c), mv.nbytes


@dataclass(frozen=True)
class Region:
    """One registered address range, as published in the segment descriptor."""

    addr: int
    length: int
    location: str = WILDCARD_LOCATION
    name: str = field(default="", compare=False)  # Mooncake's buffer "name" (informational)

    @property
    def end(self) -> int:
        return self.addr + self.length

    def to_json(self) -> dict:
        return {"addr": self.addr, "length": self.length, "name": self.name or self.location,
                "location": self.location}

    @classmethod
    def from_json(cls, d: dict) -> "Region":
        try:
            addr, length = int(d["addr"]), int(d["length"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"bad buffer entry in segment descriptor: {d!r} ({e})") from None
        loc = str(d.get("location") or d.get("name") or WILDCARD_LOCATION)
        return cls(addr, length, loc, str(d.get("name", "")))


class RegionTable:
    """Sorted, non-overlapping set of regions with O(log n) containment checks.

    Copy-on-write: writers (register/unregister, rare) build new lists under a lock and
    publish them as one tuple; readers (every served request, hot) take the tuple without
    locking, so the server never contends with the user's thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snap: tuple[list[int], list[Region]] = ([], [])

    def add(self, region: Region) -> None:
        if region.addr <= 0 or region.length <= 0:
            raise ValueError(f"cannot register addr={region.addr:#x} length={region.length}: "
                             "address and length must be positive")
        with self._lock:
            starts, regions = list(self._snap[0]), list(self._snap[1])
            i = bisect.bisect_left(starts, region.addr)
            if i < len(regions) and regions[i].addr < region.end:
                raise ValueError(f"region {region.addr:#x}+{region.length} overlaps registered "
                                 f"region {regions[i].addr:#x}+{regions[i].length}")
            if i > 0 and regions[i - 1].end > region.addr:
                p = regions[i - 1]
                raise ValueError(f"region {region.addr:#x}+{region.length} overlaps registered "
                                 f"region {p.addr:#x}+{p.length}")
            starts.insert(i, region.addr)
            regions.insert(i, region)
            self._snap = (starts, regions)

    def remove(self, addr: int) -> Region | None:
        with self._lock:
            starts, regions = list(self._snap[0]), list(self._snap[1])
            i = bisect.bisect_left(starts, addr)
            if i < len(starts) and starts[i] == addr:
                starts.pop(i)
                r = regions.pop(i)
                self._snap = (starts, regions)
                return r
            return None

    def find(self, addr: int, length: int) -> Region | None:
        """The region wholly containing [addr, addr+length), or None."""
        if length < 0 or addr < 0:
            return None
        starts, regions = self._snap
        i = bisect.bisect_right(starts, addr) - 1
        if i < 0:
            return None
        r = regions[i]
        return r if addr + length <= r.end else None

    def contains(self, addr: int, length: int) -> bool:
        if length < 0 or addr < 0:
            return False
        starts, regions = self._snap
        i = bisect.bisect_right(starts, addr) - 1
        return i >= 0 and addr + length <= regions[i].end

    def regions(self) -> list[Region]:
        return list(self._snap[1])

    def total_bytes(self) -> int:
        return sum(r.length for r in self._snap[1])

    def __len__(self) -> int:
        return len(self._snap[1])
