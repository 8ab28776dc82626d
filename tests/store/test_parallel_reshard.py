"""A tensor written with one parallel split and read with another gives exactly the
requested slice -- against a real master, a worker process and two clients.

Writes go through the pool-only client (every byte to a remote segment), reads through the
client with its own segment and the pool-only one, so both the transfer engine and the local
copy paths are exercised. Data is random per key; every result is compared with
``torch.equal`` against slicing the original, so one wrong byte fails the test. The geometry
of every split pair is covered exhaustively by tests/store/test_tensor_layout.py (pure); here
each API form is wired end to end: TP sizes 1/2/4/8 both ways, split_dim 0/1/last, the
dp_tp/pp_tp/ep_tp modes, full reads after sharded writes, writer partitions, ``_into``,
batch forms and the ``*_with_tp`` wrappers; and what cannot be answered exactly gives None.
"""

from __future__ import annotations

import ctypes
import itertools

import pytest
import torch

from mooncake_core.store import ParallelAxis, ReadTarget, TensorParallelism

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _axis(kind: str, rank: int, size: int, split_dim=None, **kw) -> ParallelAxis:
    a = ParallelAxis()
    a.kind, a.rank, a.size, a.split_dim = kind, rank, size, split_dim
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def _mode(mode: str, rank: int, size: int, dim: int) -> TensorParallelism:
    tp = _axis("tp", rank, size, dim)
    scope = {"tp": [], "dp_tp": [_axis("dp", 0, 2)], "pp_tp": [_axis("pp", 0, 2, stage_id=7)],
             "ep_tp": [_axis("ep", 0, 2, expert_id=11)]}[mode]
    p = TensorParallelism()
    p.axes = scope + [tp]
    return p


def _target(mode: str, parallelism=None) -> ReadTarget:
    t = ReadTarget()
    t.mode, t.parallelism = mode, parallelism
    return t


def _data(seed: int, shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(1 << 30), 1 << 30, shape, generator=g, dtype=torch.int32)


def _write(store, key: str, x: torch.Tensor, mode: str, size: int, dim: int) -> None:
    """As a model writer does: single TP writes each rank's shard, multi-axis the full tensor."""
    for r in range(size):
        src = x.chunk(size, dim)[r].contiguous() if mode == "tp" else x
        assert store.put_tensor_with_parallelism(key, src, _mode(mode, r, size, dim)) == 0, (key, r)


class _Buf:
    def __init__(self, store, size: int) -> None:
        self.raw = (ctypes.c_ubyte * size)()
        self.ptr, self.size = ctypes.addressof(self.raw), size
        assert store.register_buffer(self.ptr, size) == 0


SHAPE = (8, 16, 24)


def test_tp_sizes_both_ways_split_dim_first_middle_last(cluster) -> None:
    _, _, c, d = cluster
    buf = _Buf(d, 1 << 20)
    for n, (wsize, dim) in enumerate(itertools.product((1, 2, 4, 8), (0, 1, 2))):
        key, x = f"rs_tp_{n}", _data(n, SHAPE)
        _write(c, key, x, "tp", wsize, dim)
        for rsize in (1, 2, 4, 8):
            for r in range(rsize):
                want = x.chunk(rsize, dim)[r]
                tgt = _target("shard", _mode("tp", r, rsize, dim))
                got = (d if r % 2 else c).get_tensor_with_parallelism(key, tgt)
                assert got is not None and torch.equal(got, want), (wsize, rsize, dim, r)
                into = d.get_tensor_with_parallelism_into(key, buf.ptr, buf.size, tgt)
                assert into is not None and torch.equal(into, want), ("into", wsize, rsize, dim, r)
            # full, whatever TP the reader names, and with no parallelism at all
            full = d.get_tensor_with_parallelism(key, _target("full", _mode("tp", rsize - 1, rsize, dim)))
            assert full is not None and torch.equal(full, x), ("full", wsize, rsize, dim)
        assert torch.equal(d.get_tensor_with_parallelism(key, _target("full")), x)
        assert torch.equal(d.get_tensor_with_parallelism_into(key, buf.ptr, buf.size, _target("full")), x)


def test_multi_axis_modes_reshard(cluster) -> None:
    _, _, c, d = cluster
    buf = _Buf(d, 1 << 20)
    cases = [(m, w, r, dim) for m in ("dp_tp", "pp_tp", "ep_tp") for (w, r) in ((4, 2), (2, 4), (8, 1), (1, 8))
             for dim in (0, 2)]
    for n, (mode, wsize, rsize, dim) in enumerate(cases):
        key, x = f"rs_{mode}_{n}", _data(100 + n, SHAPE)
        _write(c, key, x, mode, wsize, dim)
        for r in range(rsize):
            tgt = _target("shard", _mode(mode, r, rsize, dim))
            want = x.chunk(rsize, dim)[r]
            assert torch.equal(d.get_tensor_with_parallelism(key, tgt), want), (mode, wsize, rsize, dim, r)
            assert torch.equal(d.get_tensor_with_parallelism_into(key, buf.ptr, buf.size, tgt), want)
        full = _target("full", _mode(mode, 0, rsize, dim))
        assert torch.equal(d.get_tensor_with_parallelism(key, full), x), (mode, wsize, rsize, dim)
        # another group (dp rank 1 / another stage / expert) was never written
        other = _mode(mode, 0, rsize, dim)
        if mode != "tp":
            scope = other.axes[0]
            scope.rank = 1
        assert d.get_tensor_with_parallelism(key, _target("full", other)) is None


