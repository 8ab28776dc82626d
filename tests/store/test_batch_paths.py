"""Batches as batches (issue 18): the packed put/get path, per key.

A real ``mooncake_master`` process, a worker process with its own segment, a client in this
process with a segment (own-segment copy path) and one without (pool only: every byte
crosses the transfer engine). Batches mix keys that succeed with keys that fail (already
there, too big, leased), land on several segments, interleave misses; every result is checked
per key and in order, bytes byte for byte, and the worker re-reads objects across processes.
"""

from __future__ import annotations

import numpy as np
import pytest

from mooncake_core.store import ReplicateConfig

from .helpers import payload, sha

pytestmark = pytest.mark.integration

MiB = 1 << 20
INVALID, EXISTS, MISSING, LEASED = -600, -705, -704, -706


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
