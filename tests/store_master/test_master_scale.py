"""Per-operation cost of the master's decisions must not grow with the number of stored objects.

Not timed: the test counts the Python lines the pure ``MasterState`` executes (``sys.settrace``)
for the same batch of work on a store holding a few objects and one holding many. Any walk over
the objects, the in-flight puts, the leases or the allocator's blocks shows up as a count that
grows with the store; O(1) / O(log n) work does not (the tolerance covers the log factors of
the sorted free-block index).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from mooncake_core.store.master_state import MasterConfig, MasterState
from mooncake_core.store.protocol import ReplicateConfigMsg
from mooncake_core.utils.range_allocator import RangeAllocator

BATCH = 200


def _count_lines(fn: Callable[[], Any]) -> int:
    n = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal n
        if event == "line":
            n += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return n


class _Store:
    def __init__(self) -> None:
        self.now = 1000.0
        self.st = MasterState(MasterConfig(eviction_high_watermark_ratio=1.0, default_kv_lease_ttl_ms=1000), clock=lambda: self.now)
        self.st.mount_segment("c", "10.0.0.1:1", 0x7F0000000000, 1 << 36)
        self.st.mount_segment("d", "10.0.0.2:1", 0x7E0000000000, 1 << 36)
        self.n = 0

    def keys(self, n: int) -> list[str]:
        ks = [f"k-{self.n + i}" for i in range(n)]
        self.n += n
        return ks

    def fill(self, n: int) -> None:
        for lo in range(0, n, 1000):
            ks = self.keys(min(1000, n - lo))
            self.st.batch_put_start("c", ks, [1024] * len(ks), ReplicateConfigMsg())
            self.st.batch_put_end("c", ks)

    def work(self, cfg: ReplicateConfigMsg) -> Callable[[], None]:
        """One round: batch put (start+end) of fresh keys, single puts, reads under leases,
        existence checks, removal of the oldest keys (frees ranges: the free-block index),
        and a tick after the leases ran out."""
        ks = self.keys(BATCH)
        singles = self.keys(20)
        st = self.st

        def run() -> None:
            st.batch_put_start("c", ks, [1024] * BATCH, cfg)
            st.batch_put_end("c", ks)
            for k in singles:
                st.put_start("c", k, 3000, cfg)
                st.put_end("c", k)
            st.batch_get_replica_list(ks[:50])
            st.batch_exist_key(ks)
            st.batch_remove(ks[50:100])
            self.now += 2  # past the leases, well within client_ttl
            st.heartbeat("c")
            st.heartbeat("d")
            st.tick()

        return run


def _growth(cfg: ReplicateConfigMsg) -> tuple[int, int]:
    small, big = _Store(), _Store()
    small.fill(1_000)
    big.fill(40_000)
    for s in (small, big):  # warm up: interned sizes, first free blocks
        s.work(cfg)()
    return _count_lines(small.work(cfg)), _count_lines(big.work(cfg))


def test_put_get_remove_cost_independent_of_stored_objects() -> None:
    few, many = _growth(ReplicateConfigMsg())
    assert many <= few * 1.1, f"one round executed {few} lines at 1k objects but {many} at 40k"


def test_replicated_put_cost_independent_of_stored_objects() -> None:
    few, many = _growth(ReplicateConfigMsg(replica_num=2, soft_pin=True))
    assert many <= few * 1.1, f"one round executed {few} lines at 1k objects but {many} at 40k"


def test_allocator_fills_from_the_top_block_without_index_updates() -> None:
    """Filling a fresh segment carves every range off the top block: no sorted-index work, so
    the thousandth allocation costs what the first did."""
    a = RangeAllocator(1 << 30, alignment=64)
    a.allocate(1024)  # interns the rounded size
    first = _count_lines(lambda: a.allocate(1024))
    for _ in range(50_000):
        a.allocate(1024)
    later = _count_lines(lambda: a.allocate(1024))
    assert later == first
    assert a.num_free_blocks == 1 and a.free_blocks() == [(50_003 * 1024, (1 << 30) - 50_003 * 1024)]
    a.free(50_002 * 1024)  # the newest range: merges back into the top block
    assert a.free_blocks() == [(50_002 * 1024, (1 << 30) - 50_002 * 1024)]