def test_writer_partitions_batch_forms_and_tp_wrappers(cluster) -> None:
    _, _, c, d = cluster
    buf = _Buf(d, 1 << 20)
    xs = [_data(200 + i, SHAPE) for i in range(3)]
    keys = ["rs_w0", "rs_w1", "rs_w2"]
    for r in range(4):  # writer partitions: each writer sends the full tensor and its rank
        wps = [{"rank": r, "size": 4, "split_dim": dim} for dim in (0, 1, 2)]
        assert c.batch_put_tensor_with_parallelism(keys, xs, None, None, wps) == [0, 0, 0]
    got = d.batch_get_tensor_with_parallelism(keys, [_target("full")] * 3)
    assert all(torch.equal(g, x) for g, x in zip(got, xs))
    tgts = [_target("shard", _mode("tp", 1, 2, dim)) for dim in (0, 1, 2)]
    got = d.batch_get_tensor_with_parallelism(keys, tgts)
    assert all(torch.equal(g, x.chunk(2, dim)[1]) for g, x, dim in zip(got, xs, (0, 1, 2)))
    third = 400 * 1024
    bufs = [buf.ptr + i * third for i in range(3)]
    got = d.batch_get_tensor_with_parallelism_into(keys, bufs, [third] * 3, tgts)
    assert all(torch.equal(g, x.chunk(2, dim)[1]) for g, x, dim in zip(got, xs, (0, 1, 2)))

    # *_with_tp wrappers: written TP=4 along dim 1, read TP=2 (and TP=8) with the same calls
    assert c.batch_put_tensor_with_tp(["rs_wr0", "rs_wr1"], xs[:2], tp_size=4, split_dim=1) == [0, 0]
    for r in range(2):
        assert torch.equal(d.get_tensor_with_tp("rs_wr0", r, 2, 1), xs[0].chunk(2, 1)[r])
        assert torch.equal(d.get_tensor_with_tp_into("rs_wr0", buf.ptr, buf.size, r, 8, 1), xs[0].chunk(8, 1)[r])
        got = d.batch_get_tensor_with_tp(["rs_wr0", "rs_wr1"], r, 2)  # no split_dim: the stored one
        assert torch.equal(got[0], xs[0].chunk(2, 1)[r]) and torch.equal(got[1], xs[1].chunk(2, 1)[r])
    got = d.batch_get_tensor_with_tp_into(["rs_wr0", "rs_wr1"], bufs[:2], [third] * 2, 3, 4)
    assert torch.equal(got[1], xs[1].chunk(4, 1)[3])

    # a full tensor stored whole: any shard is cut from it
    assert c.put_tensor("rs_whole", xs[2]) == 0
    assert torch.equal(d.get_tensor_with_tp("rs_whole", 3, 4, 2), xs[2].chunk(4, 2)[3])


def test_what_cannot_be_answered_exactly_gives_none(cluster) -> None:
    _, _, c, d = cluster
    x = _data(300, (12, 8))
    _write(c, "rs_bad", x, "tp", 4, 0)
    # 12 rows cannot be cut in 5 (nor 8) uniform shards
    assert d.get_tensor_with_parallelism("rs_bad", _target("shard", _mode("tp", 0, 5, 0))) is None
    assert d.get_tensor_with_tp("rs_bad", 0, 8, 0) is None
    # shards of two different writes under one key: rank 0 rewritten as TP=2 -> refused, not mixed
    assert c.upsert_tensor_with_parallelism("rs_bad", x.chunk(2, 0)[0].contiguous(), _mode("tp", 0, 2, 0)) == 0
    assert d.get_tensor_with_parallelism("rs_bad", _target("full")) is None
    assert d.get_tensor_with_parallelism("rs_bad", _target("shard", _mode("tp", 1, 4, 0))) is not None  # itself
    assert d.get_tensor_with_parallelism("rs_bad", _target("shard", _mode("tp", 1, 2, 0))) is None
    # a buffer too small for the assembled tensor: None, nothing written past it
    small = _Buf(d, 64)
    assert d.get_tensor_with_parallelism_into("rs_bad", small.ptr, small.size, _target("full")) is None
    # shards written before layouts existed (version-1 headers) still read with their own split
    y = _data(301, (4, 4))
    assert c.put_tensor("old_tp_0", y[:2].contiguous()) == 0 and c.put_tensor("old_tp_1", y[2:].contiguous()) == 0
    assert torch.equal(d.get_tensor_with_tp("old", 1, 2, 0), y[2:])
    assert d.get_tensor_with_parallelism("old", _target("full", _mode("tp", 0, 2, 0))) is None  # split unknown
