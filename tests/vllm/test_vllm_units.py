"""Unit tests of the connector's pure logic (no vLLM, no sockets): params, layout, leases, plugin."""

from __future__ import annotations

import random

import numpy as np
import pytest

from mooncake_connectors.vllm.layout import (Run, Slab, coalesce, pair_blocks, plan, remote_slabs_from_regions,
                                             slabs_of)
from mooncake_connectors.vllm.leases import ClockOffsets, Rendezvous, SendTracker
from mooncake_core.pd.params import (ParamsError, PendingPrefill, RemotePrefill, chosen_transfer_id,
                                             concurrent_decode_params, concurrent_prefill_params, is_pending,
                                             new_transfer_id, parse_pending, wants_remote_decode,
                                             wants_remote_prefill)


def sample() -> RemotePrefill:
    return RemotePrefill(transfer_id=new_transfer_id("eng", "req-1"), segment="127.0.0.1:4567", engine_id="eng",
                         request_id="req-1", block_ids=[7, 8, 9], num_tokens=70, block_size=32,
                         block_bytes=16384, num_slabs=2, lease_expiry_unix=1e10)


# ------------------------------------------------------------------ params
def test_params_round_trip_and_vllm_key_names():
    rp = sample()
    d = rp.to_params()
    assert d["do_remote_prefill"] is True and d["do_remote_decode"] is False
    assert (d["remote_host"], d["remote_port"]) == ("127.0.0.1", 4567)
    assert RemotePrefill.from_params(d) == rp


def test_transfer_ids_are_unique():
    assert len({new_transfer_id("e", "r") for _ in range(1000)}) == 1000


@pytest.mark.parametrize("key,value,needle", [
    ("mooncake_segment", "nohostport", "mooncake_segment"),
    ("mooncake_segment", "h:99999", "mooncake_segment"),
    ("remote_block_ids", [1, -2], "remote_block_ids"),
    ("remote_block_ids", "1,2", "remote_block_ids"),
    ("remote_num_tokens", 500, "do not fit"),
    ("remote_num_tokens", True, "remote_num_tokens"),
    ("mooncake_version", 99, "mooncake_version"),
    ("mooncake_transfer_id", None, "mooncake_transfer_id"),
])
def test_params_errors_name_the_key(key, value, needle):
    d = sample().to_params()
    d[key] = value
    with pytest.raises(ParamsError, match=needle):
        RemotePrefill.from_params(d)


def test_params_not_a_dict():
    with pytest.raises(ParamsError, match="JSON object"):
        RemotePrefill.from_params([1, 2])


