"""The rest of upstream's store API: tensor ``_into``/``_from``, TP variants, ranged reads,
put/get sessions, ``batch_replica_clear`` and ``put_from_with_metadata``.

Pure planning logic is unit-tested first (no sockets). The integration tests run a real
``mooncake_master`` process, a worker process with its own segment, a client in this process
with a segment (own-segment memcpy path) and one without (pool only: every byte crosses the
transfer engine). Data is random; results are compared byte for byte / with ``torch.equal``,
and the worker process re-reads objects to check the stored bytes across processes.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from mooncake_core.store import ReplicateConfig
from mooncake_core.store import tensor as T
from mooncake_core.store.range_plan import (
    Coverage,
    plan_get_into_ranges,
    plan_key_ranges,
)
from mooncake_core.store.tensor_layout import AxisTag, ShardLayout
from mooncake_core.store.sharding import (
    ShardError,
    shard_bounds,
    tp_key_name,
    uniform_shard_check,
)

from mooncake_lab.store_procs import payload, sha

MiB = 1 << 20
INVALID, EXISTS, MISSING = -600, -705, -704


# ============================================================================ pure logic
def test_sharding_rules() -> None:
    assert tp_key_name("w", 3) == "w_tp_3"
    assert uniform_shard_check((8, 6), 1, 3) == 2
    assert shard_bounds((8, 6), 0, 4) == [(0, 2), (2, 2), (4, 2), (6, 2)]
    for shape, dim, n, msg in [((5, 2), 0, 2, "uniform"), ((8, 6), -1, 2, "out of range"),
                               ((8, 6), 2, 2, "out of range"), ((8,), 0, 0, "tp_size")]:
        with pytest.raises(ShardError, match=msg):
            uniform_shard_check(shape, dim, n)


def test_plan_get_into_ranges_shapes_and_bounds() -> None:
    warnings: list[str] = []
    caps = {1000: 64, 2000: 16}
    res, frags = plan_get_into_ranges([1000, 2000], [["a", "b"], ["b"]], [[[0, 20], [8]], [[4]]],
                                      [[[1, 30], [2]], [[0]]], [[[4, 3], [5]], [[20]]], caps.get,
                                      warnings.append)
    # buffer 1's fragment (4 + 20 > 16) overflows; the others are planned
    assert res == [[[0, 0], [0]], [[INVALID]]]
    assert [(f.key, f.addr, f.obj_off, f.size, f.slot) for f in frags] == [
        ("a", 1000, 1, 4, (0, 0, 0)), ("a", 1020, 30, 3, (0, 0, 1)), ("b", 1008, 2, 5, (0, 1, 0))]
    assert any("overflows" in w for w in warnings)
    # top-level mismatch, per-key fragment mismatch, unregistered buffer
    res, frags = plan_get_into_ranges([1000, 1000], [["a"]], [[[0]]], [[[0]]], [[[1]]], caps.get, warnings.append)
    assert res == [[[INVALID]], [[INVALID]]] and not frags
    res, frags = plan_get_into_ranges([1000], [["a"]], [[[0, 4]]], [[[0]]], [[[1]]], caps.get, warnings.append)
    assert res == [[[INVALID, INVALID]]] and not frags
    res, frags = plan_get_into_ranges([7], [["a"]], [[[0]]], [[[0]]], [[[1]]], caps.get, warnings.append)
    assert res == [[[INVALID]]] and any("not registered" in w for w in warnings)
    assert plan_get_into_ranges([], [], [], [], [], caps.get, warnings.append) == ([], [])
    with pytest.raises(TypeError, match=r"all_keys\[0\]"):
        plan_get_into_ranges([1000], [[5]], [[[0]]], [[[0]]], [[[1]]], caps.get, warnings.append)
    with pytest.raises(TypeError, match="all_sizes"):
        plan_get_into_ranges([1000], [["a"]], [[[0]]], [[[0]]], [[["1"]]], caps.get, warnings.append)


def test_plan_key_ranges_and_coverage() -> None:
    w: list[str] = []
    res, plans = plan_key_ranges("op", ["a", "b", "c"], [[10, 20], [30], [0]], [[1, 2], [3, 4], [1]],
                                 [[0, 1], [5], [0]], w.append)
    assert res == [0, INVALID, INVALID] and [p.key for p in plans] == ["a"]
    assert [(f.addr, f.size, f.obj_off, f.slot) for f in plans[0].frags] == [(10, 1, 0, (0, 0)), (20, 2, 1, (0, 1))]
    assert plan_key_ranges("op", ["a"], [[1], [2]], [[1]], [[0]], w.append) == ([INVALID], [])
    c = Coverage()
    c.add(10, 5)
    c.add(0, 4)
    assert not c.complete(15) and c.covered() == 9
    c.add(4, 6)
    assert c.complete(15) and not c.complete(16)
    assert Coverage().complete(0)


# ============================================================================ helpers
def _tensor(seed: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    if dtype == torch.bool:
        return torch.from_numpy(rng.integers(0, 2, shape).astype(np.bool_))
    if dtype.is_floating_point:
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32) + 1.5).to(dtype)
    return torch.from_numpy(rng.integers(1, 1 << 30, shape)).to(dtype)


def _object_bytes(t: torch.Tensor, layout=None) -> bytes:
    """The exact stored form of ``t`` (header + elements; a shard's header carries ``layout``)."""
    header, view, _ = T.tensor_payload(t, layout)
    return header + bytes(view)


class Buf:
    """A registered, randomly pre-filled numpy buffer."""

    def __init__(self, store, size: int, seed: int = 99):
        self.arr = np.frombuffer(bytearray(payload(seed, size)), dtype=np.uint8)
        self.ptr = int(self.arr.ctypes.data)
        self.size = size
        assert store.register_buffer(self.ptr, size) == 0

    def bytes(self, off: int, n: int) -> bytes:
        return self.arr[off:off + n].tobytes()


# ============================================================================ tensors
@pytest.mark.integration
@pytest.mark.timeout(120)
def test_tensor_into_and_from(cluster) -> None:
    _, w, c, d = cluster
    buf = Buf(c, 1 * MiB)
    x = _tensor(1, (64, 33))
    assert c.put_tensor("x", x) == 0
    # the stored bytes, seen by another process, are exactly header + elements
    assert w.cmd(op="get", key="x") == {"len": len(_object_bytes(x)), "sha": sha(_object_bytes(x))}

    y = c.get_tensor_into("x", buf.ptr, buf.size)
    assert torch.equal(y, x) and y.dtype == x.dtype
    assert buf.ptr <= y.data_ptr() < buf.ptr + buf.size  # aliases the caller's buffer: no copy
    assert c.get_tensor_into("missing", buf.ptr, buf.size) is None
    assert c.get_tensor_into("x", buf.ptr, 100) is None  # buffer too small
    assert c.put("raw", payload(5, 4000)) == 0
    assert c.get_tensor_into("raw", buf.ptr, buf.size) is None  # not a tensor object

    # batch into, several dtypes and shapes (0-d, empty, bool, bf16, int64) from both clients
    ts = [_tensor(2, (7, 5), torch.bfloat16), _tensor(3, (3, 4, 2), torch.int64), _tensor(4, (9,), torch.bool),
          torch.tensor(3.25, dtype=torch.float64), torch.empty((0, 4), dtype=torch.int32)]
    keys = [f"bt{i}" for i in range(len(ts))]
    assert d.batch_put_tensor(keys, ts) == [0] * len(ts)
    step = 64 * 1024
    got = c.batch_get_tensor_into(keys + ["missing"], [buf.ptr + i * step for i in range(len(ts) + 1)],
                                  [step] * (len(ts) + 1))
    assert got[-1] is None
    for t, g in zip(ts, got):
        assert g.dtype == t.dtype and g.shape == t.shape and torch.equal(g, t)

    # put_tensor_from: the serialized object get_tensor_into left in the buffer, stored again
    n = c.get_size("x")
    assert c.get_tensor_into("x", buf.ptr, buf.size) is not None
    assert c.put_tensor_from("x2", buf.ptr, buf.size) == 0  # larger buffer: only the object is stored
    assert c.get_size("x2") == n and torch.equal(d.get_tensor("x2"), x)
    assert w.cmd(op="get", key="x2")["sha"] == sha(_object_bytes(x))
    junk = Buf(c, 4096, seed=7)
    assert c.put_tensor_from("bad", junk.ptr, junk.size) == INVALID and c.is_exist("bad") == 0
    assert c.put_tensor_from("short", buf.ptr, n - 1) == INVALID and c.is_exist("short") == 0
    # one invalid buffer fails the whole batch (as upstream), nothing is stored
    assert c.batch_put_tensor_from(["b1", "b2"], [buf.ptr, junk.ptr], [n, 4096]) == [INVALID, INVALID]
    assert c.batch_is_exist(["b1", "b2"]) == [0, 0]
    assert c.batch_put_tensor_from(["b1", "b2"], [buf.ptr, buf.ptr], [n, n]) == [0, 0]
    assert torch.equal(c.get_tensor("b2"), x)

    # upserts replace; plain puts keep the old value
    z = _tensor(9, (64, 33))
    assert d.put_tensor("x3", z) == 0 and d.get_tensor_into("x3", buf.ptr, buf.size) is not None
    assert c.upsert_tensor_from("x2", buf.ptr, n) == 0 and torch.equal(c.get_tensor("x2"), z)
    assert c.batch_upsert_tensor_from(["b1", "b2"], [buf.ptr, buf.ptr], [n, n]) == [0, 0]
    assert torch.equal(c.get_tensor("b1"), z)
    u = [_tensor(10, (4, 4)), _tensor(11, (2,), torch.float16)]
    assert c.batch_upsert_tensor(["b1", "new"], u) == [0, 0]
    assert torch.equal(c.get_tensor("b1"), u[0]) and torch.equal(c.get_tensor("new"), u[1])
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    assert c.batch_upsert_pub_tensor(["two"], [x], cfg) == [0]
    assert len(c.get_replica_desc("two")) == 2 and torch.equal(c.get_tensor("two"), x)

    # argument errors are clear exceptions -- except where the original answers with codes: a
    # batch_get_tensor_into with lists of different lengths gets -600 (INVALID_PARAMS) per key
    assert c.batch_get_tensor_into(["a", "b"], [buf.ptr], [10]) == [-600, -600]
    with pytest.raises(TypeError, match="key must be str"):
        c.put_tensor_from(5, buf.ptr, n)
    with pytest.raises(ValueError, match="2 keys but 1 tensors"):
        c.batch_upsert_tensor(["a", "b"], [x])
    with pytest.raises(TypeError, match="torch.Tensor"):
        c.batch_upsert_tensor(["a"], [b"not a tensor"])
    with pytest.raises(ValueError, match="duplicate"):
        c.batch_upsert_tensor(["a", "a"], [x, x])


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_tensor_parallel_variants(cluster) -> None:
    _, w, c, d = cluster
    buf = Buf(c, 1 * MiB)
    x = _tensor(20, (8, 6))
    assert c.pub_tensor_with_tp("p", x, None, 0, 3, 1) == 0  # every rank's shard is stored
    assert c.batch_is_exist(["p", "p_tp_0", "p_tp_1", "p_tp_2", "p_tp_3"]) == [0, 1, 1, 1, 0]
    for r in range(3):
        assert torch.equal(d.get_tensor_with_tp("p", tp_rank=r, tp_size=3), x[:, 2 * r:2 * r + 2])
        g = c.get_tensor_with_tp_into("p", buf.ptr, buf.size, tp_rank=r, tp_size=3, split_dim=1)
        assert torch.equal(g, x[:, 2 * r:2 * r + 2])
    shard = x[:, 2:4].contiguous()
    layout = ShardLayout((8, 6), (AxisTag("tp", 1, 3, 1),))  # what the shard holds of which tensor
    assert w.cmd(op="get", key="p_tp_1")["sha"] == sha(_object_bytes(shard, layout))
    # uneven split / bad split_dim: -600 and nothing stored (upstream's rule)
    assert c.pub_tensor_with_tp("u", _tensor(21, (5, 2)), tp_size=2) == INVALID
    assert c.pub_tensor_with_tp("neg2", x, tp_size=2, split_dim=-1) == INVALID
    assert c.batch_is_exist(["u_tp_0", "neg2_tp_0"]) == [0, 0]

    a, b = _tensor(22, (4, 8), torch.int32), _tensor(23, (6, 3))
    # b's dim 1 (3) does not split in 2: only that tensor fails
    assert c.batch_put_tensor_with_tp(["ba", "bb"], [a, b], tp_size=2, split_dim=1) == [0, INVALID]
    assert c.batch_put_tensor_with_tp(["bb"], [b], tp_size=2) == [0]  # split_dim 0: 6 rows
    got = d.batch_get_tensor_with_tp(["ba", "bb", "nope"], tp_rank=1, tp_size=2)
    assert torch.equal(got[0], a[:, 4:]) and torch.equal(got[1], b[3:]) and got[2] is None
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    assert c.batch_pub_tensor_with_tp(["bc"], [a], cfg, tp_size=4) == [0]
    assert len(c.get_replica_desc("bc_tp_3")) == 2
    assert torch.equal(c.batch_get_tensor_with_tp(["bc"], tp_rank=3, tp_size=4)[0], a[3:])
    # tp_size 1: the plain key
    assert c.pub_tensor_with_tp("one", a, tp_size=1) == 0 and torch.equal(c.get_tensor_with_tp("one"), a)

    # _from: a full tensor held serialized in a buffer, split into shards
    assert c.get_tensor_into("bb_tp_0", buf.ptr, buf.size) is not None  # a (3, 3) float tensor object
    n = c.get_size("bb_tp_0")
    assert c.put_tensor_with_tp_from("f", buf.ptr, n, tp_size=3, split_dim=1) == 0
    for r in range(3):
        assert torch.equal(c.get_tensor(f"f_tp_{r}"), b[:3, r:r + 1])
    junk = Buf(c, 256, seed=3)
    assert c.batch_put_tensor_with_tp_from(["g", "h"], [buf.ptr, junk.ptr], [n, 256], tp_size=3,
                                           split_dim=0) == [0, INVALID]
    step = 4096
    got = c.batch_get_tensor_with_tp_into(["g", "h"], [buf.ptr + 8 * step, buf.ptr + 9 * step], [step, step],
                                          tp_rank=2, tp_size=3)
    assert torch.equal(got[0], b[2:3]) and got[1] is None
    assert c.put_tensor_with_tp_from("k1", buf.ptr, n, tp_size=1) == 0 and torch.equal(c.get_tensor("k1"), b[:3])
    with pytest.raises(TypeError, match="tp_rank"):
        c.get_tensor_with_tp_into("p", buf.ptr, buf.size, tp_rank="1", tp_size=3)


# ============================================================================ ranges & sessions
@pytest.mark.integration
@pytest.mark.timeout(120)
def test_get_into_ranges_and_get_sessions(cluster) -> None:
    _, w, c, d = cluster
    k1 = payload(31, 300_000)
    assert w.cmd(op="put", key="k1", seed=31, size=300_000, preferred=w.hostname)["rc"] == 0  # remote for c, d
    k2 = payload(32, 5000)
    cfg = ReplicateConfig()
    cfg.preferred_segment = d.get_hostname()
    assert d.put("k2", k2, cfg) == 0  # in d's own segment: a memcpy for d
    alive = []  # registered buffers must outlive the test: freed memory could be reused by a later Buf
    for s in (c, d):
        b0, b1 = Buf(s, 200_000, seed=1), Buf(s, 64, seed=2)
        alive.append((b0, b1))
        before1 = b1.bytes(0, 64)
        res = s.get_into_ranges([b0.ptr, b1.ptr], [["k1", "k2"], ["k2", "k1"]],
                                [[[0, 100_000], [150_000]], [[4], [16]]],
                                [[[1, 250_000], [2]], [[0], [10]]],
                                [[[4, 50_000], [1000]], [[6], [4]]])
        assert res == [[[4, 50_000], [1000]], [[6], [4]]]
        assert b0.bytes(0, 4) == k1[1:5] and b0.bytes(100_000, 50_000) == k1[250_000:300_000]
        assert b0.bytes(150_000, 1000) == k2[2:1002]
        assert b1.bytes(4, 6) == k2[0:6] and b1.bytes(16, 4) == k1[10:14]
        assert b1.bytes(0, 4) == before1[:4] and b1.bytes(10, 6) == before1[10:16]  # untouched elsewhere

    # per-fragment failures leave the neighbours intact
    b = Buf(c, 4096)
    res = c.get_into_ranges([b.ptr], [["k1", "missing", "k2"]], [[[0, 100], [200], [300]]],
                            [[[0, 299_990], [0], [4990]]], [[[50, 20], [10], [10]]])
    assert res == [[[50, INVALID], [MISSING], [10]]]
    assert b.bytes(0, 50) == k1[:50] and b.bytes(300, 10) == k2[4990:5000]
    assert c.get_into_ranges([b.ptr], [["k1"]], [[[4090]]], [[[0]]], [[[10]]]) == [[[INVALID]]]  # dst overflow
    unreg = np.zeros(64, dtype=np.uint8)
    assert c.get_into_ranges([int(unreg.ctypes.data)], [["k1"]], [[[0]]], [[[0]]], [[[8]]]) == [[[INVALID]]]
    assert not unreg.any()
    assert c.get_into_ranges([b.ptr, b.ptr], [["k1"]], [[[0]]], [[[0]]], [[[8]]]) == [[[INVALID]], [[INVALID]]]
    assert c.get_into_ranges([b.ptr], [["k1"]], [[[0, 4]]], [[[0]]], [[[8]]]) == [[[INVALID, INVALID]]]
    assert c.get_into_ranges([b.ptr], [["k1"]], [[[0]]], [[[0]]], [[[0]]]) == [[[0]]]
    assert c.get_into_ranges([], [], [], [], []) == []
    with pytest.raises(TypeError, match="key must be str"):
        c.get_into_ranges([b.ptr], [[7]], [[[0]]], [[[0]]], [[[8]]])

    # key-major multi-buffer ranged get, inside a get session and without one
    assert c.batch_get_session_start(["k1", "k2", "missing"]) == [0, 0, MISSING]
    x = Buf(c, 100_000, seed=5)
    res = c.batch_get_into_multi_buffer_ranges(["k1", "k2"], [[x.ptr, x.ptr + 50_000], [x.ptr + 90_000]],
                                               [[30_000, 20_000], [4000]], [[5, 280_000], [1000]])
    assert res == [50_000, 4000]
    assert x.bytes(0, 30_000) == k1[5:30_005] and x.bytes(50_000, 20_000) == k1[280_000:300_000]
    assert x.bytes(90_000, 4000) == k2[1000:5000]
    time.sleep(1.7)  # past the 1.5 s lease: the session's cached replica list is re-fetched, not trusted
    assert c.batch_get_into_multi_buffer_ranges(["k2"], [[x.ptr]], [[5000]], [[0]]) == [5000]
    assert x.bytes(0, 5000) == k2
    assert c.batch_get_session_end(["k1", "k2", "missing"]) == 0
    assert c.batch_get_into_multi_buffer_ranges(["k1", "missing", "k2"], [[x.ptr], [x.ptr + 10], [x.ptr + 20]],
                                                [[8], [8], [4991]], [[0], [0], [10]]) == [8, MISSING, INVALID]
    assert c.batch_get_into_multi_buffer_ranges(["k1"], [[x.ptr], [x.ptr]], [[8]], [[0]]) == [INVALID]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_put_sessions_and_misc(cluster, monkeypatch) -> None:
    m, w, c, d = cluster
    data_a, data_b = payload(41, 200_000), payload(42, 3000)
    src = np.frombuffer(bytearray(data_a + data_b), dtype=np.uint8)
    p = int(src.ctypes.data)
    assert c.put("exists", b"old value") == 0
    assert c.batch_put_session_start(["sa", "sb", "exists", "sa"], [200_000, 3000, 9, 5]) == [0, 0, EXISTS, EXISTS]
    # written in pieces, out of order, from several buffers; invisible until the session ends
    res = c.batch_put_from_multi_buffer_ranges(["sa", "sb"], [[p + 150_000, p], [p + 200_000]],
                                               [[50_000, 100_000], [1000]], [[150_000, 0], [0]])
    assert res == [150_000, 1000]
    assert c.batch_is_exist(["sa", "sb"]) == [0, 0] and c.get("sa") == b""
    assert c.batch_put_session_end(["sa"]) == [INVALID]  # bytes [100000, 150000) not written yet
    assert d.batch_put_from_multi_buffer_ranges(["sa"], [[p]], [[8]], [[0]]) == [INVALID]  # d has no session
    assert c.batch_put_from_multi_buffer_ranges(["sb"], [[p]], [[3001]], [[0]]) == [INVALID]  # past the end
    assert c.batch_put_from_multi_buffer_ranges(["sa", "sb"], [[p + 100_000], [p + 201_000]],
                                                [[50_000], [2000]], [[100_000], [1000]]) == [50_000, 2000]
    assert c.batch_put_session_end(["sa", "sb", "never"]) == [0, 0, INVALID]
    assert c.get("sa") == data_a and d.get("sb") == data_b
    assert w.cmd(op="get", key="sa") == {"len": len(data_a), "sha": sha(data_a)}
    assert c.batch_put_session_end(["sa"]) == [INVALID]  # already ended
    assert c.get("exists") == b"old value"
    # revoke frees the reservation; the key can be put again
    assert c.batch_put_session_start(["sr"], [64]) == [0]
    assert c.batch_put_session_revoke(["sr", "nosuch"]) == [0, INVALID]
    assert c.is_exist("sr") == 0 and c.put("sr", b"after revoke") == 0 and c.get("sr") == b"after revoke"
    assert c.batch_put_session_start(["x"], [1, 2]) == [INVALID]

    # a session on d's own segment (memcpy writes); a session too old to write to is refused
    cfg = ReplicateConfig()
    cfg.preferred_segment = d.get_hostname()
    assert d.batch_put_session_start(["own"], [3000], cfg) == [0]
    assert d.batch_put_from_multi_buffer_ranges(["own"], [[p + 200_000]], [[3000]], [[0]]) == [3000]
    assert d.batch_put_session_end(["own"]) == [0]
    assert [r.segment_name for r in c.get_replica_desc("own")] == [d.get_hostname()]
    assert w.cmd(op="get", key="own")["sha"] == sha(data_b)
    assert d.batch_put_session_start(["old"], [8]) == [0]
    monkeypatch.setenv("MC_STORE_PUT_SESSION_MAX_S", "0.2")  # read at call time
    time.sleep(0.3)
    assert d.batch_put_from_multi_buffer_ranges(["old"], [[p]], [[8]], [[0]]) == [INVALID]
    assert d.batch_put_session_revoke(["old"]) == [0] and d.is_exist("old") == 0
    # sessions do not survive close() + setup(): the old reservation may be someone else's now
    assert c.batch_put_session_start(["gone"], [8]) == [0]
    assert c.close() == 0
    assert c.setup({"local_hostname": "127.0.0.1", "metadata_server": m.meta, "global_segment_size": 0,
                    "local_buffer_size": 16 << 20, "protocol": "tcp", "master_server_addr": m.addr}) == 0
    assert c.batch_put_from_multi_buffer_ranges(["gone"], [[p]], [[8]], [[0]]) == [INVALID]
    assert c.batch_put_session_end(["gone"]) == [INVALID]

    # put_from_with_metadata: one object = metadata then data, both from their own buffers
    meta = np.frombuffer(bytearray(payload(43, 96)), dtype=np.uint8)
    assert c.put_from_with_metadata("m", p, int(meta.ctypes.data), 5000, 96) == 0
    assert w.cmd(op="get", key="m") == {"len": 5096, "sha": sha(meta.tobytes() + data_a[:5000])}
    with pytest.raises(TypeError, match="metadata_buffer_ptr"):
        c.put_from_with_metadata("m2", p, "0x1", 10, 10)

    # batch_replica_clear: only objects whose read lease has expired (1.5 s here)
    assert c.put("fresh", b"f" * 100) == 0 and c.put("leased", b"l" * 100) == 0
    assert c.get("leased") == b"l" * 100
    assert c.batch_replica_clear(["fresh", "leased", "missing"]) == ["fresh"]
    assert c.batch_is_exist(["fresh", "leased"]) == [0, 1]
    assert c.put("two", b"2" * 100, _replicas(2)) == 0
    time.sleep(1.7)
    # one segment: a segment holding no replica clears nothing; the object keeps its other replica
    where = [r.segment_name for r in c.get_replica_desc("two")]
    assert sorted(where) == sorted([w.hostname, d.get_hostname()])
    assert c.batch_replica_clear(["leased"], "nosuch:1") == []
    time.sleep(1.7)
    assert c.batch_replica_clear(["two"], where[0]) == ["two"]
    assert [r.segment_name for r in c.get_replica_desc("two")] == [where[1]] and c.get("two") == b"2" * 100
    assert c.batch_replica_clear(["leased"]) == ["leased"] and c.is_exist("leased") == 0


def _replicas(n: int) -> ReplicateConfig:
    cfg = ReplicateConfig()
    cfg.replica_num = n
    return cfg


# ============================================================================ unified parallelism API
def _axis(kind: str, rank: int, size: int, **kw):
    from mooncake_core.store import ParallelAxis

    a = ParallelAxis()
    a.kind, a.rank, a.size = kind, rank, size
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def _par(*axes):
    from mooncake_core.store import TensorParallelism

    p = TensorParallelism()
    p.axes = list(axes)
    return p


def test_parallelism_keys_and_validation() -> None:
    from mooncake_core.store.parallelism import (
        ParallelismError,
        parallelism_key,
        parse_writer_partition,
        validate_axes,
        writer_shard_key,
    )

    tp = _axis("TP", 1, 4, split_dim=1)
    assert parallelism_key("w", validate_axes(_par(tp), "t")) == "w_tp_1"  # legacy TP name
    axes = validate_axes(_par(_axis("pp", 0, 2, stage_id=0), tp, _axis("dp", 3, 8)), "t")
    assert parallelism_key("w", axes) == "w__dp_3of8__tp_1of4_sd1__pp_0of2_sid0"  # canonical order
    assert parallelism_key("w", validate_axes(_par(_axis("ep", 2, 4, expert_id=7)), "t")) == "w__ep_2of4_eid7"
    for bad, msg in [(_par(), "empty"), (_par(_axis("xx", 0, 1)), "unsupported axis kind"),
                     (_par(_axis("tp", 0, 2)), "requires split_dim"), (_par(_axis("tp", 2, 2, split_dim=0)), "rank"),
                     (_par(_axis("dp", 0, 2, split_dim=0)), "must not provide split_dim"),
                     (_par(_axis("ep", 0, 2)), "expert_id"), (_par(tp, tp), "duplicate")]:
        with pytest.raises(ParallelismError, match=msg):
            validate_axes(bad, "t")
    with pytest.raises(TypeError, match="TensorParallelism"):
        validate_axes([tp], "t")
    w = parse_writer_partition({"rank": 1, "size": 2, "split_dim": 0}, "t")
    assert writer_shard_key("k", w) == "k__writer_1of2_sd0"
    with pytest.raises(ParallelismError, match="rank, size, and split_dim"):
        parse_writer_partition((1, 2, 0), "t")


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_tensor_with_parallelism(cluster) -> None:
    from mooncake_core.store import ReadTarget

    _, w, c, d = cluster
    x = _tensor(50, (8, 6))
    buf = Buf(c, 64 * 1024)
    # no parallelism: the full tensor at the key; as_stored reads it back
    assert c.put_tensor_with_parallelism("full", x) == 0
    assert torch.equal(d.get_tensor_with_parallelism("full"), x)
    # shard mode sliced out of the full object; full mode from TP shards (single TP axis: shard input)
    shard = ReadTarget()
    shard.mode, shard.parallelism = "shard", _par(_axis("tp", 1, 2, split_dim=1))
    assert torch.equal(d.get_tensor_with_parallelism("full", shard), x[:, 3:])
    for r in range(2):
        assert c.put_tensor_with_parallelism("s", x[:, 3 * r:3 * r + 3], _par(_axis("tp", r, 2, split_dim=1))) == 0
    assert torch.equal(c.get_tensor_with_tp("s", tp_rank=1, tp_size=2), x[:, 3:])  # shared with *_with_tp
    full = ReadTarget()
    full.mode, full.parallelism = "full", _par(_axis("tp", 0, 2, split_dim=1))
    assert torch.equal(d.get_tensor_with_parallelism("s", full), x)
    g = d.get_tensor_with_parallelism_into("s", buf.ptr, buf.size, full)  # assembled, copied into the buffer
    assert torch.equal(g, x) and buf.ptr <= g.data_ptr() < buf.ptr + buf.size
    g = d.get_tensor_with_parallelism_into("s", buf.ptr, buf.size, shard)  # a stored shard: read straight in
    assert torch.equal(g, x[:, 3:])
    # multi-axis layout with TP: the writer passes the full tensor, the TP rank's slice is stored
    dp_tp = _par(_axis("dp", 1, 2), _axis("tp", 0, 2, split_dim=0))
    assert c.put_tensor_with_parallelism("m", x, dp_tp) == 0
    layout = ShardLayout((8, 6), (AxisTag("dp", 1, 2), AxisTag("tp", 0, 2, 0)))
    assert w.cmd(op="get", key="m__dp_1of2__tp_0of2_sd0")["sha"] == sha(_object_bytes(x[:4], layout))
    shard2 = ReadTarget()
    shard2.mode, shard2.parallelism = "shard", dp_tp
    assert torch.equal(d.get_tensor_with_parallelism("m", shard2), x[:4])
    assert d.get_tensor_with_parallelism("m", full) is None  # rank 1 of that layout was never written
    # writer partitions: every writer stores its slice; a plain full read rebuilds the tensor
    wp = [{"rank": r, "size": 4, "split_dim": 0} for r in range(4)]
    assert c.batch_put_tensor_with_parallelism(["wp"], [x], None, None, [wp[0]]) == [0]
    for r in (1, 2, 3):
        assert d.put_tensor_with_parallelism("wp", x, writer_partition=wp[r]) == 0
    plain_full = ReadTarget()
    plain_full.mode = "full"
    assert torch.equal(c.get_tensor_with_parallelism("wp", plain_full), x)
    # _from: a serialized tensor in a buffer; batch forms; refusals are -600 / None
    assert c.get_tensor_into("full", buf.ptr, buf.size) is not None
    n = c.get_size("full")
    assert c.batch_put_tensor_with_parallelism_from(["pf", "pg"], [buf.ptr, buf.ptr], [n, n],
                                                    [None, _par(_axis("tp", 1, 2, split_dim=0))]) == [0, 0]
    assert torch.equal(c.get_tensor("pf"), x) and torch.equal(c.get_tensor("pg_tp_1"), x)
    y = _tensor(51, (8, 6))
    assert c.upsert_tensor_with_parallelism("pf", y) == 0 and torch.equal(c.get_tensor("pf"), y)
    got = c.batch_get_tensor_with_parallelism(["pf", "s", "nope"], [None, full, None])
    assert torch.equal(got[0], y) and torch.equal(got[1], x) and got[2] is None
    assert c.put_tensor_with_parallelism("bad", x, _par(_axis("tp", 0, 2)), None) == INVALID  # no split_dim
    assert c.put_tensor_with_parallelism("bad", x, _par(_axis("tp", 0, 2, split_dim=0)), None, wp[0]) == INVALID
    assert c.put_tensor_with_parallelism("bad", x, writer_partition={"rank": 0, "size": 5, "split_dim": 0}) == INVALID
    assert c.is_exist("bad") == 0
    bad_mode = ReadTarget()
    bad_mode.mode = "everything"
    with pytest.raises(ValueError, match="mode"):
        c.get_tensor_with_parallelism("s", bad_mode)
    with pytest.raises(ValueError, match="1 keys but 2 parallelisms"):
        c.batch_put_tensor_with_parallelism(["a"], [x], [None, None])


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_session_read_under_a_replaced_master_is_discarded(master_factory, worker_factory, client_factory) -> None:
    """A get session caches leases; a ranged read under a lease older than the master's
    ``confirm_after_ms`` is trusted only after a ping shows the same master still leads."""
    m = master_factory(recovery_hold_ms=1000)  # confirm_after_ms = 800; leases last 10 s
    w = worker_factory(m, 8 * MiB)
    c = client_factory(m)
    data = payload(61, 100_000)
    assert w.cmd(op="put", key="k", seed=61, size=len(data))["rc"] == 0
    x = Buf(c, len(data))
    assert c.batch_get_session_start(["k"]) == [0]
    time.sleep(1.0)
    assert c.batch_get_into_multi_buffer_ranges(["k"], [[x.ptr]], [[len(data)]], [[0]]) == [len(data)]  # confirmed
    assert x.bytes(0, len(data)) == data
    m.stop()
    m.start()
    y = Buf(c, len(data), seed=62)
    assert c.batch_get_into_multi_buffer_ranges(["k"], [[y.ptr]], [[len(data)]], [[0]]) == [-707]
    assert c.get_into_ranges([y.ptr], [["k"]], [[[0]]], [[[0]]], [[[len(data)]]]) == [[[-707]]]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_get_into_ranges_randomized_against_a_model(cluster) -> None:
    """Seeded random plans (valid, overflowing, missing keys, zero sizes) over a remote and a
    local object; every result code and every destination byte must match a numpy model."""
    _, w, _, d = cluster
    objs = {"r": payload(71, 50_000), "l": payload(72, 20_000)}
    assert w.cmd(op="put", key="r", seed=71, size=50_000, preferred=w.hostname)["rc"] == 0
    cfg = ReplicateConfig()
    cfg.preferred_segment = d.get_hostname()
    assert d.put("l", objs["l"], cfg) == 0
    bufs = [Buf(d, 8192, seed=80 + i) for i in range(2)]
    rng = np.random.default_rng(5)
    for _ in range(40):
        model = [b.arr.copy() for b in bufs]
        plan_keys, dsts, srcs, sizes, want = [], [], [], [], []
        for bi in range(2):
            ks, d2, s2, z2, w2 = [], [], [], [], []
            used = np.zeros(8192, dtype=bool)  # keep fragments of one call disjoint in the destination
            for _ in range(int(rng.integers(1, 4))):
                key = str(rng.choice(["r", "l", "missing"], p=[0.45, 0.45, 0.1]))
                d1, s1, z1, w1 = [], [], [], []
                for _ in range(int(rng.integers(1, 4))):
                    n = int(rng.integers(0, 600))
                    do = int(rng.integers(0, 8192 - 300)) if rng.random() > 0.05 else 8000
                    obj_len = len(objs.get(key, b""))
                    so = int(rng.integers(0, max(obj_len, 1))) if rng.random() > 0.05 else obj_len
                    if used[do:do + n].any():
                        continue
                    d1.append(do)
                    s1.append(so)
                    z1.append(n)
                    if do + n > 8192:  # destination checks come first (planned before any lookup)
                        w1.append(INVALID)
                    elif key == "missing":
                        w1.append(MISSING)
                    elif so + n > obj_len:
                        w1.append(INVALID)
                    else:
                        used[do:do + n] = True
                        model[bi][do:do + n] = np.frombuffer(objs[key][so:so + n], dtype=np.uint8)
                        w1.append(n)
                ks.append(key)
                d2.append(d1)
                s2.append(s1)
                z2.append(z1)
                w2.append(w1)
            plan_keys.append(ks)
            dsts.append(d2)
            srcs.append(s2)
            sizes.append(z2)
            want.append(w2)
        got = d.get_into_ranges([b.ptr for b in bufs], plan_keys, dsts, srcs, sizes)
        assert got == want
        for b, m in zip(bufs, model):
            assert np.array_equal(b.arr, m)
