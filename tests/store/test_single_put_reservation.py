"""Single puts in one master round trip (``MasterState.put_commit``): a client's next put is
written into a range the master reserved for it at the previous put's commit. Real master,
real worker processes, real sockets."""

from __future__ import annotations

import logging

import pytest

from mooncake_core.store import reservations
from mooncake_core.store.master_client import MasterClient
from mooncake_core.store.master_state import RESERVATION_PREFIX

from mooncake_lab.store_procs import payload, restart_master, sha


def wget(w, key: str) -> dict:
    return w.cmd(op="get", key=key)


def want(v: bytes) -> dict:
    return {"len": len(v), "sha": sha(v)}

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MiB = 1 << 20


def test_puts_through_reservations_read_back_everywhere(cluster) -> None:
    m, w, c, d = cluster
    vals = {f"k{i}": payload(i, 1024 + (i % 3) * 512) for i in range(30)}  # size changes: new reservations
    for client in (c, d):  # without memory (into the worker or d), and with its own segment
        for k, v in vals.items():
            assert client.put(f"{id(client)}-{k}", v) == 0
    for client in (c, d):
        for k, v in vals.items():
            assert wget(w, f"{id(client)}-{k}") == want(v), k
    assert d._core.writes.single.current is not None, "a client that keeps putting holds a reservation"
    # an existing key through a reservation: success, the old value stays, the reservation too
    key = f"{id(d)}-k0"
    assert d.put("fresh", payload(98, len(vals["k0"]))) == 0  # a young reservation of this size
    resv = d._core.writes.single.current
    assert resv is not None and resv.size == len(vals["k0"])
    assert d.put(key, payload(99, len(vals["k0"]))) == 0
    assert wget(w, key) == want(vals["k0"])
    assert d._core.writes.single.current is resv
    with MasterClient(m.addr) as mc:
        assert not mc.exist_key(RESERVATION_PREFIX + d._core.client_id), "a reservation is never visible"


def test_a_reservation_the_master_forgot_falls_back_to_put_start(master_factory, worker_factory, client_factory,
                                                                 monkeypatch, caplog) -> None:
    """The master restarts between two puts of a client without memory: the stale
    reservation is refused (-704) and the put takes put_start, so it still lands and reads
    back (what ``c`` wrote before is lost with the old master: only a segment's owner
    re-reports, and a miss is allowed). The age limit is lifted so the stale reservation is really tried; the puts wait
    out the new master's recovery hold first (within the hold nothing is allocated, which is
    what makes such a late write harmless)."""
    monkeypatch.setattr(reservations, "RESERVATION_MAX_AGE_S", 120.0)
    m = master_factory(client_ttl=30, recovery_hold_ms=500)
    w = worker_factory(m, 16 * MiB)
    c = client_factory(m)
    a, b = payload(1, 4096), payload(2, 4096)
    assert c.put("a", a) == 0 and c.put("a2", a) == 0
    assert c._core.writes.single.current is not None
    restart_master(m)  # the worker re-mounts its segment; then past the recovery hold
    caplog.set_level(logging.DEBUG, logger="mooncake.store.client")
    assert c.put("b", b) == 0
    assert "reservation refused" in caplog.text, "the stale reservation was not tried"
    assert wget(w, "b") == want(b)
    assert c.put("b2", b) == 0 and wget(w, "b2") == want(b)
