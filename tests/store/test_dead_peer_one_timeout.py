"""A peer that does not answer costs an operation one transfer timeout, not one per retry.

Found by bench/robustness/chaos.py (ops taking twice MC_TRANSFER_TIMEOUT while a client was
SIGSTOPped): a read whose batched transfer timed out was retried key by key on the same
stopped segment (a second full timeout), and a batch put retried every key against it (one
timeout per key). The holder is a real process, stopped; the timeout is 2 s."""

from __future__ import annotations

import os
import signal
import time

import pytest

from mooncake_core.store import ReplicateConfig

from mooncake_lab.store_procs import payload, wait_stopped

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MiB = 1 << 20
TIMEOUT = 2.0


def test_reads_and_batch_puts_wait_for_a_stopped_peer_once(master_factory, worker_factory, client_factory,
                                                          monkeypatch) -> None:
    monkeypatch.setenv("MC_FORCE_TCP", "1")  # a tcp transfer waits for the stopped peer (cma would not)
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", str(TIMEOUT))
    m = master_factory(client_ttl=60)
    holder = worker_factory(m, 16 * MiB)
    c = client_factory(m)
    assert holder.cmd(op="put", key="k", seed=1, size=MiB, preferred=holder.hostname)["rc"] == 0
    assert c.get("k") == payload(1, MiB)
    cfg = ReplicateConfig()
    cfg.preferred_segment = holder.hostname
    os.kill(holder.proc.pid, signal.SIGSTOP)
    try:
        wait_stopped(holder.proc.pid)
        t0 = time.monotonic()
        assert c.get("k") == b""
        took = time.monotonic() - t0
        assert took < 1.6 * TIMEOUT, f"a read of a stopped peer took {took:.1f}s (timeout {TIMEOUT}s)"
        keys = [f"b{i}" for i in range(6)]
        t0 = time.monotonic()
        rcs = c.put_batch(keys, [payload(10 + i, 256 << 10) for i in range(6)], cfg)
        took = time.monotonic() - t0
        assert rcs != 0
        assert took < 1.6 * TIMEOUT, f"a batch put to a stopped peer took {took:.1f}s (timeout {TIMEOUT}s)"
    finally:
        os.kill(holder.proc.pid, signal.SIGCONT)
    assert c.get("k") == payload(1, MiB)  # the peer is back: nothing was lost
