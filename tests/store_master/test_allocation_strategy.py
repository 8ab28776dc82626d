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


def _shares(st: MasterState, n: int = 400, writer: str = "c0", prefix: str = "new") -> Counter[str]:
    got: Counter[str] = Counter()
    for i in range(n):
        [r] = st.put_start(writer, f"{prefix}{i}", 16 * 1024)
        st.put_end(writer, f"{prefix}{i}")
        got[r.segment_name] += 1
    return got


def test_default_random_gives_a_rejoined_node_its_share_not_every_put() -> None:
    assert MasterConfig().allocation_strategy == "random"  # the default, as in the original
    st = _pool("random")
    share = _shares(st)["10.0.0.3:12343"] / 400
    assert 0.15 <= share <= 0.40, share


def test_free_ratio_first_fills_the_emptiest_node() -> None:
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


@pytest.mark.parametrize("strategy", ["random", "free_ratio_first", "local_first"])
def test_avoided_segments_get_no_replica(strategy: str) -> None:
    """A writer's retry names the segments it could not reach: no replica goes there, for a
    single put, a batch or several replicas, whatever the strategy."""
    st = _pool(strategy)
    dead = "10.0.0.3:12343"  # the emptiest: free_ratio_first would put everything there
    avoid = ReplicateConfigMsg(avoid_segments=[dead])
    for i in range(100):
        [r] = st.put_start("c3", f"a{i}", 16 * 1024, avoid)
        assert r.segment_name != dead
    placed = st.batch_put_start("c3", [f"b{i}" for i in range(50)], [4096] * 50, avoid)
    assert placed.codes == bytes(4 * 50)
    assert dead not in placed.segments
    reps = st.put_start("c3", "three", 1024, ReplicateConfigMsg(replica_num=3, avoid_segments=[dead]))
    assert len({r.segment_name for r in reps}) == 3 and dead not in {r.segment_name for r in reps}
    # a preference for an avoided segment does not bring it back
    [r] = st.put_start("c3", "pref", 1024, ReplicateConfigMsg(preferred_segments=[dead], avoid_segments=[dead]))
    assert r.segment_name != dead


def test_a_put_that_fits_only_on_avoided_segments_fails_naming_them() -> None:
    """Never a fallback onto an avoided segment: -200 naming it (and one segment mounted is
    no shortcut around the check)."""
    from mooncake_core.errors import MooncakeError

    st = MasterState(MasterConfig(), clock=lambda: 100.0)
    st.mount_segment("c0", "h0:1", 1 << 32, 64 * MiB)
    with pytest.raises(MooncakeError, match="'h0:1', which the writer could not reach") as e:
        st.put_start("c0", "k", 1024, ReplicateConfigMsg(avoid_segments=["h0:1"]))
    assert e.value.code == -200 and "k" not in st.inflight
    placed = st.batch_put_start("c0", ["x", "y"], [10, 10], ReplicateConfigMsg(avoid_segments=["h0:1"]))
    assert placed.codes == bytes(bytearray((-200).to_bytes(4, "little", signed=True) * 2))
    st.mount_segment("c1", "h1:1", 2 << 32, 64 * MiB)
    [r] = st.put_start("c0", "k", 1024, ReplicateConfigMsg(avoid_segments=["h0:1"]))
    assert r.segment_name == "h1:1"


def test_avoid_segments_is_optional_on_the_wire() -> None:
    """An older peer's placement message (no avoid_segments) decodes, and ours decodes there."""
    import msgspec

    class Older(msgspec.Struct, array_like=True):  # the message before the field was added
        replica_num: int = 1
        soft_pin: bool = False
        soft_pin_ttl_ms: int | None = None
        with_hard_pin: bool = False
        preferred_segments: list[str] = msgspec.field(default_factory=list)
        group_ids: list[str] = msgspec.field(default_factory=list)

    new = msgspec.msgpack.decode(msgspec.msgpack.encode(Older(replica_num=2)), type=ReplicateConfigMsg)
    assert new.replica_num == 2 and new.avoid_segments == []
    old = msgspec.msgpack.decode(msgspec.msgpack.encode(ReplicateConfigMsg(3, avoid_segments=["s"])), type=Older)
    assert old.replica_num == 3


def test_a_segment_reported_unreachable_is_placed_last_until_its_owner_heartbeats() -> None:
    """One writer's retry marks the segment suspect: every writer's puts go elsewhere while
    they fit there, until the segment's owner heartbeats (it was alive after all); it still
    takes a put that fits nowhere else (placed last, not excluded), and its unmount forgets it."""
    st = _pool("random")
    dead = "10.0.0.3:12343"
    st.put_start("c1", "retry", 1024, ReplicateConfigMsg(avoid_segments=[dead]))
    assert dead not in _shares(st, 200)
    st.heartbeat("c2")  # another owner's heartbeat changes nothing
    assert dead not in _shares(st, 100, prefix="m")
    st.heartbeat("c3")
    assert _shares(st, 400, prefix="n")[dead] >= 40

    one = MasterState(MasterConfig(), clock=lambda: 100.0)
    one.mount_segment("c0", "h0:1", 1 << 32, 64 * MiB)
    one.mount_segment("c1", "h1:1", 2 << 32, MiB)
    one.put_start("c0", "r", 1024, ReplicateConfigMsg(avoid_segments=["h0:1"]))
    [r] = one.put_start("c1", "big", 2 * MiB)  # fits only on the suspect segment
    assert r.segment_name == "h0:1" and one.suspect == {"h0:1"}
    one.unmount_segment("c0", "h0:1")
    assert one.suspect == set()
