"""Unit tests of the connector's tensor-parallel logic (no vLLM, no sockets): which prefill ranks a
decode rank reads, head-slice plans byte for byte, per-rank params and segment names."""

from __future__ import annotations

import numpy as np
import pytest

from mooncake_connectors.vllm.layout import Slab, coalesce, heads_outer, pair_blocks, plan
from mooncake_connectors.vllm.leases import SendTracker
from mooncake_core.pd.notify import Confirmation, NotifyError, confirmation, decode
from mooncake_core.pd.params import ParamsError, RemotePrefill, new_transfer_id
from mooncake_connectors.vllm.tp import (KVShard, RankPlan, Source, TPMismatch, notify_targets, rank_hostname,
                                         rank_plan, readers)


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


def test_prefill_tp1_to_decode_tp2_reads_one_head_slice_each():
    # the NixlConnector mapping: source rank r * P // D, head offset r % (D // P); both confirm to rank 0
    dec, pre = KVShard(2, 4096, 4, 1), KVShard(1, 8192, 4, 2)
    assert rank_plan(0, dec, pre) == RankPlan((Source(0, remote_part=0, remote_parts=2),), (0,), readers=2)
    assert rank_plan(1, dec, pre) == RankPlan((Source(0, remote_part=1, remote_parts=2),), (0,), readers=2)


