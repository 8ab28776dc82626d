"""Unit tests of the pure RangeAllocator (no sockets, milliseconds)."""

from __future__ import annotations

import random

import pytest

from mooncake_core.utils.range_allocator import RangeAllocator


def test_basic_allocate_free_and_alignment() -> None:
    a = RangeAllocator(1024, alignment=64)
    o1 = a.allocate(1)
    o2 = a.allocate(65)
    assert o1 == 0 and o2 == 64
    assert a.used == 64 + 128
    assert all(o % 64 == 0 for o in (o1, o2))
    a.free(o1)
    a.free(o2)
    assert a.used == 0
    assert a.free_blocks() == [(0, 1024)]
    assert a.largest_free == 1024


def test_full_returns_none() -> None:
    a = RangeAllocator(256, alignment=64)
    assert [a.allocate(64) for _ in range(4)] == [0, 64, 128, 192]
    assert a.allocate(1) is None
    assert a.largest_free == 0


def test_double_free_and_unknown_offset_raise() -> None:
    a = RangeAllocator(1024)
    off = a.allocate(100)
    a.free(off)
    with pytest.raises(ValueError, match="double free"):
        a.free(off)
    with pytest.raises(ValueError):
        a.free(12345)


@pytest.mark.parametrize("bad", [0, -5, 1.5, "10", True])
def test_bad_sizes_rejected(bad) -> None:
    a = RangeAllocator(1024)
    with pytest.raises(ValueError):
        a.allocate(bad)


def test_bad_constructor_args() -> None:
    with pytest.raises(ValueError):
        RangeAllocator(-1)
    with pytest.raises(ValueError):
        RangeAllocator(1024, alignment=48)


def test_best_fit_picks_smallest_hole() -> None:
    a = RangeAllocator(64 * 100, alignment=64)
    offs = [a.allocate(64 * n) for n in (4, 1, 2, 1, 8, 1)]
    # holes of 4, 2 and 8 blocks separated by live 1-block allocations
    a.free(offs[0])
    a.free(offs[2])
    a.free(offs[4])
    got = a.allocate(64 * 2)
    assert got == offs[2], "best fit must choose the 2-block hole"
    got = a.allocate(64 * 3)
    assert got == offs[0], "then the 4-block hole for a 3-block request"


def test_coalescing_both_sides() -> None:
    a = RangeAllocator(64 * 3, alignment=64)
    x, y, z = a.allocate(64), a.allocate(64), a.allocate(64)
    a.free(x)
    a.free(z)
    assert a.num_free_blocks == 2
    a.free(y)  # merges with both neighbours
    assert a.free_blocks() == [(0, 192)]
    assert a.allocate(192) == 0


def test_unaligned_capacity_tail_is_usable() -> None:
    a = RangeAllocator(100, alignment=64)
    assert a.allocate(64) == 0
    # 36 bytes left at the tail: a 30-byte request fits even though 30 rounds up to 64
    assert a.allocate(30) == 64
    assert a.allocate(1) is None
    a.free(64)
    a.free(0)
    assert a.free_blocks() == [(0, 100)]


def test_reserve_fixed_ranges() -> None:
    a = RangeAllocator(1024, alignment=64)
    a.reserve(128, 100)
    assert a.used == 128
    with pytest.raises(ValueError, match="not free"):
        a.reserve(192, 64)
    with pytest.raises(ValueError):
        a.reserve(3, 10)  # unaligned
    with pytest.raises(ValueError):
        a.reserve(1024, 64)
    # allocations avoid the reserved range
    offs = [a.allocate(64) for _ in range(14)]
    assert 128 not in offs and 192 not in offs
    assert a.allocate(64) is None
    a.free(128)
    assert a.allocate(128) == 128


def test_randomized_no_overlap_and_full_coalescing() -> None:
    rng = random.Random(1234)
    cap = 1 << 20
    a = RangeAllocator(cap, alignment=64)
    live: dict[int, int] = {}
    for step in range(20000):
        if live and (rng.random() < 0.45 or a.largest_free < 64):
            off = rng.choice(list(live)) if len(live) < 64 else next(iter(live))
            if rng.random() < 0.5:
                off = rng.choice(list(live.keys()))
            a.free(off)
            del live[off]
        else:
            size = rng.choice([rng.randint(1, 256), rng.randint(1, 8192), rng.randint(1, 65536)])
            off = a.allocate(size)
            if off is None:
                assert a.largest_free < size
                continue
            assert off % 64 == 0 and off + size <= cap
            live[off] = size
        if step % 500 == 0:
            spans = sorted((o, o + a.size_of(o)) for o in live)
            for (s1, e1), (s2, _e2) in zip(spans, spans[1:]):
                assert e1 <= s2, f"overlap: [{s1},{e1}) and [{s2},...)"
            free = a.free_blocks()
            # free blocks never adjacent (always coalesced) and never overlap live spans
            for (f1, l1), (f2, _l2) in zip(free, free[1:]):
                assert f1 + l1 < f2
            assert sum(n for _, n in free) + a.used == cap
    for off in list(live):
        a.free(off)
    assert a.used == 0
    assert a.free_blocks() == [(0, cap)], "everything freed must coalesce back to one block"


def test_untracked_mode_detects_double_free() -> None:
    a = RangeAllocator(1024, alignment=64, track=False)
    x = a.allocate(100)
    y = a.allocate(64)
    assert a.used == 192
    a.free(x, 100)
    with pytest.raises(ValueError, match="double free"):
        a.free(x, 100)
    with pytest.raises(ValueError):
        a.free(y)  # size required
    a.free(y, 64)
    assert a.free_blocks() == [(0, 1024)]


def test_untracked_randomized_matches_tracked() -> None:
    rng = random.Random(99)
    t = RangeAllocator(1 << 18, alignment=64)
    u = RangeAllocator(1 << 18, alignment=64, track=False)
    live: dict[int, int] = {}
    for _ in range(5000):
        if live and rng.random() < 0.5:
            off = rng.choice(list(live))
            t.free(off)
            u.free(off, live.pop(off))
        else:
            size = rng.randint(1, 5000)
            o1, o2 = t.allocate(size), u.allocate(size)
            assert o1 == o2
            if o1 is not None:
                live[o1] = size
        assert t.free_blocks() == u.free_blocks() and t.used == u.used
        # the untracked allocator still counts its live allocations (the master's per-segment
        # object count on /dashboard)
        assert t.num_allocations == u.num_allocations == len(live)


def test_split_turns_one_allocation_into_consecutive_ones() -> None:
    for track in (True, False):
        a = RangeAllocator(1 << 16, alignment=64, track=track)
        run = a.allocate(64 + 128 + 64)
        assert run is not None and a.num_allocations == 1
        offs = a.split(run, [10, 100, 64])
        assert offs == [run, run + 64, run + 192] and a.num_allocations == 3 and a.used == 256
        a.free(offs[1], 100)  # each is freed on its own, exactly its range
        assert a.free_blocks() == [(run + 64, 128), (run + 256, (1 << 16) - run - 256)]
        a.free(offs[0], 10)
        a.free(offs[2], 64)
        assert a.free_blocks() == [(0, 1 << 16)] and a.num_allocations == 0 and a.used == 0
        same = a.allocate(3 * 1024)
        assert same is not None and a.split(same, [1000] * 3) == [same, same + 1024, same + 2048]
    t = RangeAllocator(1 << 16, alignment=64)
    off = t.allocate(256)
    assert off is not None
    with pytest.raises(ValueError, match="does not match"):
        t.split(off, [64, 64])  # 128 of the 256 bytes
    assert t.num_allocations == 1 and t.size_of(off) == 256
