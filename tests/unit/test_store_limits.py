"""Store master request limits (pure): keys per batch, bytes per value."""

from __future__ import annotations

import pytest

from mooncake_core.store import protocol as P
from mooncake_core.store.limits import RequestLimits
from mooncake_core.store.packing import U64, pack

CFG = P.ReplicateConfigMsg()


def test_within_limits() -> None:
    lim = RequestLimits(max_batch_keys=3, max_value_size=100)
    for req in (P.PingReq(), P.PutStartReq("c", "k", 100, CFG), P.BatchExistKeyReq(["a", "b", "c"]),
                P.BatchPutStartReq("c", ["a", "b"], pack(U64, [1, 100]), CFG), P.GetReplicaListReq("k")):
        assert lim.check(req) is None


def test_too_many_keys_names_the_limit() -> None:
    msg = RequestLimits(max_batch_keys=2).check(P.BatchRemoveReq(["a", "b", "c"]))
    assert msg and "3 keys" in msg and "--max_batch_keys" in msg and "2" in msg


def test_value_too_big_names_key_and_limit() -> None:
    lim = RequestLimits(max_value_size=100)
    msg = lim.check(P.UpsertStartReq("c", "big", 101, CFG))
    assert msg and "'big'" in msg and "101 bytes" in msg and "--max_value_size" in msg
    msg = lim.check(P.BatchPutStartReq("c", ["a", "b"], pack(U64, [1, 500]), CFG))
    assert msg and "'b'" in msg and "500 bytes" in msg
    assert RequestLimits().check(P.PutStartReq("c", "k", 1 << 50, CFG)) is None  # 0 = no size limit


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_batch_keys"):
        RequestLimits(max_batch_keys=0)
    with pytest.raises(ValueError, match="max_value_size"):
        RequestLimits(max_value_size=-1)
