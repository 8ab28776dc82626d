"""The parallel-tensor layout rules (pure: no sockets, no store).

A shard written with one split and read with another must give exactly the bytes of the
requested slice of the global tensor. These tests check the plan against numpy slicing of
a reference array for every split pair the API allows (property-style with hypothesis),
and that the layout survives the object header round trip.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mooncake_core.store import tensor as T
from mooncake_core.store.tensor_layout import (
    AxisTag,
    LayoutError,
    ShardLayout,
    StoredSplit,
    box_runs,
    check_split,
    full_box,
    plan_assembly,
    shard_box,
    uniform_range,
)


def _assemble(global_arr: np.ndarray, split: StoredSplit, target, data_offset: int = 7) -> np.ndarray:
    """Execute a plan against in-memory 'objects' (payload after ``data_offset`` junk bytes)."""
    objs = []
    for r in range(split.count):
        sl = tuple(slice(s, s + e) for s, e in split.box(r))
        objs.append(b"\xee" * data_offset + np.ascontiguousarray(global_arr[sl]).tobytes())
    itemsize = global_arr.itemsize
    shape = tuple(e for _, e in target)
    out = bytearray(b"\x55" * (int(np.prod(shape, dtype=np.int64)) * itemsize))
    for p in plan_assembly("k", split, target, itemsize, [data_offset] * split.count):
        out[p.dst_off:p.dst_off + p.size] = objs[p.source][p.src_off:p.src_off + p.size]
    return np.frombuffer(bytes(out), dtype=global_arr.dtype).reshape(shape)


def _divisors(n: int) -> list[int]:
    return [d for d in (1, 2, 3, 4, 6, 8, 16) if n % d == 0]


@st.composite
def _cases(draw):
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.sampled_from([1, 2, 4, 6, 8, 12, 16])) for _ in range(ndim))
    wdim = draw(st.integers(0, ndim - 1))
    rdim = draw(st.one_of(st.just(wdim), st.integers(0, ndim - 1)))
    wsize = draw(st.sampled_from(_divisors(shape[wdim])))
    rsize = draw(st.sampled_from(_divisors(shape[rdim])))
    rrank = draw(st.integers(0, rsize - 1))
    dtype = draw(st.sampled_from([np.uint8, np.int16, np.float32, np.float64]))
    return shape, wdim, wsize, rdim, rsize, rrank, dtype


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_any_target_shard_from_any_stored_split_is_exact(case) -> None:
    shape, wdim, wsize, rdim, rsize, rrank, dtype = case
    g = np.arange(int(np.prod(shape)), dtype=np.int64).astype(dtype).reshape(shape)
    split = StoredSplit(shape, np.dtype(dtype).name, wdim, wsize)
    target = shard_box(shape, rdim, rrank, rsize)
    want = np.array_split(g, rsize, axis=rdim)[rrank]
    got = _assemble(g, split, target)
    assert got.shape == want.shape and np.array_equal(got, want)
    assert np.array_equal(_assemble(g, split, full_box(shape)), g)  # the full tensor: all of them


@pytest.mark.parametrize("wsize", [1, 2, 4, 8])
@pytest.mark.parametrize("rsize", [1, 2, 4, 8])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_tp_sizes_both_ways_every_split_dim(wsize: int, rsize: int, dim: int) -> None:
    shape = (8, 16, 24)
    g = np.random.default_rng(wsize * 100 + rsize * 10 + dim).standard_normal(shape).astype(np.float32)
    split = StoredSplit(shape, "float32", dim, wsize)
    for r in range(rsize):
        got = _assemble(g, split, shard_box(shape, dim, r, rsize))
        assert np.array_equal(got, np.split(g, rsize, axis=dim)[r])


def test_same_split_is_one_piece_per_shard_and_whole_rows_merge() -> None:
    split = StoredSplit((8, 6), "float32", 0, 4)
    pieces = plan_assembly("k", split, shard_box((8, 6), 0, 1, 4), 4, [16] * 4)
    assert [(p.source, p.src_off, p.dst_off, p.size) for p in pieces] == [(1, 16, 0, 2 * 6 * 4)]
    # along the last dim a shard is one run per row
    split = StoredSplit((3, 8), "float32", 1, 2)
    assert len(plan_assembly("k", split, full_box((3, 8)), 4, [0, 0])) == 6


def test_box_runs_disjoint_and_scalar() -> None:
    s, d, n = box_runs(((0, 2),), ((2, 2),), 4)
    assert len(s) == 0 and n == 0
    s, d, n = box_runs((), (), 8)
    assert s.tolist() == [0] and d.tolist() == [0] and n == 8


def test_non_uniform_and_out_of_range_requests_are_refused_with_the_splits_named() -> None:
    with pytest.raises(LayoutError, match="not divisible by 3"):
        shard_box((8, 12), 0, 0, 3)
    with pytest.raises(LayoutError, match="split_dim 2 is out of range"):
        shard_box((8, 12), 2, 0, 2)
    with pytest.raises(LayoutError, match="rank 4 of size 4"):
        uniform_range(8, 4, 4)
    split = StoredSplit((8, 12), "float32", 0, 4)
    with pytest.raises(LayoutError, match=r"'w'.*outside tp=4 along dim 0 of float32\[8, 12\]"):
        plan_assembly("w", split, ((0, 8), (6, 12)), 4, [0] * 4)


def _lay(kind: str, rank: int, size: int, dim: int | None, g=(8, 4)) -> ShardLayout:
    return ShardLayout(g, (AxisTag(kind, rank, size, dim),))


def test_check_split_names_key_and_both_splits_on_a_mismatch() -> None:
    split = StoredSplit((8, 4), "float32", 0, 4)
    ok = [(r, f"w_tp_{r}", "float32", (2, 4), _lay("tp", r, 4, 0)) for r in range(4)]
    check_split("w", split, ok)
    mixed = ok[:1] + [(1, "w_tp_1", "float32", (4, 4), _lay("tp", 1, 2, 0))]
    with pytest.raises(LayoutError, match=r"'w'.*'w_tp_1' holds tp rank 1 of 2 .*expected rank 1 of tp=4"):
        check_split("w", split, mixed)
    with pytest.raises(LayoutError, match="is float16"):
        check_split("w", split, [(0, "w_tp_0", "float16", (2, 4), _lay("tp", 0, 4, 0))])
    with pytest.raises(LayoutError, match="no layout metadata"):
        check_split("w", split, [(0, "w_tp_0", "float32", (2, 4), None)])


@pytest.mark.parametrize("layout", [
    None,
    _lay("tp", 1, 4, 0),
    _lay("writer", 2, 3, 1, g=(5, 9)),
    ShardLayout((8, 6, 4), (AxisTag("dp", 1, 2), AxisTag("tp", 3, 4, 2), AxisTag("pp", 0, 2, stage_id=7))),
    ShardLayout((2, 2), (AxisTag("ep", 0, 2, expert_id=-3),)),
])
def test_header_round_trip_carries_the_layout(layout) -> None:
    shape = (3, 5) if layout is None else layout.local_shape()
    hdr = T.encode_header("bfloat16", shape, layout)
    assert len(hdr) == T.header_len(len(shape), 0 if layout is None else len(layout.axes))
    h = T.decode_tensor_header(hdr + b"\0" * 64)
    assert (h.dtype, h.shape, h.header_len, h.layout) == ("bfloat16", tuple(shape), len(hdr), layout)
    assert hdr[:4] == (T.MAGIC if layout is None else T.MAGIC_V2)  # whole tensors keep version 1


def test_header_with_inconsistent_layout_is_rejected() -> None:
    good = T.encode_header("float32", (2, 4), _lay("tp", 1, 4, 0))
    bad = bytearray(good)
    bad[16:24] = (3).to_bytes(8, "little", signed=True)  # local dim 0 no longer the shard's extent
    with pytest.raises(T.TensorFormatError, match="does not match its layout"):
        T.decode_tensor_header(bytes(bad))
    with pytest.raises(ValueError, match="does not match its layout"):
        T.encode_header("float32", (3, 4), _lay("tp", 1, 4, 0))
