"""The master's packed batch operations (pure state, fake clock): per-key codes, replicas
deduplicated per segment, leases per object -- the same answers as the single calls."""

from __future__ import annotations

import pytest

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store.master_records import MasterConfig
from mooncake_core.store.master_state import MasterState
from mooncake_core.store.packing import I64, U64, expand_gets, expand_placements, pack, unpack
from mooncake_core.store.protocol import Placements, ReplicateConfigMsg


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _state() -> tuple[MasterState, Clock]:
    clk = Clock()
    st = MasterState(MasterConfig(default_kv_lease_ttl_ms=1000), clock=clk)
    st.mount_segment("cA", "A:1", 1 << 30, 1 << 20)
    st.mount_segment("cB", "B:1", 1 << 31, 1 << 20)
    return st, clk


def test_put_start_codes_per_key_and_segments_deduplicated() -> None:
    st, _ = _state()
    st.put_start("cA", "done", 10)
    st.put_end("cA", "done")
    st.put_start("cA", "inflight", 10)
    keys = ["a", "done", "inflight", "huge", "b", "", "c"]
    sizes = [100, 10, 10, 2 << 20, 200, 5, 300]
    pl = st.batch_put_start("cX", keys, sizes, ReplicateConfigMsg(replica_num=2))
    assert isinstance(pl, Placements) and sorted(pl.segments) == ["A:1", "B:1"]
    got = expand_placements(pl, sizes)
    assert got[1] == got[2] == ErrorCode.OBJECT_ALREADY_EXISTS
    assert got[3] == got[5] == ErrorCode.INVALID_PARAMS
    for i in (0, 4, 6):
        reps = got[i]
        assert isinstance(reps, list) and {r.segment_name for r in reps} == {"A:1", "B:1"}
        assert all(r.size == sizes[i] and r.status == "processing" for r in reps)
    # put_end per key: versions increase, unknown keys get their code, a second end is 0
    vers = unpack(I64, st.batch_put_end("cX", ["a", "nope", "b", "a"]), 4, "versions")
    assert vers[0] > 0 and vers[2] > vers[0] and vers[1] == ErrorCode.OBJECT_NOT_FOUND and vers[3] == 0
    assert unpack(I64, st.batch_put_revoke("cX", ["c", "c"]), 2, "revoke") == [0, ErrorCode.OBJECT_NOT_FOUND]


def test_get_lists_lease_each_found_object() -> None:
    st, clk = _state()
    for k in ("x", "y"):
        st.put_start("cA", k, 64)
        st.put_end("cA", k)
    reply = st.batch_get_replica_list(["x", "missing", "y", ""])
    got = expand_gets(reply, 4)
    assert got[1] == ErrorCode.OBJECT_NOT_FOUND and got[3] == ErrorCode.INVALID_PARAMS
    for g in (got[0], got[2]):
        assert not isinstance(g, int) and g.lease_ttl_ms == 1000 and g.epoch == st.epoch
        assert len(g.replicas) == 1 and g.replicas[0].size == 64
    assert len(set(reply.segments)) == len(reply.segments)  # each segment named once
    with pytest.raises(MooncakeError) as e:
        st.remove("x")
    assert e.value.code == ErrorCode.OBJECT_HAS_LEASE
    clk.t += 1.5
    st.remove("x")  # the lease has run out
    assert st.stats.misses == 1 and st.stats.hits == 2


def test_packed_arrays_are_checked() -> None:
    with pytest.raises(MooncakeError) as e:
        unpack(U64, b"\x00" * 7, None, "sizes")
    assert e.value.code == ErrorCode.INVALID_PARAMS and "7 bytes" in str(e.value)
    with pytest.raises(MooncakeError, match="2 items for 3 keys"):
        unpack(U64, pack(U64, [1, 2]), 3, "sizes")
    with pytest.raises(MooncakeError, match="expected packed bytes"):
        unpack(U64, [1, 2], 2, "sizes")
    with pytest.raises(MooncakeError, match="do not match"):
        expand_placements(Placements(pack("i", [0]), bytes([2]), ["A"], pack("I", [0]), pack("Q", [5])), [1])
