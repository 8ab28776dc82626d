"""Reservations and quarantine never make a put fail, nor evict anyone's object, while the
space they hold could serve it -- the shape found running the store as a user would: a
client without memory of its own stores 64 MiB objects with ``put_from`` into a worker's
512 MiB segment, reads each back (leased: not evictable), a few MiB of small objects beside
them, single puts and batches mixed, a pause between puts (so the reservation it holds is too
old to use). Real master, real worker process, real sockets."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
MiB = 1 << 20
BIG = 64 * MiB


@pytest.fixture
def pool(master_factory, worker_factory, client_factory):
    m = master_factory(default_kv_lease_ttl=120_000)  # every object read stays leased
    worker_factory(m, 512 * MiB)
    c = client_factory(m)
    src = np.frombuffer(np.random.default_rng(7).bytes(BIG), np.uint8).copy()
    out = np.empty(BIG, np.uint8)
    for a in (src, out):
        assert c.register_buffer(a.ctypes.data, a.nbytes) == 0
    yield c, src, out
    for a in (src, out):
        c.unregister_buffer(a.ctypes.data)


def smalls(c, src) -> list[str]:
    """A few MiB of small objects, by single puts and a batch: the client now holds
    reservations of both kinds."""
    keys = [f"s{i}" for i in range(3)]
    for k in keys:
        assert c.put_from(k, src.ctypes.data, 256 << 10) == 0
    bk = [f"b{i}" for i in range(8)]
    assert c.batch_put_from(bk, [src.ctypes.data + i * 65536 for i in range(8)], [65536] * 8) == [0] * 8
    return keys + bk


def check(c, out, key: str, want: np.ndarray) -> None:
    n = c.get_into(key, out.ctypes.data, len(want))
    assert n == len(want), f"{key}: {n}"
    assert np.array_equal(out[:len(want)], want), f"{key}: wrong bytes"


def test_single_put_from_of_64mib_fills_the_pool_before_any_refusal(pool, caplog) -> None:
    c, src, out = pool
    small = smalls(c, src)
    for i in range(7):  # 7 x 64 MiB + the small ones fit 512 MiB: none may be refused
        src[:8] = i
        assert c.put_from(f"big{i}", src.ctypes.data, BIG) == 0, f"big{i} refused"
        check(c, out, f"big{i}", src)
        assert all(c.is_exist(k) == 1 for k in small), f"an object was evicted for big{i}"
        time.sleep(0.6)  # the reservation the client holds gets too old to use
    caplog.set_level(logging.WARNING, logger="mooncake.store.client")
    assert c.put_from("big7", src.ctypes.data, BIG) == -200, "the pool is full of leased objects"
    assert "held per segment" in caplog.text and "leased" in caplog.text, caplog.text
    for i in range(7):
        src[:8] = i
        check(c, out, f"big{i}", src)


def test_batch_put_from_fills_the_pool_before_any_refusal(pool) -> None:
    c, src, out = pool
    small = smalls(c, src)
    half, quarter = BIG // 2, BIG // 4
    for i in range(7):  # per round 64 MiB: a 32 MiB single put, a batch of two 16 MiB objects
        src[:8] = i
        assert c.put_from(f"p{i}", src.ctypes.data, half) == 0, f"p{i} refused"
        keys = [f"h{i}a", f"h{i}b"]
        assert c.batch_put_from(keys, [src.ctypes.data, src.ctypes.data + quarter], [quarter, quarter]) \
            == [0, 0], f"batch {i} refused"
        check(c, out, f"p{i}", src[:half])
        check(c, out, keys[0], src[:quarter])
        check(c, out, keys[1], src[quarter:half])
        assert all(c.is_exist(k) == 1 for k in small), f"an object was evicted in round {i}"
        time.sleep(0.6)  # the reservations the client holds get too old to use
    # what is left (~62 MiB, leased objects everywhere else) takes one more 32 MiB object
    assert c.batch_put_from(["last1", "last2"], [src.ctypes.data, src.ctypes.data + half], [half, half]) \
        == [0, -200]
