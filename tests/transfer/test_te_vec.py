"""The vectorised large-batch path: pure planning logic (fast unit tests) and a real
two-process cma exchange of a big scattered batch (KV hand-off shape), verified byte for byte."""

from __future__ import annotations

import time

import numpy as np
import pytest

from mooncake_core.transfer import cma, vec
from mooncake_core.transfer.descriptor import SegmentDescriptor
from mooncake_core.transfer.memory import Region
from mooncake_lab.te_helpers import sha


def _a(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


# ------------------------------------------------------------------ pure logic
def test_as_arrays_accepts_ints_and_refuses_the_rest():
    got = vec.as_arrays([1, 2], (3, 4), np.array([5, 6], dtype=np.uint32))
    assert got is not None and [a.tolist() for a in got] == [[1, 2], [3, 4], [5, 6]]
    assert all(a.dtype == np.int64 for a in got)
    assert vec.as_arrays([1, 2], [3], [4, 5]) is None  # length mismatch
    assert vec.as_arrays([1 << 64], [1], [1]) is None  # does not fit int64
    assert vec.as_arrays([1.5], [1], [1]) is None  # not an integer
    assert vec.as_arrays([True], [1], [1]) is None
    assert vec.as_arrays(["1"], [1], [1]) is None


def test_locals_ok_matches_per_request_rule():
    assert vec.locals_ok(_a(1, 2), _a(0, 5), _a(0, 7))
    assert not vec.locals_ok(_a(1, 0), _a(0, 5), _a(0, 7))  # local 0
    assert not vec.locals_ok(_a(1, 2), _a(-1, 5), _a(0, 7))  # negative remote
    assert not vec.locals_ok(_a(1, 2), _a(0, 5), _a(0, -7))  # negative length


def test_in_bounds_agrees_with_find_region():
    desc = SegmentDescriptor("s", "h", 1, buffers=[Region(1000, 100, "*"), Region(5000, 50, "*")])
    rng = np.random.default_rng(4)
    remote = rng.integers(900, 5100, 400).astype(np.int64)
    length = rng.integers(0, 120, 400).astype(np.int64)
    for r, n in zip(remote.tolist(), length.tolist()):
        want = desc.find_region(r, n) is not None
        assert vec.in_bounds(desc, _a(r), _a(n)) is want, (r, n)
    assert vec.in_bounds(desc, _a(1000, 5000), _a(100, 50))
    assert not vec.in_bounds(desc, _a(1000, 5000), _a(100, 51))
    desc.buffers.append(Region(9000, 10, "*"))  # cache follows registrations
    assert vec.in_bounds(desc, _a(9000), _a(10))
    assert not vec.in_bounds(SegmentDescriptor("e", "h", 1), _a(1), _a(1))


def test_coalesce_merges_runs_and_drops_empty():
    loc, rem, ln = vec.coalesce(_a(100, 116, 132, 500, 600), _a(0, 16, 32, 64, 900), _a(16, 16, 0, 8, 8))
    assert (loc.tolist(), rem.tolist(), ln.tolist()) == ([100, 500, 600], [0, 64, 900], [32, 8, 8])
    # contiguous locally but not remotely: kept apart
    loc, rem, ln = vec.coalesce(_a(0 + 1, 17), _a(100, 50), _a(16, 16))
    assert ln.tolist() == [16, 16]


def test_split_long_keeps_every_byte_in_order():
    loc, rem, ln = vec.split_long(_a(10, 1000), _a(0, 77), _a(40, 5), 16)
    assert loc.tolist() == [10, 26, 42, 1000]
    assert rem.tolist() == [0, 16, 32, 77]
    assert ln.tolist() == [16, 16, 8, 5]


@pytest.mark.parametrize("seed", range(5))
def test_plan_chunks_covers_the_batch_exactly(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    length = rng.integers(0, 5000, n).astype(np.int64)
    local = (np.cumsum(length) - length + 4096).astype(np.int64)  # contiguous source ...
    order = rng.permutation(n)
    remote = (np.cumsum(length[order]) - length[order])[np.argsort(order)] + 8192  # ... scattered target
    plan = vec.plan_chunks(local, remote, length, chunk_bytes=20000, max_iov=64)
    assert plan.total == int(length.sum())
    assert sum(plan.nbytes) == plan.total
    assert plan.bounds[0] == 0 and plan.bounds[-1] == len(plan.local_iov)
    # expand the plan back to a byte map and compare with the request
    want = {}
    for lo, r, ln in zip(local.tolist(), remote.tolist(), length.tolist()):
        for i in range(0, ln, 997):
            want[lo + i] = r + i
    for k in range(len(plan.nbytes)):
        a, b = plan.bounds[k], plan.bounds[k + 1]
        assert 0 < b - a <= 64
        lv, rv = plan.local_iov[a:b], plan.remote_iov[a:b]
        assert int(lv[:, 1].sum()) == plan.nbytes[k]
        assert (lv[:, 1] == rv[:, 1]).all() and (lv[:, 1] > 0).all() and (lv[:, 1] <= 20000).all()
    got_lo = plan.local_iov[:, 0].astype(np.int64)
    got_rem = plan.remote_iov[:, 0].astype(np.int64)
    got_len = plan.local_iov[:, 1].astype(np.int64)
    for lo, r in list(want.items())[:500]:
        i = int(np.searchsorted(got_lo, lo, side="right")) - 1
        assert got_lo[i] <= lo < got_lo[i] + got_len[i]
        assert got_rem[i] + (lo - got_lo[i]) == r


def test_plan_of_empty_batch():
    plan = vec.plan_chunks(_a(), _a(), _a(), chunk_bytes=1024, max_iov=8)
    assert plan.nbytes == [] and plan.total == 0


# ------------------------------------------------------------------ real processes
@pytest.mark.integration
def test_big_scattered_batch_over_cma(start_peer, engine_factory, monkeypatch):
    """~40 MiB in 5000 scattered blocks plus long and adjacent entries: several chunks on
    several threads (small CHUNK_BYTES), sync + async, write + read, byte for byte."""
    monkeypatch.setattr(cma, "CHUNK_BYTES", 256 << 10)
    size = 48 << 20
    peer = start_peer("P2PHANDSHAKE", size=size, seed=11)
    eng = engine_factory("P2PHANDSHAKE")
    assert eng.transport_for(peer.segment) == "cma"
    rng = np.random.default_rng(99)
    src = rng.integers(0, 256, size, dtype=np.uint8)
    dst = np.zeros(size, dtype=np.uint8)
    assert eng.register_memory(src.ctypes.data, size) == 0
    assert eng.register_memory(dst.ctypes.data, size) == 0
    model = peer.expected()
    blk = 8192
    nblk = 5000
    perm = rng.permutation(5120)[:nblk]  # scattered destination pages in the first 40 MiB
    offs_l = (np.arange(nblk) * blk).tolist()
    offs_r = (perm * blk).tolist()
    lens = [blk] * nblk
    # a long entry (split into chunks) and two adjacent ones (coalesced) after that area
    base = 5120 * blk
    offs_l += [nblk * blk, nblk * blk + 600_000, nblk * blk + 700_000]
    offs_r += [base, base + 600_000, base + 700_000]
    lens += [600_000, 100_000, 3]
    lens[7] = 0  # an empty entry is allowed and moves nothing
    try:
        assert eng.batch_transfer_sync_write(peer.segment, [src.ctypes.data + o for o in offs_l],
                                             [peer.addr + o for o in offs_r], lens) == 0, eng.last_error
        for lo, r, n in zip(offs_l, offs_r, lens):
            model[r:r + n] = src[lo:lo + n]
        assert peer.sha(0, size) == sha(model)

        bid = eng.batch_transfer_async_read(peer.segment, [dst.ctypes.data + o for o in offs_l],
                                            [peer.addr + o for o in offs_r], lens)
        assert bid > 0, eng.last_error
        assert eng.get_batch_transfer_status([bid]) == 0
        expect = np.zeros(size, dtype=np.uint8)
        for lo, r, n in zip(offs_l, offs_r, lens):
            expect[lo:lo + n] = model[r:r + n]
        assert np.array_equal(dst, expect)

        # one entry outside the target's memory: the whole batch is refused, nothing moves
        src[:] = rng.integers(0, 256, size, dtype=np.uint8)
        bad_r = [peer.addr + o for o in offs_r]
        bad_r[4321] = peer.addr + size - 10
        t0 = time.monotonic()
        assert eng.batch_transfer_sync_write(peer.segment, [src.ctypes.data + o for o in offs_l],
                                             bad_r, lens) == -1
        assert time.monotonic() - t0 < 30
        assert "outside every region" in eng.last_error and f"{peer.addr + size - 10:#x}" in eng.last_error
        assert peer.sha(0, size) == sha(model)
        # invalid local address in a big batch: clear error, nothing moves
        bad_l = [src.ctypes.data + o for o in offs_l]
        bad_l[10] = 0
        assert eng.batch_transfer_sync_write(peer.segment, bad_l, [peer.addr + o for o in offs_r], lens) == -1
        assert "invalid request" in eng.last_error
        assert peer.sha(0, size) == sha(model)
    finally:
        eng.unregister_memory(src.ctypes.data)
        eng.unregister_memory(dst.ctypes.data)
