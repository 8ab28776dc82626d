"""Merging LMDeploy's migration assignment into one batched read (pure logic, no LMDeploy needed)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from mooncake_connectors.lmdeploy.plan import PlanError, RegionInfo, build_plan

L, N, B = 4, 32, 256  # layers, blocks, bytes per block entry: LMDeploy's packed (L, N, B) pool
LOCAL = {"0": RegionInfo(0x10000, L * N * B)}
REMOTE = {"0": RegionInfo(0x900000, L * N * B)}


def assignment(pairs: list[tuple[int, int]]) -> list[dict]:
    """What LMDeploy's build_cache_pool_assignments emits for an (L, N, B) pool, entry axis 1:
    per layer, per (prefill block, decode block) pair, one entry (target = prefill = remote)."""
    out = []
    for layer in range(L):
        for target_block, source_block in pairs:
            out.append({"mr_key": 0, "target_offset": layer * N * B + target_block * B,
                        "source_offset": layer * N * B + source_block * B, "length": B})
    return out


def apply(plan, local: bytearray, remote: bytes) -> None:
    for la, ra, n in zip(plan.local, plan.remote, plan.length):
        lo, ro = int(la) - LOCAL["0"].addr, int(ra) - REMOTE["0"].addr
        local[lo:lo + int(n)] = remote[ro:ro + int(n)]


def apply_unmerged(entries: list[dict], local: bytearray, remote: bytes) -> None:
    for e in entries:
        lo, ro, n = e["source_offset"], e["target_offset"], e["length"]
        local[lo:lo + n] = remote[ro:ro + n]


def test_contiguous_blocks_merge_to_one_range_per_layer() -> None:
    plan = build_plan(assignment([(5 + i, 9 + i) for i in range(6)]), LOCAL, REMOTE)
    assert plan.entries == 4 * 6
    assert len(plan) == 4  # one range per layer
    assert list(plan.length) == [6 * B] * 4
    assert int(plan.local[0]) == LOCAL["0"].addr + 9 * B
    assert int(plan.remote[0]) == REMOTE["0"].addr + 5 * B


def test_whole_pool_merges_across_layers() -> None:
    plan = build_plan(assignment([(i, i) for i in range(N)]), LOCAL, REMOTE)
    assert len(plan) == 1 and plan.nbytes == L * N * B


def test_contiguous_on_one_side_only_does_not_merge() -> None:
    plan = build_plan(assignment([(0, 0), (1, 2), (2, 4)]), LOCAL, REMOTE)  # local gaps
    assert len(plan) == 3 * L
    plan = build_plan(assignment([(0, 3), (2, 4)]), LOCAL, REMOTE)  # remote gap
    assert len(plan) == 2 * L


def test_random_pairs_move_the_same_bytes_as_entry_by_entry() -> None:
    rng = random.Random(7)
    remote = bytes(rng.getrandbits(8) for _ in range(L * N * B))
    for _ in range(20):
        k = rng.randrange(1, N)
        pairs = list(zip(rng.sample(range(N), k), rng.sample(range(N), k)))
        entries = assignment(pairs)
        rng.shuffle(entries)
        got, want = bytearray(L * N * B), bytearray(L * N * B)
        plan = build_plan(entries, LOCAL, REMOTE)
        apply(plan, got, remote)
        apply_unmerged(entries, want, remote)
        assert got == want
        assert plan.nbytes == k * L * B
        assert len(plan) <= len(entries)


def test_accepts_pydantic_like_objects_and_zero_lengths() -> None:
    class Task:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    plan = build_plan([Task(mr_key=0, target_offset=0, source_offset=B, length=B),
                       Task(mr_key=0, target_offset=B, source_offset=0, length=0)], LOCAL, REMOTE)
    assert len(plan) == 1 and plan.entries == 2
    assert len(build_plan([], LOCAL, REMOTE)) == 0


@pytest.mark.parametrize("entry, words", [
    ({"mr_key": 1, "target_offset": 0, "source_offset": 0, "length": 8}, ["mr_key=1", "local side"]),
    ({"mr_key": 0, "target_offset": L * N * B - 4, "source_offset": 0, "length": 8},
     ["entry 0", "remote (prefill-a)", "past the end"]),
    ({"mr_key": 0, "target_offset": 0, "source_offset": L * N * B, "length": 1}, ["local region"]),
    ({"mr_key": 0, "target_offset": -1, "source_offset": 0, "length": 8}, ["negative"]),
    ({"mr_key": 0, "target_offset": 0, "source_offset": 0, "length": "8"}, ["length", "integer"]),
])
def test_bad_entries_are_refused_whole_with_the_reason(entry: dict, words: list[str]) -> None:
    with pytest.raises(PlanError) as e:
        build_plan([{"mr_key": 0, "target_offset": 0, "source_offset": 0, "length": 8}, entry] if "entry 0" not in
                   words else [entry], LOCAL, REMOTE, peer="prefill-a")
    for w in words:
        assert w in str(e.value)


def test_remote_region_missing_names_peer() -> None:
    with pytest.raises(PlanError, match=r"remote \(http://p:1\)"):
        build_plan([{"mr_key": 0, "target_offset": 0, "source_offset": 0, "length": 8}], LOCAL, {}, peer="http://p:1")


def test_overlapping_destinations_are_refused() -> None:
    entries = [{"mr_key": 0, "target_offset": 0, "source_offset": 0, "length": 2 * B},
               {"mr_key": 0, "target_offset": 4 * B, "source_offset": B, "length": B}]
    with pytest.raises(PlanError, match="twice"):
        build_plan(entries, LOCAL, REMOTE)


def test_several_pools_use_their_own_regions() -> None:
    local = {"0": RegionInfo(0x1000, 4096), "1": RegionInfo(0x8000, 4096)}
    remote = {"0": RegionInfo(0x100000, 4096), "1": RegionInfo(0x200000, 4096)}
    plan = build_plan([{"mr_key": 1, "target_offset": 64, "source_offset": 128, "length": 64},
                       {"mr_key": 0, "target_offset": 0, "source_offset": 0, "length": 64}], local, remote)
    assert list(map(int, plan.local)) == [0x1000, 0x8000 + 128]
    assert list(map(int, plan.remote)) == [0x100000, 0x200000 + 64]
    assert plan.local.dtype == np.int64
