"""``--allocation_strategy`` in the master's pure state: where replicas go among the segments
a put does not prefer, and the share of new puts a node that rejoined empty gets."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from mooncake_core.store.master_records import MasterConfig
from mooncake_core.store.master_state import MasterState
from mooncake_core.store.protocol import ReplicateConfigMsg

MiB = 1 << 20


def _pool(strategy: str) -> MasterState:
    """Four nodes of 64 MiB; three hold 32 MiB each, the fourth just rejoined empty."""
    st = MasterState(MasterConfig(allocation_strategy=strategy), clock=lambda: 100.0, rng=random.Random(7))
    for i in range(4):
        st.mount_segment(f"c{i}", f"10.0.0.{i}:1234{i}", (i + 1) << 32, 64 * MiB)
    for i in range(3):
        for j in range(32):
            st.put_start(f"c{i}", f"old{i}-{j}", MiB, ReplicateConfigMsg(preferred_segments=[f"10.0.0.{i}:1234{i}"]))
            st.put_end(f"c{i}", f"old{i}-{j}")
    return st


def _shares(st: MasterState, n: int = 400, writer: str = "c0") -> Counter[str]:
    got: Counter[str] = Counter()
    for i in range(n):
        [r] = st.put_start(writer, f"new{i}", 16 * 1024)
        st.put_end(writer, f"new{i}")
        got[r.segment_name] += 1
    return got


def test_random_gives_a_rejoined_node_its_share_not_every_put() -> None:
    st = _pool("random")
    share = _shares(st)["10.0.0.3:12343"] / 400
    assert 0.15 <= share <= 0.40, share


def test_free_ratio_first_fills_the_emptiest_node() -> None:
    assert MasterConfig().allocation_strategy == "free_ratio_first"  # the default (see MasterConfig)
    assert _shares(_pool("free_ratio_first"))["10.0.0.3:12343"] == 400


def test_local_first_prefers_the_writers_host() -> None:
    st = _pool("local_first")
    assert _shares(st, 50, writer="c2") == Counter({"10.0.0.2:12342": 50})
    # replicas beyond the local one spread over the others
    reps = st.put_start("c2", "two", 1024, ReplicateConfigMsg(replica_num=2))
    assert reps[0].segment_name == "10.0.0.2:12342" and reps[1].segment_name != reps[0].segment_name


def test_unknown_strategy_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="allocation_strategy must be one of random, free_ratio_first"):
        MasterState(MasterConfig(allocation_strategy="best"))


def test_max_keys_evicts_lru_then_refuses_naming_the_flag() -> None:
    t = [100.0]
    st = MasterState(MasterConfig(max_keys=3, default_kv_lease_ttl_ms=1000), clock=lambda: t[0])
    st.mount_segment("c0", "s0", 1 << 32, 64 * MiB)
    for k in ("a", "b", "c"):
        st.put_start("c0", k, 1000)
        st.put_end("c0", k)
    st.get_replica_list("a")  # a is now the most recently used, and leased
    st.put_start("c0", "d", 1000)  # batch and single puts alike go through the bound
    st.put_end("c0", "d")
    assert sorted(st.objects) == ["a", "c", "d"] and st.stats.key_limit_evictions == 1  # b: least recent
    for k in ("a", "c", "d"):
        st.get_replica_list(k)  # every object leased: nothing can go
    from mooncake_core.errors import MooncakeError

    with pytest.raises(MooncakeError, match="--max_keys=3") as e:
        st.put_start("c0", "e", 1000)
    assert e.value.code == -200 and st.stats.key_limit_refusals == 1
    placed = st.batch_put_start("c0", ["e", "f"], [1000, 1000])
    assert placed.codes == bytes(bytearray((-200).to_bytes(4, "little", signed=True) * 2))
    t[0] += 2  # leases over
    st.put_start("c0", "e", 1000)
    st.put_end("c0", "e")
    assert len(st.objects) == 3 and "e" in st.objects
