"""Batch puts in one master round trip (``MasterState.batch_put_commit``): a client's next
batch is written into ranges the master reserved for it when the previous batch was
published. Real master, real worker processes, real sockets."""

from __future__ import annotations

import ctypes
import logging

import pytest

from mooncake_core.store import reservations
from mooncake_core.store.master_batch import batch_reservation_key
from mooncake_core.store.master_client import MasterClient

from mooncake_lab.store_procs import payload, restart_master, sha

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MiB = 1 << 20


def want(v: bytes) -> dict:
    return {"len": len(v), "sha": sha(v)}


def test_batches_through_reservations_read_back_everywhere(cluster) -> None:
    m, w, c, d = cluster
    for client in (c, d):  # without memory (vectored TE writes), and with its own segment (copies)
        tag = id(client)
        vals: dict[str, bytes] = {}
        for b in range(6):  # the same sizes batch after batch; batch 4 changes them (a new reservation)
            size = 3000 if b == 4 else 1024
            batch = {f"{tag}-{b}-{i}": payload(b * 100 + i, size + i) for i in range(20)}
            assert client.put_batch(list(batch), list(batch.values())) == 0
            vals.update(batch)
            if b == 0:
                assert client._core.writes.batch.current is not None, "the first batch asks for a reservation"
        for k, v in vals.items():
            assert w.cmd(op="get", key=k) == want(v), k
        got = client.get_batch(list(vals))
        assert [sha(g) for g in got] == [sha(v) for v in vals.values()]
    # per-key codes through a reservation: an existing key is success and keeps its old value
    resv = d._core.writes.batch.current
    assert resv is not None
    old_key = next(k for k in vals if k.startswith(f"{id(d)}-5-"))
    keys = [f"{id(d)}-again-{i}" for i in range(20)]
    keys[3] = old_key
    news = [payload(7000 + i, 1024 + i) for i in range(20)]
    rcs = d.batch_put_from(keys, [ctypes.cast(ctypes.c_char_p(v), ctypes.c_void_p).value for v in news],
                           [len(v) for v in news])
    assert rcs == [0] * 20
    assert d._core.writes.batch.current is not resv, "the batch went through the reservation and got the next one"
    with MasterClient(m.addr) as mc:
        assert mc.get_replica_list(keys[0]).replicas[0].addr == int(resv.addrs[0])
    assert w.cmd(op="get", key=old_key) == want(vals[old_key]), "the old value stays"
    for i, k in enumerate(keys):
        if i != 3:
            assert w.cmd(op="get", key=k) == want(news[i]), k
    with MasterClient(m.addr) as mc:
        assert not mc.exist_key(batch_reservation_key(d._core.client_id)), "a reservation is never visible"


def test_a_batch_reservation_the_master_forgot_falls_back_to_put_start(master_factory, worker_factory,
                                                                       client_factory, monkeypatch, caplog) -> None:
    """The master restarts between two batches of a client without memory: the stale batch
    reservation is refused (-704) and the batch takes batch_put_start, so it still lands and
    reads back. The age limit is lifted so the stale reservation is really tried; the batch
    waits out the new master's recovery hold first (see test_single_put_reservation)."""
    monkeypatch.setattr(reservations, "RESERVATION_MAX_AGE_S", 120.0)
    m = master_factory(client_ttl=30, recovery_hold_ms=500)
    w = worker_factory(m, 16 * MiB)
    c = client_factory(m)
    first = [payload(i, 2048) for i in range(8)]
    assert c.put_batch([f"a{i}" for i in range(8)], first) == 0
    assert c._core.writes.batch.current is not None
    restart_master(m)  # the worker re-mounts its segment; then past the recovery hold
    caplog.set_level(logging.DEBUG, logger="mooncake.store.client")
    second = [payload(100 + i, 2048) for i in range(8)]
    assert c.put_batch([f"b{i}" for i in range(8)], second) == 0
    assert "batch reservation refused" in caplog.text, "the stale reservation was not tried"
    for i, v in enumerate(second):
        assert w.cmd(op="get", key=f"b{i}") == want(v)
    third = [payload(200 + i, 2048) for i in range(8)]
    assert c.put_batch([f"c{i}" for i in range(8)], third) == 0, "and a new reservation from the new master"
    assert [sha(g) for g in c.get_batch([f"c{i}" for i in range(8)])] == [sha(v) for v in third]


def test_a_reused_list_of_sizes_does_not_reuse_a_reservation_made_for_others(cluster) -> None:
    """batch_put_from with one list of sizes changed in place between calls: the second batch
    is not written into ranges laid out for the first one's sizes."""
    m, w, c, d = cluster
    small = [payload(300 + i, 1024) for i in range(8)]
    big = [payload(400 + i, 4096) for i in range(8)]
    bufs = [ctypes.create_string_buffer(v, len(v)) for v in small + big]
    addr = [ctypes.addressof(b) for b in bufs]
    sizes = [1024] * 8
    assert d.batch_put_from([f"s{i}" for i in range(8)], addr[:8], sizes) == [0] * 8
    sizes[:] = [4096] * 8  # the same list object, other sizes
    assert d.batch_put_from([f"b{i}" for i in range(8)], addr[8:], sizes) == [0] * 8
    for i in range(8):
        assert w.cmd(op="get", key=f"s{i}") == want(small[i])
        assert w.cmd(op="get", key=f"b{i}") == want(big[i])
