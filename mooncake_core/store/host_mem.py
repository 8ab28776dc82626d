"""``MooncakeHostMemAllocator``: host memory an engine can later hand to ``mooncake_client``.

Why it exists: an engine attached with ``setup_dummy`` stores and loads its KV cache with
``put_from``/``get_into`` on its own host buffers, which the service must map to reach. Memory
from ``malloc`` or torch cannot be passed to another process; a memfd can. This allocator (the
original's name and methods: ``alloc(size) -> address``, ``free(address) -> 0``) hands out memfd
regions and remembers them process-wide, so that a dummy client's ``register_buffer`` on such a
buffer passes it to the service then (SGLang HiCache's standalone storage allocates its host KV
pool this way). Outside a dummy it is plain shared host memory: a full client registers it as
any other buffer.
"""

from __future__ import annotations

import threading

from mooncake_core.store.shm import Region, create_region
from mooncake_core.utils.log import get_logger

__all__ = ["HOST_REGIONS", "HostRegions", "MooncakeHostMemAllocator"]

log = get_logger("mooncake.store.host_mem")


class HostRegions:
    """The memfd regions the allocator handed out in this process, by address."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._regions: dict[int, Region] = {}

    def alloc(self, size: int) -> Region:
        r = create_region(size, "mooncake-host-mem")
        with self._lock:
            self._regions[r.addr] = r
        return r

    def free(self, addr: int) -> bool:
        with self._lock:
            r = self._regions.pop(addr, None)
        if r is None:
            return False
        r.close()
        return True

    def find(self, ptr: int, size: int) -> Region | None:
        """The region holding ``[ptr, ptr + size)``, if one does."""
        with self._lock:
            for r in self._regions.values():
                if r.addr <= ptr and ptr + size <= r.addr + r.size:
                    return r
        return None


#: the process's allocations (every MooncakeHostMemAllocator shares them, as upstream's
#: allocators share one ShmHelper)
HOST_REGIONS = HostRegions()


class MooncakeHostMemAllocator:
    """Upstream's ``mooncake.store.MooncakeHostMemAllocator``: ``alloc``/``free`` of host memory
    a dummy client can share with ``mooncake_client`` (see the module docstring)."""

    def alloc(self, size: int) -> int:
        """Address of ``size`` fresh bytes (zeroed), or 0 with the reason logged."""
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            log.error("MooncakeHostMemAllocator.alloc: size must be a positive integer (bytes), got %r", size)
            return 0
        try:
            return HOST_REGIONS.alloc(size).addr
        except OSError as e:
            log.error("MooncakeHostMemAllocator.alloc(%d): %s", size, e)
            return 0

    def free(self, ptr: int) -> int:
        """0, or -1 when ``ptr`` is not an address ``alloc`` returned (nothing is freed)."""
        if not HOST_REGIONS.free(ptr):
            log.error("MooncakeHostMemAllocator.free(0x%x): not an address alloc() returned", ptr)
            return -1
        return 0
