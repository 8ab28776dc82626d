"""Pure best-fit range allocator with coalescing (no I/O, no locking).

Used by the store master (one allocator per mounted segment: offsets inside the segment)
and by the Transfer Engine for managed buffers. Why best-fit over a bump/buddy allocator:
KV-cache objects come in few distinct sizes and are freed in arbitrary order; best-fit with
immediate coalescing of neighbours keeps fragmentation low without the 2x internal waste of
a buddy system.

Data structures (all O(log n) per operation via ``sortedcontainers``, O(1) for the top block):

* ``_free_by_off``: SortedDict offset -> size of each free block (find neighbours to merge).
* ``_free_by_size``: SortedList of (size, offset) (best fit = first block with size >= n;
  ties go to the lowest offset, which keeps allocations packed at the start).
* the *top* block (``_top``: offset of the free block that ends at ``capacity``; ``capacity``
  when the last byte is in use) is kept out of both indexes, as dlmalloc keeps its top chunk:
  filling a fresh segment carves every object off it in O(1) with no sorted-index update,
  and a freed range next to it merges back in O(1). It still takes part in best fit.
* ``_allocated``: dict offset -> size of live allocations (validates ``free``). With
  ``track=False`` (used by the store master, which already records every replica's offset
  and size) the dict is not kept -- it would cost ~80 bytes per object -- and ``free`` takes
  the size; a double free is still detected (the range overlaps a free block).

Every allocation is rounded up to ``alignment`` and starts at a multiple of ``alignment``.
The class is not thread-safe; callers hold their own lock.
"""

from __future__ import annotations

from sortedcontainers import SortedDict, SortedList

__all__ = ["RangeAllocator"]