# ------------------------------------------------------------------ layout
def test_cpu_layout_is_one_packed_slab_per_layer():
    t = np.zeros((10, 2, 32, 64), dtype=np.float32)  # vLLM CPU: (blocks, kv_heads, block_size, 2*head)
    strides = tuple(s // 4 for s in t.strides)
    (s,) = slabs_of(1000, t.shape, strides, 4, 10)
    assert s == Slab(base=1000, num_blocks=10, block_bytes=2 * 32 * 64 * 4, stride=2 * 32 * 64 * 4)
    assert s.addr(3) == 1000 + 3 * s.block_bytes
    with pytest.raises(IndexError):
        s.addr(10)


def test_kv_split_layout_gives_two_slabs():
    t = np.zeros((2, 10, 32, 2, 32), dtype=np.float16)  # flash: (2, blocks, block_size, heads, head)
    strides = tuple(x // 2 for x in t.strides)
    k, v = slabs_of(0x1000, t.shape, strides, 2, 10)
    assert v.base - k.base == 10 * 32 * 2 * 32 * 2
    assert k.block_bytes == k.stride == 32 * 2 * 32 * 2


def test_non_contiguous_block_is_refused():
    t = np.zeros((10, 2, 32, 64), dtype=np.float32)[:, :, :, ::2]
    with pytest.raises(ValueError, match="not contiguous"):
        slabs_of(0, t.shape, tuple(s // 4 for s in t.strides), 4, 10)
    with pytest.raises(ValueError, match="no block dimension"):
        slabs_of(0, (3, 4, 5), (20, 5, 1), 4, 10)


def test_pairing_skips_locally_cached_blocks_and_extra_slots():
    remote = [40, 41, 42, 43, 44]
    assert pair_blocks([5, 6, 7], remote, 2) == [(5, 42), (6, 43), (7, 44)]
    assert pair_blocks([5, 6, 7, 8, 9, 10], remote, 0)[-1] == (9, 44)  # block 10 holds no prompt token


def test_coalesce_merges_runs_contiguous_on_both_sides():
    assert coalesce([(1, 10), (2, 11), (3, 12), (5, 13), (6, 14), (7, 20)]) == [
        Run(1, 10, 3), Run(5, 13, 2), Run(7, 20, 1)]
    assert coalesce([]) == []


def test_plan_moves_exactly_the_paired_blocks_byte_for_byte():
    rng = np.random.default_rng(0)
    nb, bb = 16, 64
    remote_mem = [rng.integers(0, 255, nb * bb, dtype=np.uint8) for _ in range(3)]
    local_mem = [np.zeros(nb * bb, dtype=np.uint8) for _ in range(3)]
    # fake address space: slab i lives at i*1e6 (remote) and 1e7 + i*1e6 (local)
    rs = [Slab(i * 10**6, nb, bb, bb) for i in range(3)]
    ls = [Slab(10**7 + i * 10**6, nb, bb, bb) for i in range(3)]
    pairs = [(3, 9), (4, 10), (5, 11), (12, 2)]
    la, ra, ln = plan(ls, rs, coalesce(pairs))
    assert len(la) == 3 * 2  # two runs per slab
    assert sum(ln) == len(pairs) * bb * 3  # no more bytes than the blocks needed
    for a_l, a_r, n in zip(la, ra, ln):
        i = a_r // 10**6
        off_r, off_l = a_r - i * 10**6, a_l - 10**7 - i * 10**6
        local_mem[i][off_l:off_l + n] = remote_mem[i][off_r:off_r + n]
    for i in range(3):
        for loc, rem in pairs:
            assert np.array_equal(local_mem[i][loc * bb:(loc + 1) * bb], remote_mem[i][rem * bb:(rem + 1) * bb])
        untouched = [b for b in range(nb) if b not in {p[0] for p in pairs}]
        assert all(not local_mem[i][b * bb:(b + 1) * bb].any() for b in untouched)


def test_plan_refuses_mismatched_layouts():
    with pytest.raises(ValueError, match="slabs here"):
        plan([Slab(0, 4, 8, 8)], [], [Run(0, 0, 1)])
    with pytest.raises(ValueError, match="bytes per block"):
        plan([Slab(0, 4, 8, 8)], [Slab(0, 4, 16, 16)], [Run(0, 0, 1)])
    with pytest.raises(ValueError, match="exceeds"):
        plan([Slab(0, 4, 8, 8)], [Slab(0, 2, 8, 8)], [Run(0, 1, 2)])


def test_remote_slabs_from_regions():
    s = remote_slabs_from_regions([(100, 800), (2000, 800), (9000, 5)], 80, 2, "peer:1")
    assert [x.num_blocks for x in s] == [10, 10] and s[1].base == 2000
    with pytest.raises(ValueError, match="expected 3 KV slabs"):
        remote_slabs_from_regions([(100, 800)], 80, 3, "peer:1")
    with pytest.raises(ValueError, match="not a multiple"):
        remote_slabs_from_regions([(100, 810)], 80, 1, "peer:1")


# ------------------------------------------------------------------ leases
def test_confirmation_frees_and_lease_expires_the_rest():
    st = SendTracker()
    assert not st.hold("r1", "t1", expiry=100.0, now=0.0)
    assert not st.hold("r2", "t2", expiry=100.0, now=0.0)
    assert st.confirm("t1", now=1.0) == "r1"
    assert st.confirm("t1", now=1.5) is None  # duplicate confirmation: nothing more to free
    assert st.expire(now=99.0) == []
    assert st.expire(now=100.0) == ["r2"]
    assert st.held() == 0 and st.expired_total == 1 and st.confirmed_total == 1
    assert st.confirm("t2", now=101.0) is None  # late confirmation after expiry: already freed


def test_confirmation_before_the_worker_knows_the_request():
    st = SendTracker(early_ttl_s=10)
    assert st.confirm("t9", now=0.0) is None
    assert st.hold("r9", "t9", expiry=50.0, now=1.0) is True  # free right away
    assert st.held() == 0
    st.confirm("old", now=0.0)
    st.expire(now=20.0)
    assert st.hold("rx", "old", expiry=50.0, now=21.0) is False  # stale early confirmation forgotten


def test_random_interleavings_never_free_twice():
    rng = random.Random(7)
    for _ in range(200):
        st = SendTracker()
        freed: list[str] = []
        ids = [f"r{i}" for i in range(10)]
        for i, rid in enumerate(ids):
            if st.hold(rid, f"t{i}", expiry=rng.uniform(5, 15), now=0.0):
                freed.append(rid)
        for now in range(20):
            for i in rng.sample(range(10), 3):
                r = st.confirm(f"t{i}", now=float(now))
                if r:
                    freed.append(r)
            freed.extend(st.expire(float(now)))
        assert sorted(freed) == sorted(ids)


# ------------------------------------------------------------------ plugin
def test_plugin_without_vllm_is_a_no_op_and_package_imports_lazily():
    import importlib.util

    import mooncake_connectors.vllm as pkg
    from mooncake_connectors.vllm.plugin import register

    if importlib.util.find_spec("vllm") is None:
        assert register() == []
    with pytest.raises(AttributeError):
        pkg.NoSuchConnector  # noqa: B018


# ------------------------------------------------------------------ store keys
def test_chained_keys_identify_the_whole_prefix():
    from mooncake_core.pd.keys import chained_block_keys, leading_hits, namespace

    seed = namespace("m", 4, "v1")
    rng = random.Random(3)
    toks = [rng.randrange(1000) for _ in range(18)]
    ks = chained_block_keys(seed, toks, 4)
    assert len(ks) == 4 and len(set(ks)) == 4  # full blocks only
    assert chained_block_keys(seed, toks[:12] + [7] * 6, 4)[:3] == ks[:3]  # same prefix, same keys
    changed = list(toks)
    changed[1] ^= 1  # one token early on changes every later key
    assert all(a != b for a, b in zip(chained_block_keys(seed, changed, 4), ks))
    assert chained_block_keys(namespace("m", 4, "v1", salt="s"), toks, 4)[0] != ks[0]
    assert chained_block_keys(namespace("other", 4, "v1"), toks, 4)[0] != ks[0]
    assert chained_block_keys(seed, toks, 4, max_blocks=2) == ks[:2]
    assert leading_hits([1, 1, 0, 1]) == 2 and leading_hits([1, -1, 1]) == 1 and leading_hits([]) == 0
    with pytest.raises(ValueError):
        chained_block_keys(seed, toks, 0)


# ------------------------------------------------------------------ concurrent hand-off
def test_concurrent_params_round_trip():
    d = concurrent_decode_params("mc-1", "10.0.0.1:15000")
    assert wants_remote_prefill(d) and is_pending(d) and not is_pending(sample().to_params())
    assert parse_pending(d) == PendingPrefill("mc-1", "10.0.0.1:15000")
    pre = concurrent_prefill_params("mc-1")
    assert wants_remote_decode(pre) and chosen_transfer_id(pre) == "mc-1"
    assert chosen_transfer_id({"do_remote_decode": True}) is None


@pytest.mark.parametrize("key,value,needle", [
    ("mooncake_segment", "nohost", "host:port"),
    ("mooncake_segment", None, "mooncake_segment"),
    ("mooncake_transfer_id", "", "1..1024"),
    ("mooncake_transfer_id", "x" * 2000, "1..1024"),
    ("mooncake_transfer_id", 5, "mooncake_transfer_id"),
    ("mooncake_version", 99, "mooncake_version"),
])
def test_pending_params_errors_name_the_key(key, value, needle):
    d = concurrent_decode_params("mc-1", "10.0.0.1:15000")
    d[key] = value
    with pytest.raises(ParamsError, match=needle):
        parse_pending(d)
    with pytest.raises(ParamsError):
        parse_pending([d])


def test_rendezvous_pairs_in_either_order_once():
    r = Rendezvous()
    params = {"mooncake_transfer_id": "a"}
    assert r.want("a", "dec:1", 100.0) is None  # the decode asks while the prefill computes
    assert r.offer("a", params, 100.0) == [("dec:1", params)]
    assert r.offer("b", {"x": 1}, 100.0) == []  # the prefill finished first
    assert r.want("b", "dec:2", 100.0) == ("dec:2", {"x": 1})
    assert r.answered("b", "dec:2") and not r.answered("b", "dec:3") and not r.answered("zz", "dec:2")
    # the decode asks again when no ready came (the first was lost): answered again
    assert r.want("b", "dec:2", 100.0) == ("dec:2", {"x": 1})
    r.expire(101.0)  # the offers end with the lease
    assert r.pending() == 0


def test_rendezvous_answers_every_decode_rank():
    """Under TP each decode rank asks the prefill's rank 0, before or after it finished."""
    r = Rendezvous()
    params = {"mooncake_transfer_id": "t"}
    assert r.want("t", "dec-rank0:1", 100.0) is None
    assert r.want("t", "dec-rank1:2", 100.0) is None
    assert r.want("t", "dec-rank1:2", 100.0) is None
    assert r.offer("t", params, 100.0) == [("dec-rank0:1", params), ("dec-rank1:2", params)]
    assert r.answered("t", "dec-rank1:2")  # answered by the offer
    assert r.want("t", "dec-rank1:2", 100.0) == ("dec-rank1:2", params)  # asking again: its ready was lost
    assert r.offer("u", params, 100.0) == []
    assert r.want("u", "dec-rank0:1", 100.0) == ("dec-rank0:1", params)
    assert r.want("u", "dec-rank1:2", 100.0) == ("dec-rank1:2", params)  # a sibling asking later


def test_rendezvous_drops_unpaired_entries_at_expiry():
    r = Rendezvous()
    r.want("w", "dec:1", 10.0)
    r.offer("o", {}, 20.0)
    r.expire(15.0)
    assert r.pending() == 1
    assert r.offer("w", {}, 30.0) == []  # the want expired: the offer waits for a new one
    r.expire(40.0)
    assert r.pending() == 0


@pytest.mark.parametrize("skew", [10.0, -10.0, 0.0])
def test_clock_offset_takes_a_peers_skew_out_of_its_lease(skew):
    """A prefill whose clock is ``skew`` s off states its lease expiry on that clock; after one
    round trip the decode knows the offset and checks the lease on its own clock, early by half
    the round trip -- never late, whichever way the skew goes."""
    c = ClockOffsets(max_age_s=30.0)
    assert c.deadline("p:1", 1000.0) == 1000.0 and not c.fresh("p:1", 0.0)  # unmeasured: uncorrected
    # our send at wall 500.0 / mono 50.0, the answer back 4 ms later; the peer stamped its clock
    # 1 ms after our send (it is ``skew`` ahead of ours)
    off, err = c.sample("p:1", 500.0, 50.0, 500.001 + skew, 500.004, 50.004)
    assert off == pytest.approx(skew - 0.001) and err == pytest.approx(0.002)
    true_expiry_ours = 530.0                      # the prefill frees at 30 s after our 500.0
    stated = true_expiry_ours + skew               # ... which its params state on its clock
    d = c.deadline("p:1", stated)
    assert d <= true_expiry_ours and true_expiry_ours - d < 0.01
    assert c.fresh("p:1", 60.0) and not c.fresh("p:1", 80.1)  # refreshed every max_age_s
    c.assume("q:2", 70.0)
    assert c.deadline("q:2", 123.0) == 123.0 and c.offset("q:2") == (0.0, 0.0)
