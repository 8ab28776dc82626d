"""MooncakeHostMemAllocator: upstream's alloc/free contract, and the process-wide lookup a dummy
client's register_buffer uses to pass such memory to mooncake_client."""

from __future__ import annotations

import ctypes

from mooncake_core.store import MooncakeHostMemAllocator
from mooncake_core.store.host_mem import HOST_REGIONS


def test_alloc_free_and_lookup() -> None:
    a, b = MooncakeHostMemAllocator(), MooncakeHostMemAllocator()
    p = a.alloc(10_000)
    assert p and ctypes.string_at(p, 10_000) == bytes(10_000)  # zeroed, mapped
    ctypes.memset(p, 7, 10_000)
    r = HOST_REGIONS.find(p + 100, 9_900)
    assert r is not None and r.addr == p and r.size == 10_000
    assert HOST_REGIONS.find(p + 100, 9_901) is None  # runs past the region
    assert HOST_REGIONS.find(p - 1, 2) is None
    assert b.free(p) == 0  # allocators share the process's regions, as upstream's share one ShmHelper
    assert HOST_REGIONS.find(p, 1) is None
    assert a.free(p) == -1  # freed already: refused, nothing else touched


def test_bad_sizes_answer_zero() -> None:
    a = MooncakeHostMemAllocator()
    assert a.alloc(0) == 0 and a.alloc(-5) == 0 and a.alloc(True) == 0  # type: ignore[arg-type]
