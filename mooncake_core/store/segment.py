"""The memory a store client contributes to the pool: one anonymous mmap, owned by the client."""

from __future__ import annotations

import ctypes
import mmap
import threading
import time

from mooncake_core import envs
from mooncake_core.store.memory import madvise_populate, prefault_enabled

__all__ = ["StoreSegment"]


class StoreSegment:
    """Anonymous mmap'ed memory, registered with the TE; owned by this client.

    Pages are populated (``MADV_POPULATE_WRITE``, which never changes contents, so it is
    safe while peers already write into the segment): otherwise the first write by a peer
    into every fresh page pays a page fault inside the transfer. The first ``SYNC_S``
    seconds' worth is done here, before ``setup`` returns, and only the rest of a large
    segment by a background thread: zeroing runs at a core's full speed for about a second
    per few GiB, and done in the background right after setup it competed with the first
    puts and gets for the cores (issue 18: put p99 3-4 ms at an empty store with a 2 GiB
    segment on 2 cores). ``MC_STORE_PREFAULT=0`` turns populating off (memory is then
    committed lazily).
    """

    #: bytes populated per madvise call: the call holds the process's mmap lock (for reading)
    #: until it is done, and anything needing it for writing (a heap trim, an mmap of a large
    #: buffer, a new thread's stack) waits meanwhile -- and so does every page fault queued
    #: behind that writer. 32 MiB took tens of ms on a loaded host: millisecond stalls of
    #: puts and gets right after setup (issue 18: p99 4-12 ms at an empty store).
    CHUNK = 2 << 20
    #: seconds of populating done in the constructor (setup) before the background thread
    #: takes the rest: a segment of a few GiB is ready when setup returns, a huge one makes
    #: setup at most this much slower
    SYNC_S = 1.5

    def __init__(self, size: int):
        self.size = size
        self.mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        # opt-in transparent huge pages (fewer page faults); measured *slower* for
        # process_vm_writev into fresh memory on our reference machine, hence off by default
        if envs.MC_STORE_HUGEPAGES and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self.mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        self._anchor: ctypes.c_char | None = ctypes.c_char.from_buffer(self.mm)
        self.addr = ctypes.addressof(self._anchor)
        #: a byte view of the whole segment: slices of it fingerprint what we wrote (memory.fingerprint_of)
        self.view: memoryview | None = memoryview(self.mm)
        self._stop = threading.Event()
        self._populater: threading.Thread | None = None
        if prefault_enabled():
            off = self._populate(0, time.monotonic() + self.SYNC_S)
            if 0 <= off < size:
                self._populater = threading.Thread(target=self._populate, args=(off,),
                                                   name="mooncake-segment-populate", daemon=True)
                self._populater.start()

    def _populate(self, off: int, until: float = float("inf")) -> int:
        """Populate from ``off`` until the end, ``until`` (monotonic) or ``close``: where it
        stopped, or -1 when the kernel refused (old kernel, no memory to commit: stay lazy)."""
        while off < self.size and not self._stop.is_set() and time.monotonic() < until:
            n = min(self.CHUNK, self.size - off)
            if not madvise_populate(self.addr + off, n):
                return -1
            off += n
        return off

    def close(self) -> None:
        self._stop.set()
        if self._populater is not None:
            self._populater.join(timeout=30)
        self._anchor = None
        if self.view is not None:
            self.view.release()
            self.view = None
        try:
            self.mm.close()
        except BufferError:  # a view still alive somewhere; let GC unmap it
            pass