def test_prefill_tp2_to_decode_tp4():
    dec, pre = KVShard(4, 4096, 4, 1), KVShard(2, 8192, 4, 2)
    assert [rank_plan(r, dec, pre) for r in range(4)] == [
        RankPlan((Source(r // 2, remote_part=r % 2, remote_parts=2),), (r // 2,), readers=2) for r in range(4)]


def test_decode_replicating_heads_reads_the_slice_of_its_head():
    # 2 KV heads, prefill TP 1 (2 heads), decode TP 4 (1 head per rank, each twice): ranks 0,1 read
    # head 0, ranks 2,3 head 1 (NixlConnector: local_head = r * H // D)
    dec, pre = KVShard(4, 4096, 4, 1), KVShard(1, 8192, 4, 2)
    assert [rank_plan(r, dec, pre).reads[0].remote_part for r in range(4)] == [0, 0, 1, 1]
    assert {rank_plan(r, dec, pre).readers for r in range(4)} == {4}
    # 1 KV head on both (replicated on every rank): whole blocks
    one = KVShard(2, 4096, 4, 1), KVShard(1, 4096, 4, 1)
    assert rank_plan(1, *one) == RankPlan((Source(0),), (0,), readers=2)


def test_readers_and_notify_targets_of_a_wider_decode():
    assert [readers(d, p) for d, p in ((2, 1), (4, 2), (4, 1), (2, 2), (1, 2), (3, 2), (2, 0))] == [2, 2, 4, 1, 1, 1, 1]
    segs = ("p0:1", "p1:2")
    assert [notify_targets(r, 4, segs, 2) for r in range(4)] == [["p0:1"], ["p0:1"], ["p1:2"], ["p1:2"]]
    assert notify_targets(1, 2, segs[:1], 1) == ["p0:1"]


@pytest.mark.parametrize("dec,pre,needle", [
    (KVShard(3, 4096, 4, 1), KVShard(2, 4096, 4, 1), "prefill TP 2: one TP must be a multiple"),
    (KVShard(2, 4096, 4, 1), KVShard(3, 4096, 4, 1), "prefill TP 3: one TP must be a multiple"),
    (KVShard(2, 4096, 4, 1), KVShard(1, 8192, 4, 2, heads_outer=False), "decode TP 2 cannot read a head slice"),
    (KVShard(2, 3000, 4, 1), KVShard(1, 8192, 4, 2), "not a multiple of decode TP 2"),
    (KVShard(2, 2048, 4, 1), KVShard(1, 8192, 4, 4), "cannot share evenly"),
    (KVShard(2, 4096, 4, 1), KVShard(1, 8192, 4, 4), "not 2 disjoint head slices"),
    (KVShard(2, 4096, 4, 1), KVShard(1, 8192, 2, 2), "KV slabs"),
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


def test_head_slices_of_one_prefill_rank_fill_two_decode_ranks():
    """Prefill TP 1 (two heads) -> decode TP 2 (one head each), CPU layout: decode rank r reads the
    r-th head slice of every prefill block -- one contiguous range per block, a block apart from
    the next (strided) -- and the two ranks' caches together are the prefill's blocks byte for byte."""
    rng = np.random.default_rng(2)
    nb, heads, per_head, slabs = 8, 2, 48, 3
    full = rng.integers(0, 255, (slabs, nb, heads, per_head), dtype=np.uint8)  # the prefill rank's cache
    remote = full.reshape(slabs, -1)
    base_r, base_l = 10**6, 10**7
    rs = [Slab(base_r + i * 10**5, nb, heads * per_head, heads * per_head) for i in range(slabs)]
    local_ids, remote_ids = [5, 6, 7, 1], [0, 1, 2, 3, 4]  # one local prefix-hit block: remote 0 is skipped
    pairs = pair_blocks(local_ids, remote_ids, 1)
    dec, pre = KVShard(2, per_head, slabs, 1), KVShard(1, heads * per_head, slabs, 2)
    ranks = []
    for r in range(2):
        src = rank_plan(r, dec, pre).reads[0]
        ls = [Slab(base_l + i * 10**5, nb, per_head, per_head) for i in range(slabs)]
        la, ra, ln = plan(ls, rs, coalesce(pairs), src.part, src.parts, src.remote_part, src.remote_parts)
        assert len(la) == slabs * len(pairs) and set(ln) == {per_head}  # one descriptor per block per slab
        mem = np.zeros((slabs, nb * per_head), dtype=np.uint8)
        for a_l, a_r, n in zip(la, ra, ln):
            i = (a_r - base_r) // 10**5
            off_r, off_l = a_r - base_r - i * 10**5, a_l - base_l - i * 10**5
            assert (a_l - base_l) // 10**5 == i  # slab i into slab i
            mem[i][off_l:off_l + n] = remote[i][off_r:off_r + n]
        ranks.append(mem.reshape(slabs, nb, per_head))
    for loc, rem in pairs:  # the two ranks' blocks, heads side by side, are the prefill's block
        assert np.array_equal(np.stack([ranks[0][:, loc], ranks[1][:, loc]], axis=1), full[:, rem])
        assert not np.array_equal(ranks[0][:, loc], ranks[1][:, loc])  # really different heads
    untouched = [b for b in range(nb) if b not in {p[0] for p in pairs}]
    assert not ranks[0][:, untouched].any() and not ranks[1][:, untouched].any()


def test_slice_plan_refuses_a_wrong_ratio():
    with pytest.raises(ValueError, match="/ 2 slices"):
        plan([Slab(0, 4, 32, 32)], [Slab(0, 4, 96, 96)], coalesce([(0, 0)]), 0, 1, 1, 2)
    with pytest.raises(ValueError, match="remote slice 2 of 2"):
        plan([Slab(0, 4, 32, 32)], [Slab(0, 4, 64, 64)], coalesce([(0, 0)]), 0, 1, 2, 2)
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
                         kv_heads=1, heads_outer=True)


def test_tp_params_round_trip_and_default_to_one_rank():
    rp = tp2_params()
    d = rp.to_params()
    assert d["mooncake_tp_size"] == 2 and d["mooncake_segments"] == ["127.0.0.1:5000", "127.0.0.1:5001"]
    assert RemotePrefill.from_params(d) == rp
    for k in ("mooncake_tp_size", "mooncake_segments", "mooncake_kv_heads", "mooncake_heads_outer"):  # older
        d.pop(k)
    old = RemotePrefill.from_params(d)
    assert old.segments == ("127.0.0.1:5000",) and old.tp_size == 1 and old.kv_heads == 0
    assert not old.heads_outer  # unknown: a wider decode will not read head slices of it
    assert RemotePrefill.from_params(dict(d, mooncake_heads_outer=True)).heads_outer


@pytest.mark.parametrize("key,value,needle", [
    ("mooncake_tp_size", 3, "segments"),
    ("mooncake_tp_size", 0, "segments"),
    ("mooncake_segments", ["127.0.0.1:5001", "127.0.0.1:5000"], r"\[0\]"),
    ("mooncake_segments", ["127.0.0.1:5000", "127.0.0.1:5000"], "repeats"),
    ("mooncake_segments", ["127.0.0.1:5000", "nohost"], "host:port"),
    ("mooncake_segments", "127.0.0.1:5000", "list"),
    ("mooncake_kv_heads", -1, ">= 0"),
    ("mooncake_heads_outer", 1, "true or false"),
])
def test_bad_tp_params_name_the_key(key, value, needle):
    d = tp2_params().to_params()
    d[key] = value
    with pytest.raises(ParamsError, match=needle):
        RemotePrefill.from_params(d)


# ------------------------------------------------------------------ confirmations of several readers
def test_confirmation_messages_round_trip():
    assert confirmation("done", 0, 1) == "done"  # one reader: the message of before
    assert decode("done") == Confirmation("done", 0, 1)
    assert confirmation("release", 1, 2) == "release 1/2"
    assert decode("release 1/2") == Confirmation("release", 1, 2)
    for bad in ("done 2/2", "done 1/", "done a/2", "done 0/0", "done 0/1000", "ready 0/2", "done  0/2", "done ²/3"):
        with pytest.raises(NotifyError):
            decode(bad)
    assert not isinstance(decode("want x:1"), Confirmation)
    with pytest.raises(ValueError):
        confirmation("done", 2, 2)


def test_several_readers_free_once_all_confirmed():
    st = SendTracker()
    st.hold("r1", "t1", expiry=100.0, now=0.0)
    assert st.confirm("t1", 1.0, 0, 2) is None
    assert st.confirm("t1", 1.1, 0, 2) is None  # a repeat counts once
    assert st.confirm("t1", 1.2, 1, 2) == "r1"
    assert st.held() == 0 and st.confirmed_total == 1


def test_several_readers_confirming_before_the_worker_knows():
    st = SendTracker(early_ttl_s=10)
    assert st.confirm("t1", 0.0, 1, 2) is None
    assert st.hold("r1", "t1", expiry=100.0, now=0.5) is False  # one of two: keep holding
    assert st.confirm("t1", 1.0, 0, 2) == "r1"
    assert st.confirm("t2", 0.0, 0, 2) is None and st.confirm("t2", 0.1, 1, 2) is None
    assert st.hold("r2", "t2", expiry=100.0, now=0.5) is True  # both came early: free right away
    st.confirm("t3", 0.0, 0, 2)  # a partial one of a request this rank never holds is forgotten
    st.expire(20.0)
    assert st.hold("r3", "t3", expiry=100.0, now=21.0) is False
    assert st.confirm("t3", 22.0, 1, 2) is None  # the old half was forgotten: still one of two


def test_a_lease_expiry_forgets_partial_confirmations():
    st = SendTracker()
    st.hold("r1", "t1", expiry=10.0, now=0.0)
    assert st.confirm("t1", 1.0, 0, 2) is None
    assert st.expire(10.0) == ["r1"]
    assert st.confirm("t1", 11.0, 1, 2) is None and st.held() == 0  # late: already freed, not again
