"""A holder SIGKILLed or stopped: the puts right after it all succeed, placed on the live ones.

Its segment stays mounted at the master until its client_ttl, and random placement (the
default) keeps giving it its share of new puts; the writer's write there fails because the
peer is unreachable (the connection refused; or no answer within the transfer timeout), and
the writer puts those keys once more with ``avoid_segments`` naming it
(``WritePath._retry_elsewhere``); the master then places everyone's puts there last until
its owner heartbeats again."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

from mooncake_core.store import ReplicateConfig

from mooncake_lab.store_procs import payload, wait_stopped

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MiB = 1 << 20
TIMEOUT = 2.0


def _retried_away_from(caplog: pytest.LogCaptureFixture, segment: str) -> bool:
    return any("placing them elsewhere" in r.getMessage() and segment in r.getMessage() for r in caplog.records)


def test_puts_after_a_holder_dies_all_succeed(master_factory, worker_factory, client_factory, monkeypatch,
                                              caplog) -> None:
    monkeypatch.setenv("MC_FORCE_TCP", "1")  # a tcp write waits for a stopped peer (cma would not)
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", str(TIMEOUT))
    m = master_factory(client_ttl=60)  # the dead holder's segment stays mounted throughout
    holders = [worker_factory(m, 16 * MiB) for _ in range(3)]
    c = client_factory(m)  # no segment of its own: every replica is a remote write
    assert c.put("warm", payload(1, 1000)) == 0  # the writer has met the master and placed once
    dead = holders[0]
    dead.proc.send_signal(signal.SIGKILL)
    dead.proc.wait()
    caplog.set_level(logging.INFO, logger="mooncake.store.client")
    want = {f"k{i}": payload(100 + i, 64 << 10) for i in range(40)}
    keys = list(want)
    for k in keys[:20]:
        assert c.put(k, want[k]) == 0, f"put {k} after a holder died"
    assert c.put_batch(keys[20:], [want[k] for k in keys[20:]]) == 0
    wrong = [k for k in keys if c.get(k) != want[k]]
    assert wrong == [], f"{len(wrong)} of 40 objects read back wrong or missing: {wrong[:5]}"
    # the dead segment was given puts (and they were placed again), not skipped by chance
    assert _retried_away_from(caplog, dead.hostname)

    # a holder that stops answering: the put preferring it waits out one timeout, then goes
    # to the live holder; the next ones go there at once (it is placed last now)
    stopped = holders[1]
    cfg = ReplicateConfig()
    cfg.preferred_segment = stopped.hostname
    os.kill(stopped.proc.pid, signal.SIGSTOP)
    try:
        wait_stopped(stopped.proc.pid)
        t0 = time.monotonic()
        assert c.put("s0", payload(7, 64 << 10), cfg) == 0
        assert time.monotonic() - t0 < 2.0 * TIMEOUT
        assert _retried_away_from(caplog, stopped.hostname)
        t0 = time.monotonic()
        assert c.put_batch([f"s{i}" for i in range(1, 6)], [payload(7 + i, 4096) for i in range(1, 6)]) == 0
        assert time.monotonic() - t0 < 0.5 * TIMEOUT
        assert c.get("s0") == payload(7, 64 << 10) and c.get("s5") == payload(12, 4096)
    finally:
        os.kill(stopped.proc.pid, signal.SIGCONT)
