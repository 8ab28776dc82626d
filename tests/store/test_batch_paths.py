"""Batches as batches (issue 18): the packed put/get path, per key.

A real ``mooncake_master`` process, a worker process with its own segment, a client in this
process with a segment (own-segment copy path) and one without (pool only: every byte
crosses the transfer engine). Batches mix keys that succeed with keys that fail (already
there, too big, leased), land on several segments, interleave misses; every result is checked
per key and in order, bytes byte for byte, and the worker re-reads objects across processes.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from mooncake_core.store import ReplicateConfig

from mooncake_lab.store_procs import payload, sha

pytestmark = pytest.mark.integration

MiB = 1 << 20
INVALID, EXISTS, MISSING, LEASED, TRANSFER_FAIL = -600, -705, -704, -706, -800


def _vals(seed: int, n: int, size: int = 1024) -> list[bytes]:
    return [payload(seed * 100_000 + i, size) for i in range(n)]


@pytest.mark.timeout(120)
def test_batch_put_spans_segments_and_reads_back_in_order(cluster) -> None:
    _, w, c, d = cluster
    keys = [f"mix/{i}" for i in range(400)]
    vals = [payload(i, 1024 + (i % 3) * 64) for i in range(400)]  # three sizes: gaps between ranges
    assert d.put_batch(keys, vals) == 0
    descs = d.batch_get_replica_desc(keys)
    segs = {r.segment_name for k in keys for r in descs[k]}
    assert segs == {d.get_hostname(), w.hostname}, f"expected both segments in one batch, got {segs}"
    # misses interleaved: one result per key, in the keys' order
    probe = [k for pair in zip(keys, [f"none/{i}" for i in range(400)]) for k in pair]
    for reader in (c, d):
        got = reader.get_batch(probe)
        assert len(got) == len(probe)
        for i, g in enumerate(got):
            assert g == (vals[i // 2] if i % 2 == 0 else b""), f"{probe[i]} read back wrong"
    assert d.batch_is_exist(probe) == [1, 0] * 400
    assert w.cmd(op="get", key="mix/7") == {"len": len(vals[7]), "sha": sha(vals[7])}


@pytest.mark.timeout(120)
def test_per_key_codes_inside_one_batch(cluster) -> None:
    _, w, c, d = cluster
    assert d.put("old", b"old value") == 0
    big = np.zeros(20 * MiB, np.uint8)  # larger than every mounted segment (16 MiB each)
    small = [np.frombuffer(bytearray(v), np.uint8) for v in _vals(1, 3, 3000)]
    keys = ["new/0", "old", "toobig", "new/1", "new/2"]
    bufs = [small[0], np.frombuffer(bytearray(b"other value"), np.uint8), big, small[1], small[2]]
    for client in (c, d):
        for b in bufs:
            assert client.register_buffer(int(b.ctypes.data), b.nbytes) == 0
    rcs = d.batch_put_from(keys, [int(b.ctypes.data) for b in bufs], [b.nbytes for b in bufs])
    # an existing key counts as success and keeps its value; the too-big one fails alone
    assert rcs[:2] == [0, 0] and rcs[2] == INVALID and rcs[3:] == [0, 0], rcs
    assert d.get("old") == b"old value" and d.is_exist("toobig") == 0
    assert [d.get(k) for k in ("new/0", "new/1", "new/2")] == [bytes(s) for s in small]
    # upsert of the same batch: the existing key is replaced, the too-big one still fails alone
    rcs = c.batch_upsert_from(keys, [int(b.ctypes.data) for b in bufs], [b.nbytes for b in bufs])
    assert rcs[:2] == [0, 0] and rcs[2] == INVALID and rcs[3:] == [0, 0], rcs
    assert d.get("old") == b"other value"
    # batch_get_into: a too-small buffer fails its key only; sizes/bytes per key in order
    dst = [np.zeros(4096, np.uint8), np.zeros(4, np.uint8), np.zeros(4096, np.uint8), np.zeros(4096, np.uint8)]
    for b in dst:
        assert d.register_buffer(int(b.ctypes.data), b.nbytes) == 0
    names = ["new/0", "old", "missing", "new/2"]
    rcs = d.batch_get_into(names, [int(b.ctypes.data) for b in dst], [b.nbytes for b in dst])
    assert rcs == [3000, INVALID, MISSING, 3000], rcs
    assert bytes(dst[0][:3000]) == bytes(small[0]) and bytes(dst[3][:3000]) == bytes(small[2])
    # leases are per object: the keys just read are leased, the others are not
    assert d.get_batch(["new/0"]) == [bytes(small[0])]
    rcs = d.batch_remove(["new/0", "new/1", "missing"])
    assert rcs == [LEASED, 0, MISSING], rcs
    assert d.batch_remove(["new/0"], force=True) == [0]


@pytest.mark.timeout(120)
def test_two_replicas_and_pool_only_writer(cluster) -> None:
    _, w, c, d = cluster
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    keys = [f"two/{i}" for i in range(60)]
    vals = _vals(2, 60, 5000)
    assert c.put_batch(keys, vals, cfg) == 0  # every byte through the transfer engine
    for k in ("two/0", "two/59"):
        assert {r.segment_name for r in c.get_replica_desc(k)} == {d.get_hostname(), w.hostname}
    assert d.get_batch(keys) == vals and c.get_batch(keys) == vals
    # a second put of the batch: every key exists, all succeed, values unchanged
    assert c.put_batch(keys, _vals(3, 60, 5000)) == 0
    assert c.get_batch(keys[:5]) == vals[:5]
    # upsert_batch replaces every value
    new = _vals(4, 60, 700)
    assert d.upsert_batch(keys, new) == 0
    assert c.get_batch(keys) == new and w.cmd(op="get", key="two/3") == {"len": 700, "sha": sha(new[3])}


def _pieces(rng: np.random.Generator, src: np.ndarray, n: int) -> list[list[tuple[int, int]]]:
    """Per key 1-3 pieces (one maybe empty) at random places of ``src``."""
    base, out = int(src.ctypes.data), []
    for _ in range(n):
        k = int(rng.integers(1, 4))
        sizes = [int(rng.integers(0 if j else 1, 1500)) for j in range(k)]
        out.append([(base + int(rng.integers(0, src.nbytes - s)), s) for s in sizes])
    return out


def _joined(src: np.ndarray, pieces: list[tuple[int, int]]) -> bytes:
    base = int(src.ctypes.data)
    return b"".join(bytes(src[a - base:a - base + s]) for a, s in pieces)


def _split(dst: np.ndarray, at: int, sizes: list[int], extra: int) -> tuple[list[list[int]], list[list[int]]]:
    """Destination pieces for objects of ``sizes``: each split in two at a different point,
    the second piece ``extra`` bytes larger than needed (filled in order, rest untouched)."""
    base, ptrs, caps = int(dst.ctypes.data) + at, [], []
    for i, s in enumerate(sizes):
        first = min(s, 1 + (i * 37) % 700)
        ptrs.append([base, base + first])
        caps.append([first, s - first + extra])
        base += s + extra
    return ptrs, caps


@pytest.mark.timeout(120)
def test_multi_buffer_batches_keep_per_key_codes(cluster) -> None:
    _, w, c, d = cluster
    rng = np.random.default_rng(18)
    src = np.frombuffer(rng.bytes(4 * MiB), np.uint8).copy()
    big = np.zeros(20 * MiB, np.uint8)
    dst = np.zeros(8 * MiB, np.uint8)
    for client in (c, d):
        for b in (src, big, dst):
            assert client.register_buffer(int(b.ctypes.data), b.nbytes) == 0
    assert d.put("mb/old", b"old value") == 0
    for writer, tag in ((d, "own"), (c, "pool")):
        keys = [f"mb/{tag}/{i}" for i in range(300)]
        pieces = _pieces(rng, src, 300)
        keys += ["mb/old", f"mb/{tag}/toobig", f"mb/{tag}/leased", f"mb/{tag}/unread"]
        pieces += [[(int(src.ctypes.data), 100)], [(int(big.ctypes.data), 10 * MiB), (int(big.ctypes.data), 10 * MiB)],
                   *_pieces(rng, src, 2)]
        rcs = writer.batch_put_from_multi_buffers(keys, [[a for a, _ in p] for p in pieces],
                                                  [[s for _, s in p] for p in pieces])
        # an existing key counts as success and keeps its value; the too-big one fails alone
        assert rcs == [0] * 301 + [INVALID, 0, 0], rcs
        assert d.get("mb/old") == b"old value" and d.is_exist(f"mb/{tag}/toobig") == 0
        want = [_joined(src, p) for p in pieces[:300]]
        descs = d.batch_get_replica_desc(keys[:300])
        assert {r.segment_name for k in keys[:300] for r in descs[k]} == {d.get_hostname(), w.hostname}
        for reader in (c, d):
            assert reader.get_batch(keys[:300]) == want
        assert w.cmd(op="get", key=keys[5]) == {"len": len(want[5]), "sha": sha(want[5])}
        # read back into a different split of buffers, with a miss and a too-small buffer in between
        names = keys[:150] + ["mb/none", keys[150], keys[-2]]
        leased = _joined(src, pieces[-2])
        ptrs, caps = _split(dst, 0, [len(v) for v in want[:150]], 3)
        ptrs += [[int(dst.ctypes.data)], [int(dst.ctypes.data) + 7 * MiB], [int(dst.ctypes.data) + 7 * MiB + 4096]]
        caps += [[10], [len(want[150]) - 1], [len(leased)]]
        for reader in (c, d):
            dst[:] = 0
            got = reader.batch_get_into_multi_buffers(names, ptrs, caps)
            assert got == [len(v) for v in want[:150]] + [MISSING, INVALID, len(leased)], got
            base = int(dst.ctypes.data)
            for i, v in enumerate(want[:150]):
                a, b = ptrs[i]
                first = caps[i][0]
                back = bytes(dst[a - base:a - base + first]) + bytes(dst[b - base:b - base + len(v) - first])
                assert back == v, f"{names[i]} read back wrong"
                assert not dst[b - base + len(v) - first:b - base + caps[i][1]].any(), "wrote past the object"
        off = int(dst.ctypes.data) + 7 * MiB + 4096 - int(dst.ctypes.data)
        assert bytes(dst[off:off + len(leased)]) == leased
        # leases are per object: the key only the multi-buffer read read is leased, its neighbour is not
        assert d.batch_remove([keys[-2], keys[-1]]) == [LEASED, 0]


@pytest.mark.timeout(180)
def test_multi_buffer_batches_with_a_stopped_peer_fail_only_its_keys(master_factory, worker_factory,
                                                                   client_factory, monkeypatch) -> None:
    """One vectored write / read per segment: when the one to a stopped peer fails, only the
    keys on that peer fail (-800, once: one transfer timeout), the others are written / read.
    The puts whose write failed are revoked and put once more away from the stopped peer (on
    the live segment): all succeed -- which they could not unless the revoke freed the keys --
    and read back right (nothing half-written is ever published)."""
    import os
    import signal

    monkeypatch.setenv("MC_FORCE_TCP", "1")  # a tcp transfer waits for the stopped peer
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "2")
    m = master_factory(client_ttl=60, default_kv_lease_ttl=10_000)
    w = worker_factory(m, 16 << 20)
    c = client_factory(m)
    d = client_factory(m, segment=16 << 20)
    rng = np.random.default_rng(7)
    src = np.frombuffer(rng.bytes(MiB), np.uint8).copy()
    dst = np.zeros(2 * MiB, np.uint8)
    for b in (src, dst):
        assert c.register_buffer(int(b.ctypes.data), b.nbytes) == 0
    keys = [f"sp/{i}" for i in range(120)]
    pieces = _pieces(rng, src, 120)
    want = [_joined(src, p) for p in pieces]
    rcs = c.batch_put_from_multi_buffers(keys, [[a for a, _ in p] for p in pieces], [[s for _, s in p] for p in pieces])
    assert rcs == [0] * 120
    descs = c.batch_get_replica_desc(keys)
    on_w = [descs[k][0].segment_name == w.hostname for k in keys]
    assert any(on_w) and not all(on_w), "expected the batch on both segments"
    more = [f"sp/late/{i}" for i in range(120)]
    os.kill(w.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        # the put first, while the master still counts the stopped peer as alive and places keys there
        rcs = c.batch_put_from_multi_buffers(more, [[a for a, _ in p] for p in pieces],
                                             [[s for _, s in p] for p in pieces])
        ptrs, caps = _split(dst, 0, [len(v) for v in want], 0)
        got = c.batch_get_into_multi_buffers(keys, ptrs, caps)
        assert got == [TRANSFER_FAIL if x else len(v) for x, v in zip(on_w, want)], got
        base = int(dst.ctypes.data)
        for i, v in enumerate(want):
            if not on_w[i]:
                a, b = ptrs[i]
                assert bytes(dst[a - base:a - base + caps[i][0]]) + bytes(dst[b - base:b - base + caps[i][1]]) == v
        took = time.monotonic() - t0
    finally:
        os.kill(w.proc.pid, signal.SIGCONT)
    assert rcs == [0] * 120, rcs
    # one transfer timeout each for the put and the read, not one per key
    assert took < 4 * 2.0, f"a put and a read against a stopped peer took {took:.1f} s (timeout 2 s)"
    where = d.batch_get_replica_desc(more)
    assert all(r.segment_name == d.get_hostname() for reps in where.values() for r in reps)
    assert c.get_batch(more) == want
    assert c.get_batch(keys) == want  # the peer is back: nothing was lost


@pytest.mark.timeout(120)
def test_ranged_batch_reads_per_fragment(cluster) -> None:
    _, w, c, d = cluster
    keys = [f"rg/{i}" for i in range(200)]
    vals = _vals(5, 200, 4096)
    assert d.put_batch(keys + ["rg/unread"], vals + [b"x" * 100]) == 0
    descs = d.batch_get_replica_desc(keys)
    assert {r.segment_name for k in keys for r in descs[k]} == {d.get_hostname(), w.hostname}
    dst = np.zeros(4 * MiB, np.uint8)
    base = int(dst.ctypes.data)
    for reader in (c, d):
        assert reader.register_buffer(base, dst.nbytes) == 0
    # key-major: two ranges per key (the second may be empty), then a miss and a range past the end
    names = keys + ["rg/none", keys[0]]
    ptrs = [[base + i * 8192, base + i * 8192 + 4096] for i in range(200)] + [[base], [base + 2 * MiB]]
    offs = [[(i * 13) % 2000, 3000] for i in range(200)] + [[0], [4000]]
    sizes = [[1000 + i, (i % 3) * 500] for i in range(200)] + [[10], [97]]
    for reader in (c, d):
        dst[:] = 0
        got = reader.batch_get_into_multi_buffer_ranges(names, ptrs, sizes, offs)
        assert got == [1000 + i + (i % 3) * 500 for i in range(200)] + [MISSING, INVALID], got
        for i, v in enumerate(vals):
            for (p, o, n) in zip(ptrs[i], offs[i], sizes[i]):
                assert bytes(dst[p - base:p - base + n]) == v[o:o + n], f"{keys[i]} range at {o} read back wrong"
    # buffer-major: per fragment results, a bad fragment next to good ones
    res = c.get_into_ranges([base, base + MiB], [[keys[1], "rg/none"], [keys[2], keys[3]]],
                            [[[0, 100], [200]], [[0], [4096]]], [[[0, 4000], [0]], [[50], [4090]]],
                            [[[100, 96], [8]], [[4000], [7]]])
    assert res == [[[100, 96], [MISSING]], [[4000], [INVALID]]], res
    assert bytes(dst[:100]) == vals[1][:100] and bytes(dst[100:196]) == vals[1][4000:4096]
    assert bytes(dst[MiB:MiB + 4000]) == vals[2][50:4050]
    # leases are per object: a key read by a ranged read is leased, one never read is not
    assert d.batch_remove([keys[3], "rg/unread"]) == [LEASED, 0]
    # with a get session (cached leases) the same reads give the same bytes
    assert c.batch_get_session_start(keys[:50]) == [0] * 50
    dst[:] = 0
    assert c.batch_get_into_multi_buffer_ranges(keys[:50], ptrs[:50], sizes[:50], offs[:50]) == \
        [1000 + i + (i % 3) * 500 for i in range(50)]
    assert bytes(dst[8192 * 7:8192 * 7 + 1007]) == vals[7][(7 * 13) % 2000:(7 * 13) % 2000 + 1007]
    assert c.batch_get_session_end(keys[:50]) == 0
