"""``ReplicateConfig.group_ids`` in the master's pure state: a group's members are leased
together and evicted all or nothing; a put without a group takes a key out of its group."""

from __future__ import annotations

import pytest

from mooncake_core.errors import MooncakeError
from mooncake_core.store.master_records import MasterConfig
from mooncake_core.store.master_state import MasterState
from mooncake_core.store.packing import I64, unpack
from mooncake_core.store.protocol import ReplicateConfigMsg

KiB = 1 << 10


def _state() -> tuple[MasterState, list[float]]:
    t = [100.0]
    st = MasterState(MasterConfig(default_kv_lease_ttl_ms=1000, eviction_ratio=0.01), clock=lambda: t[0])
    st.mount_segment("c0", "s0", 1 << 32, 100 * KiB)
    return st, t


def _put(st: MasterState, keys: list[str], groups: list[str] | None = None, size: int = 10 * KiB) -> None:
    cfg = ReplicateConfigMsg(group_ids=groups or [])
    if len(keys) == 1:
        st.put_start("c0", keys[0], size, cfg)
        st.put_end("c0", keys[0])
        return
    st.batch_put_start("c0", keys, [size] * len(keys), cfg)
    assert all(v > 0 for v in unpack(I64, st.batch_put_end("c0", keys), len(keys), "v"))


def test_a_read_of_one_member_leases_the_group() -> None:
    st, t = _state()
    _put(st, ["a", "b", "c"], ["g1", "g1", "g2"])
    _put(st, ["d"], ["g1"])
    st.get_replica_list("a")
    assert {k: st.objects[k].lease > t[0] for k in "abcd"} == {"a": True, "b": True, "c": False, "d": True}
    with pytest.raises(MooncakeError) as e:
        st.remove("d")  # leased through its group
    assert e.value.code == -706


def test_a_group_is_evicted_all_or_nothing() -> None:
    st, t = _state()
    _put(st, ["a", "b"], ["g"])  # least recently used first
    _put(st, ["x", "y"])
    st.get_replica_list("y")
    t[0] += 5  # leases over
    st.get_replica_list("b")  # b (so a) leased again
    st.tier.evict(5 * KiB, t[0])
    assert sorted(st.objects) == ["a", "b", "y"]  # x went; the group stayed whole, though oldest
    t[0] += 5
    st.tier.evict(5 * KiB, t[0])
    assert sorted(st.objects) == ["y"]  # a is the oldest now: both members went at once


def test_membership_follows_the_latest_put_and_bad_ids_are_refused() -> None:
    st, t = _state()
    _put(st, ["a"], ["g"])
    _put(st, ["b"], ["g"])
    st.remove("a")
    assert "a" not in st.groups.of and st.groups.members["g"] == {"b"}  # the tables follow the objects
    st.put_start("c0", "a", 10 * KiB, ReplicateConfigMsg())  # a again, in no group
    st.put_end("c0", "a")
    st.get_replica_list("b")
    assert st.objects["a"].lease == 0
    _put(st, ["p", "q"], ["one"])  # one id for every key of a batch
    assert st.groups.of["p"] == st.groups.of["q"] == "one"
    with pytest.raises(MooncakeError, match="group_ids") as e:
        st.batch_put_start("c0", ["r", "s", "u"], [KiB] * 3, ReplicateConfigMsg(group_ids=["x", "y"]))
    assert e.value.code == -600
