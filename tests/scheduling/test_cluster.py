"""ClusterState: prefix index (LRU per instance, holders, remote/store lookup) and load bookkeeping."""

from __future__ import annotations

import pytest

from mooncake_proxy.scheduling import ClusterState, InstanceInfo, LruBlockCache, RequestInfo


def test_lru_cache_eviction_and_prefix() -> None:
    c = LruBlockCache(3)
    assert c.insert([1, 2, 3]) == []
    assert c.prefix_len([1, 2, 3, 4]) == 3
    assert c.prefix_len([2, 1]) == 2
    assert c.prefix_len([9, 1]) == 0  # stops at the first miss
    c.insert([1])  # touch 1: now 2 is the least recent
    assert c.insert([4]) == [2]
    assert 2 not in c and 1 in c
    # A request bigger than the cache keeps its last blocks.
    assert c.insert([10, 11, 12, 13]) == [3, 1, 4, 10]
    assert list(c) == [11, 12, 13]
    u = LruBlockCache(0)
    u.insert(range(100_000))
    assert len(u) == 100_000
    with pytest.raises(ValueError, match="capacity"):
        LruBlockCache(-1)


def _cluster(cap: int = 0, store: int | None = None) -> ClusterState:
    cl = ClusterState(block_size=4, store_capacity_blocks=store)
    for p in ("p0", "p1", "p2"):
        cl.add_instance(InstanceInfo(p, "prefill", cache_capacity_blocks=cap))
    cl.add_instance(InstanceInfo("d0", "decode"))
    return cl


def test_prefix_index_per_instance_and_best_remote() -> None:
    cl = _cluster()
    cl.record_blocks("p0", [1, 2, 3])
    cl.record_blocks("p1", [1, 2, 3, 4, 5])
    cl.record_blocks("p2", [7])
    q = [1, 2, 3, 4, 5, 6]
    assert cl.prefix_hit_blocks("p0", q) == 3
    assert cl.prefix_hit_blocks("p1", q) == 5
    assert cl.prefix_hit_blocks("p2", q) == 0
    assert cl.prefix_hit_blocks("d0", q) == 0
    assert cl.prefix_hits_all(q) == {"p0": 3, "p1": 5}
    assert cl.best_remote_prefix(q) == ("p1", 5)
    assert cl.best_remote_prefix(q, exclude="p1") == ("p0", 3)
    assert cl.best_remote_prefix(q, exclude=["p0", "p1"]) == (None, 0)
    cl.set_healthy("p1", False)
    assert cl.best_remote_prefix(q) == ("p0", 3)  # unhealthy holders cannot serve a fetch


def test_eviction_updates_index() -> None:
    cl = _cluster(cap=3)
    assert cl.record_blocks("p0", [1, 2, 3, 4]) == [1]
    assert cl.prefix_hit_blocks("p0", [1, 2]) == 0
    assert cl.prefix_hit_blocks("p0", [2, 3, 4]) == 3
    assert cl.prefix_hits_all([2, 3]) == {"p0": 2}
    assert cl.remove_blocks("p0", [3, 99]) == 1
    assert cl.prefix_hit_blocks("p0", [2, 3, 4]) == 1
    assert cl.clear_blocks("p0") == 2
    assert cl.prefix_hits_all([2]) == {}
    assert cl.remove_blocks("ghost", [1]) == 0  # events from a removed instance are harmless


def test_store_tier() -> None:
    cl = _cluster(store=2)
    assert cl.store_enabled and cl.store_capacity_blocks == 2
    cl.store_record([5, 6, 7])  # capacity 2: keeps 6, 7
    assert cl.store_hit_blocks([6, 7, 8]) == 2
    assert cl.store_hit_blocks([5, 6]) == 0
    cl.record_blocks("p0", [6])
    assert cl.best_remote_prefix([6, 7]) == ("store", 2)
    cl.record_blocks("p0", [6, 7])
    assert cl.best_remote_prefix([6, 7]) == ("p0", 2)  # instance wins ties
    assert not _cluster().store_enabled
    assert _cluster().store_hit_blocks([1]) == 0


