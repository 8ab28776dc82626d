"""Unit tests of the connector's tensor-parallel logic (no vLLM, no sockets): which prefill ranks a
decode rank reads, head-slice plans byte for byte, per-rank params and segment names."""

from __future__ import annotations

import numpy as np
import pytest

from mooncake_connectors.vllm.layout import Slab, coalesce, heads_outer, plan
from mooncake_connectors.vllm.params import ParamsError, RemotePrefill, new_transfer_id
from mooncake_connectors.vllm.tp import (KVShard, RankPlan, Source, TPMismatch, notify_targets, rank_hostname,
                                         rank_plan)


# ------------------------------------------------------------------ rank plans
def test_same_tp_reads_whole_blocks_from_the_same_rank():
    s = KVShard(2, 4096, 4, 1)
    assert rank_plan(0, s, s) == RankPlan((Source(0),), (0,))
    assert rank_plan(1, s, s) == RankPlan((Source(1),), (1,))


def test_prefill_tp2_to_decode_tp1_reads_both_head_slices():
    dec, pre = KVShard(1, 8192, 4, 2), KVShard(2, 4096, 4, 1)
    assert rank_plan(0, dec, pre) == RankPlan((Source(0, 0, 2), Source(1, 1, 2)), (0, 1))


def test_prefill_tp4_to_decode_tp2():
    dec, pre = KVShard(2, 8192, 4, 2), KVShard(4, 4096, 4, 1)
    assert rank_plan(1, dec, pre) == RankPlan((Source(2, 0, 2), Source(3, 1, 2)), (2, 3))


def test_replicated_heads_read_once_and_confirm_to_every_rank():
    # one KV head, prefill TP 2: both prefill ranks hold the same bytes
    dec, pre = KVShard(1, 4096, 4, 1), KVShard(2, 4096, 4, 1)
    assert rank_plan(0, dec, pre) == RankPlan((Source(0),), (0, 1))


@pytest.mark.parametrize("dec,pre,needle", [
    (KVShard(2, 4096, 4, 1), KVShard(1, 8192, 4, 2), "must equal the prefill's or divide it"),
    (KVShard(2, 4096, 4, 1), KVShard(3, 4096, 4, 1), "must equal the prefill's or divide it"),
    (KVShard(1, 8192, 4, 2), KVShard(2, 4096, 2, 1), "KV slabs"),
    (KVShard(2, 4096, 4, 1), KVShard(2, 2048, 4, 1), "bytes per slab"),
    (KVShard(1, 8192, 4, 2), KVShard(2, 3000, 4, 1), "needs 2 of them"),
    (KVShard(1, 8192, 4, 4), KVShard(2, 4096, 4, 1), "disjoint head slices"),
    (KVShard(1, 8192, 4, 2, heads_outer=False), KVShard(2, 4096, 4, 1), "head-outer"),
])
def test_unpairable_layouts_are_refused_with_the_reason(dec, pre, needle):
    with pytest.raises(TPMismatch, match=needle):
        rank_plan(0, dec, pre)


def test_notify_targets():
    segs = ("p0:1", "p1:2")
    assert notify_targets(0, 2, segs, 2) == ["p0:1"] and notify_targets(1, 2, segs, 2) == ["p1:2"]
    assert notify_targets(0, 1, segs, 2) == ["p0:1", "p1:2"]
    # only the prefill's rank 0 known (concurrent hand-off before ready): decode rank 0 tells it once
    assert notify_targets(0, 2, ("p0:1",), 0) == ["p0:1"] and notify_targets(1, 2, ("p0:1",), 0) == []


def test_rank_hostnames_are_unique_per_rank():
    assert rank_hostname("10.0.0.1", 1, True, lambda: 1) == "10.0.0.1"  # P2P: named after its bound port
    assert rank_hostname("10.0.0.1:7000", 0, False, lambda: 1) == "10.0.0.1:7000"
    assert rank_hostname("10.0.0.1:7000", 3, False, lambda: 1) == "10.0.0.1:7003"
    assert rank_hostname("10.0.0.1", 1, False, lambda: 45678) == "10.0.0.1:45678"
    assert rank_hostname("::1", 1, False, lambda: 45678) == "::1:45678"  # a bare IPv6 address has no port