class RangeAllocator:
    """Allocate ``[offset, offset + size)`` ranges inside ``[0, capacity)``."""

    __slots__ = ("_capacity", "_alignment", "_free_by_off", "_free_by_size", "_allocated", "_used",
                 "_track", "_sizes", "_top", "_need", "_count")

    def __init__(self, capacity: int, alignment: int = 64, *, track: bool = True) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
            raise ValueError(f"RangeAllocator: capacity must be a non-negative int, got {capacity!r}")
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"RangeAllocator: alignment must be a power of two > 0, got {alignment!r}")
        self._capacity = capacity
        self._alignment = alignment
        self._free_by_off: SortedDict = SortedDict()
        self._free_by_size: SortedList = SortedList()
        self._allocated: dict[int, int] = {}
        self._used = 0
        self._count = 0  # live allocations, also without track (the master's per-segment object count)
        self._track = track
        self._sizes: dict[int, int] = {}  # interned rounded sizes (few distinct ones in practice)
        self._need: dict[int, int] = {}  # requested size -> its interned rounded size (validated)
        self._top = 0  # the free tail [_top, capacity) lives outside the indexes

    # ------------------------------------------------------------------ properties
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def alignment(self) -> int:
        return self._alignment

    @property
    def used(self) -> int:
        """Bytes held by live allocations (after rounding up to the alignment)."""
        return self._used

    @property
    def free_bytes(self) -> int:
        return self._capacity - self._used

    @property
    def largest_free(self) -> int:
        """Size of the largest free block: the biggest request that can succeed now."""
        top = self._capacity - self._top
        if not self._free_by_size:
            return top
        size: int = self._free_by_size[-1][0]
        return size if size > top else top

    @property
    def num_allocations(self) -> int:
        """Live allocations (counted also with track=False)."""
        return self._count

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_by_off) + (self._top < self._capacity)

    def free_blocks(self) -> list[tuple[int, int]]:
        """(offset, size) of every free block in address order (for tests/inspection)."""
        out = list(self._free_by_off.items())
        if self._top < self._capacity:
            out.append((self._top, self._capacity - self._top))
        return out

    def size_of(self, offset: int) -> int:
        """Rounded size of the live allocation at ``offset`` (ValueError if none)."""
        try:
            return self._allocated[offset]
        except KeyError:
            raise ValueError(f"RangeAllocator: no allocation at offset {offset}") from None

    # ------------------------------------------------------------------ internals
    def _round(self, size: int) -> int:
        a = self._alignment
        r = (size + a - 1) & ~(a - 1)
        got = self._sizes.get(r)
        if got is not None:
            return got
        if len(self._sizes) < 1024:
            self._sizes[r] = r
        return r

    def _record(self, off: int, size: int) -> None:
        if self._track:
            self._allocated[off] = size
        self._used += size
        self._count += 1

    def _add_free(self, off: int, size: int) -> None:
        self._free_by_off[off] = size
        self._free_by_size.add((size, off))

    def _remove_free(self, off: int, size: int) -> None:
        del self._free_by_off[off]
        self._free_by_size.remove((size, off))

    @staticmethod
    def _check_size(size: int) -> None:
        if not isinstance(size, int) or isinstance(size, bool):
            raise ValueError(f"RangeAllocator: size must be an int, got {type(size).__name__}")
        if size <= 0:
            raise ValueError(f"RangeAllocator: size must be > 0, got {size}")

    # ------------------------------------------------------------------ API
    def allocate(self, size: int) -> int | None:
        """Best-fit allocate ``size`` bytes; returns the offset, or None when no free block
        is large enough (the caller decides whether to evict and retry)."""
        need = self._need.get(size) if size.__class__ is int else None
        if need is None:
            self._check_size(size)
            need = self._round(size)
            if len(self._need) < 1024:
                self._need[size] = need
        top = self._top
        top_size = self._capacity - top
        by_size = self._free_by_size
        if by_size:
            idx = by_size.bisect_left((need, -1))
            if idx < len(by_size):
                bsize, boff = by_size[idx]
                if not need <= top_size < bsize:  # else the top block is the better fit
                    self._remove_free(boff, bsize)
                    if bsize > need:
                        self._add_free(boff + need, bsize - need)
                    else:
                        need = bsize
                    self._record(boff, need)
                    return int(boff)
        if need <= top_size:
            self._top = top + need
            if self._track:
                self._allocated[top] = need
            self._used += need
            self._count += 1
            return top
        # The top block may be shorter than a rounded request yet still hold ``size`` bytes
        # (capacity not a multiple of the alignment): accept an exact tail fit.
        if size <= top_size:
            self._top = self._capacity
            self._record(top, top_size)
            return top
        return None

    def rounded(self, size: int) -> int:
        """What an allocation of ``size`` bytes takes (rounded up to the alignment)."""
        need = self._need.get(size)
        if need is None:
            self._check_size(size)
            need = self._round(size)
        return need

    def split(self, offset: int, sizes: list[int]) -> list[int]:
        """Turn the live allocation at ``offset`` into consecutive allocations of ``sizes``
        (each taking ``rounded(size)``; together exactly what the allocation took), as if
        each had been allocated on its own: each is freed on its own from now on. Returns
        their offsets. Why: a client's batch reservation (``master_batch``) is allocated as
        one range -- one allocation instead of one per object -- and published as one
        object per key. With ``track=False`` the caller vouches for the total (the store
        master knows it); otherwise a mismatch is a ValueError and nothing changes."""
        offs: list[int] = []
        at = offset
        if sizes and sizes.count(sizes[0]) == len(sizes):  # all alike (a batch usually is)
            r = self.rounded(sizes[0])
            offs = list(range(offset, offset + r * len(sizes), r))
            at = offset + r * len(sizes)
        else:
            for n in sizes:
                offs.append(at)
                at += self.rounded(n)
        if self._track:
            held = self._allocated.get(offset)
            if held is None or held != at - offset:
                raise ValueError(f"RangeAllocator: split of [{offset}, {at}) does not match the allocation "
                                 f"there ({held!r} bytes)")
            del self._allocated[offset]
            for o, n in zip(offs, sizes):
                self._allocated[o] = self.rounded(n)
        if sizes:
            self._count += len(sizes) - 1
        return offs

    def reserve(self, offset: int, size: int) -> None:
        """Mark ``[offset, offset+size)`` as allocated at a fixed place.

        Used when a new master leader rebuilds its state from replicas that clients
        re-report: those ranges hold live data and must never be handed out again.
        Raises ValueError if any byte of the range is not free.
        """
        self._check_size(size)
        if offset < 0 or offset % self._alignment:
            raise ValueError(f"RangeAllocator: reserve offset {offset} is negative or not "
                             f"{self._alignment}-aligned")
        need = min(self._round(size), self._capacity - offset)
        if need < size:
            raise ValueError(f"RangeAllocator: reserve [{offset}, {offset + size}) exceeds "
                             f"capacity {self._capacity}")
        if offset >= self._top:  # inside the top block: what lies below the range is indexed
            if offset > self._top:
                self._add_free(self._top, offset - self._top)
            self._top = offset + need
            self._record(offset, need)
            return
        idx = self._free_by_off.bisect_right(offset) - 1
        if idx < 0:
            raise ValueError(f"RangeAllocator: range [{offset}, {offset + size}) is not free")
        boff, bsize = self._free_by_off.peekitem(idx)
        if offset + need > boff + bsize:
            raise ValueError(f"RangeAllocator: range [{offset}, {offset + size}) is not free")
        self._remove_free(boff, bsize)
        if offset > boff:
            self._add_free(boff, offset - boff)
        tail = boff + bsize - (offset + need)
        if tail > 0:
            self._add_free(offset + need, tail)
        self._record(offset, need)

    def free(self, offset: int, size: int | None = None) -> None:
        """Free the allocation starting at ``offset``, merging it with free neighbours.

        ValueError on an unknown offset or a double free (never silently corrupts state).
        With ``track=False`` the caller passes the ``size`` it allocated."""
        if self._track:
            size = self._allocated.pop(offset, None)
            if size is None:
                raise ValueError(f"RangeAllocator: free of offset {offset} that is not allocated "
                                 f"(double free or wrong offset)")
        else:
            if size is None:
                raise ValueError("RangeAllocator(track=False).free needs the allocated size")
            if offset < 0 or offset % self._alignment or offset >= self._capacity:
                raise ValueError(f"RangeAllocator: free of offset {offset} that is not allocated")
            size = min(self._round(size), self._capacity - offset)
            if offset + size > self._top:
                raise ValueError(f"RangeAllocator: free of [{offset}, {offset + size}) that is "
                                 f"(partly) free already (double free)")
            idx = self._free_by_off.bisect_right(offset + size - 1) - 1
            if idx >= 0:
                poff, psize = self._free_by_off.peekitem(idx)
                if poff + psize > offset:
                    raise ValueError(f"RangeAllocator: free of [{offset}, {offset + size}) that is "
                                     f"(partly) free already (double free)")
        self._used -= size
        self._count -= 1
        start, end = offset, offset + size
        # merge with the following free block (or into the top block)
        nxt = self._free_by_off.get(end)
        if nxt is not None:
            self._remove_free(end, nxt)
            end += nxt
        # merge with the preceding free block
        idx = self._free_by_off.bisect_left(start) - 1
        if idx >= 0:
            poff, psize = self._free_by_off.peekitem(idx)
            if poff + psize == start:
                self._remove_free(poff, psize)
                start = poff
        if end == self._top:
            self._top = start
        else:
            self._add_free(start, end - start)

    def __repr__(self) -> str:
        return (f"RangeAllocator(capacity={self._capacity}, used={self._used}, "
                f"allocations={len(self._allocated)}, free_blocks={self.num_free_blocks}, "
                f"largest_free={self.largest_free})")