def test_instances_and_errors() -> None:
    cl = _cluster()
    assert [i.instance_id for i in cl.instances("prefill")] == ["p0", "p1", "p2"]
    assert [i.instance_id for i in cl.instances("decode")] == ["d0"]
    assert len(cl.instances()) == 4
    cl.set_healthy("p1", False)
    assert [i.instance_id for i in cl.healthy_instances("prefill")] == ["p0", "p2"]
    with pytest.raises(KeyError, match="'nope'"):
        cl.set_healthy("nope", True)
    with pytest.raises(ValueError, match="role"):
        cl.instances("both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="role"):
        InstanceInfo("x", "both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="already registered as prefill"):
        cl.add_instance(InstanceInfo("p0", "decode"))
    with pytest.raises(ValueError, match="decode instance"):
        cl.record_blocks("d0", [1])
    # Re-adding updates capacity and keeps what fits.
    cl.record_blocks("p0", [1, 2, 3])
    cl.add_instance(InstanceInfo("p0", "prefill", cache_capacity_blocks=1))
    assert cl.prefix_hits_all([3]) == {"p0": 1} and cl.prefix_hits_all([1]) == {}
    cl.remove_instance("p0")
    assert "p0" not in cl and cl.prefix_hits_all([3]) == {}
    with pytest.raises(KeyError):
        cl.remove_instance("p0")


def test_load_bookkeeping() -> None:
    cl = _cluster()
    cl.record_blocks("p0", [1, 2])
    r1 = RequestInfo("r1", 10, [1, 2, 3], max_output_tokens=8)
    r2 = RequestInfo("r2", 6, [9], max_output_tokens=4)
    cl.on_prefill_start("p0", r1, now=1.0, decode_id="d0")
    cl.on_prefill_start("p0", r1, now=1.5)  # duplicate: ignored
    load = cl.prefill_load("p0")
    assert list(load.entries) == ["r1"]
    assert load.entries["r1"].cached_tokens == 8 and load.entries["r1"].new_tokens == 2
    assert load.head_since == 1.0 and load.queued_tokens == 2
    cl.on_prefill_start("p0", r2, now=2.0, cached_blocks=0)
    assert load.queued_tokens == 8 and load.head_since == 1.0
    assert list(cl.decode_load("d0").incoming) == ["r1"]
    assert cl.on_prefill_done("p0", r1, now=3.0)
    assert load.head_since == 3.0 and load.queued_tokens == 6
    assert cl.decode_load("d0").incoming == {}
    assert not cl.on_prefill_done("p0", r1, now=3.0)  # already done
    cl.on_decode_start("d0", r1, now=3.1)
    dl = cl.decode_load("d0")
    assert dl.running == 1 and dl.kv_tokens == 10 + 4
    assert cl.on_decode_done("d0", r1, now=4.0)
    assert dl.running == 0 and dl.kv_tokens == 0
    assert not cl.on_decode_done("d0", r1, now=4.0)
    assert not cl.on_decode_done("gone", r1, now=4.0)
    with pytest.raises(KeyError):
        cl.on_prefill_start("gone", r1, now=0)
    # A fully cached prompt still computes one token.
    r3 = RequestInfo("r3", 8, [1, 2])
    cl.on_prefill_start("p0", r3, now=5.0)
    assert load.entries["r3"].new_tokens == 1


def test_request_validation() -> None:
    with pytest.raises(ValueError, match="'bad'.*prompt_tokens"):
        RequestInfo("bad", -1)


def test_removing_prefill_instance_drops_its_incoming_decode_load() -> None:
    cl = _cluster()
    r1, r2 = RequestInfo("r1", 10, [1]), RequestInfo("r2", 10, [2])
    cl.on_prefill_start("p0", r1, 0.0, decode_id="d0")
    cl.on_prefill_start("p1", r2, 0.0, decode_id="d0")
    assert set(cl.decode_load("d0").incoming) == {"r1", "r2"}
    cl.remove_instance("p0")
    assert set(cl.decode_load("d0").incoming) == {"r2"}
    assert not cl.on_prefill_done("p0", r1, 1.0)  # cleanup after removal is harmless