# ------------------------------------------------------------------ head-slice plans
def test_head_slices_of_two_prefill_ranks_assemble_the_decode_blocks():
    """Prefill TP 2 (one head per rank) -> decode TP 1 (two heads), CPU layout
    (num_blocks, kv_heads, block_size, 2*head_size): block b of the decode is [head0 | head1]."""
    rng = np.random.default_rng(1)
    nb, heads, per_head = 8, 2, 48  # bytes of one head's slice of one block
    full = rng.integers(0, 255, (2, nb, heads, per_head), dtype=np.uint8)  # 2 slabs (layers)
    rank_mem = [np.ascontiguousarray(full[:, :, r, :]).reshape(2, -1) for r in range(heads)]  # prefill rank r
    local = np.zeros((2, nb * heads * per_head), dtype=np.uint8)
    base_r = [10**6, 2 * 10**6]
    pairs = [(1, 4), (2, 5), (6, 0)]  # local block <- remote block
    ls = [Slab(10**7 + i * 10**5, nb, heads * per_head, heads * per_head) for i in range(2)]
    for r in range(heads):
        rs = [Slab(base_r[r] + i * 10**5, nb, per_head, per_head) for i in range(2)]
        la, ra, ln = plan(ls, rs, coalesce(pairs), r, heads)
        assert len(la) == 2 * len(pairs) and set(ln) == {per_head}
        for a_l, a_r, n in zip(la, ra, ln):
            i = (a_r - base_r[r]) // 10**5
            off_r, off_l = a_r - base_r[r] - i * 10**5, a_l - 10**7 - i * 10**5
            local[i][off_l:off_l + n] = rank_mem[r][i][off_r:off_r + n]
    got = local.reshape(2, nb, heads, per_head)
    for loc, rem in pairs:
        assert np.array_equal(got[:, loc], full[:, rem])
    assert not got[:, [b for b in range(nb) if b not in {p[0] for p in pairs}]].any()


def test_slice_plan_refuses_a_wrong_ratio():
    with pytest.raises(ValueError, match="x 2 slices"):
        plan([Slab(0, 4, 96, 96)], [Slab(0, 4, 32, 32)], coalesce([(0, 0)]), 1, 2)
    with pytest.raises(ValueError, match="slice 2 of 2"):
        plan([Slab(0, 4, 64, 64)], [Slab(0, 4, 32, 32)], coalesce([(0, 0)]), 2, 2)


def test_heads_outer():
    assert heads_outer((100, 2, 32, 64), 100, 2)          # CPU: (num_blocks, kv_heads, block_size, 2*hs)
    assert heads_outer((2, 100, 4, 16, 64), 100, 4)       # HND: (2, num_blocks, kv_heads, block_size, hs)
    assert not heads_outer((2, 100, 16, 4, 64), 100, 4)   # NHD: (2, num_blocks, block_size, kv_heads, hs)
    assert heads_outer((2, 100, 16, 1, 64), 100, 1)       # one head: the whole block


# ------------------------------------------------------------------ params
def tp2_params() -> RemotePrefill:
    return RemotePrefill(transfer_id=new_transfer_id("e", "r"), segment="127.0.0.1:5000", engine_id="e",
                         request_id="r", block_ids=[1, 2], num_tokens=40, block_size=32, block_bytes=8192,
                         num_slabs=4, lease_expiry_unix=1e10, segments=("127.0.0.1:5000", "127.0.0.1:5001"),
                         kv_heads=1)


def test_tp_params_round_trip_and_default_to_one_rank():
    rp = tp2_params()
    d = rp.to_params()
    assert d["mooncake_tp_size"] == 2 and d["mooncake_segments"] == ["127.0.0.1:5000", "127.0.0.1:5001"]
    assert RemotePrefill.from_params(d) == rp
    for k in ("mooncake_tp_size", "mooncake_segments", "mooncake_kv_heads"):  # an older prefill's params
        d.pop(k)
    old = RemotePrefill.from_params(d)
    assert old.segments == ("127.0.0.1:5000",) and old.tp_size == 1 and old.kv_heads == 0


@pytest.mark.parametrize("key,value,needle", [
    ("mooncake_tp_size", 3, "segments"),
    ("mooncake_tp_size", 0, "segments"),
    ("mooncake_segments", ["127.0.0.1:5001", "127.0.0.1:5000"], r"\[0\]"),
    ("mooncake_segments", ["127.0.0.1:5000", "127.0.0.1:5000"], "repeats"),
    ("mooncake_segments", ["127.0.0.1:5000", "nohost"], "host:port"),
    ("mooncake_segments", "127.0.0.1:5000", "list"),
    ("mooncake_kv_heads", -1, ">= 0"),
])
def test_bad_tp_params_name_the_key(key, value, needle):
    d = tp2_params().to_params()
    d[key] = value
    with pytest.raises(ParamsError, match=needle):
        RemotePrefill.from_params(d)
