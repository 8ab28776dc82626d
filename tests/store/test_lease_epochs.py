"""Reads under a lease of a master that has since been replaced.

A new master (restart or HA failover) does not know the read leases its predecessor granted.
It holds re-mounted segments for ``--recovery_hold_ms``; a reader whose copy took longer than
``GetReply.confirm_after_ms`` pings the master afterwards and discards its bytes when the
epoch changed (-707; the client then reads the key once more under a fresh lease). The owner process is SIGSTOPped to stretch a real
tcp read across a real master restart."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import httpx
import pytest

from mooncake_lab.store_procs import payload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MiB = 1 << 20


def _pings(m) -> float:
    text = httpx.get(f"http://127.0.0.1:{m.metrics_port}/metrics", timeout=5).text
    got = re.search(r'mooncake_master_rpc_seconds_count\{method="ping"\} (\S+)', text)
    return float(got.group(1)) if got else 0.0


def _slow_get(reader, key: str, owner_pid: int, stall_s: float, during=None) -> bytes:
    """``reader.get(key)`` while the owner of the bytes is stopped for ``stall_s``."""
    out: list[bytes] = []
    os.kill(owner_pid, signal.SIGSTOP)
    try:
        t = threading.Thread(target=lambda: out.append(reader.get(key)))
        t0 = time.monotonic()
        t.start()
        time.sleep(0.3)
        if during is not None:
            during()
        # the owner stays stopped a while after ``during`` returns, however long it took (a master
        # restart on a loaded box can take seconds): the read must still be in flight when
        # ``during`` has taken its measurements
        time.sleep(max(0.5, stall_s - (time.monotonic() - t0)))
    finally:
        os.kill(owner_pid, signal.SIGCONT)
    t.join(30)
    assert out, "get did not return"
    return out[0]


def test_long_read_is_confirmed_with_the_same_master(master_factory, worker_factory, client_factory,
                                                     monkeypatch) -> None:
    monkeypatch.setenv("MC_FORCE_TCP", "1")  # a tcp read waits for the stopped owner (cma would not)
    m = master_factory(recovery_hold_ms=1000)
    a = worker_factory(m, 16 * MiB)
    reader = client_factory(m)
    data = payload(11, 4 * MiB)
    assert a.cmd(op="put", key="k", seed=11, size=len(data))["rc"] == 0
    assert reader.get("k") == data  # quick read: no confirmation
    before = _pings(m)
    assert reader.get("k") == data
    assert _pings(m) == before
    got = _slow_get(reader, "k", a.proc.pid, 1.5)  # > 800 ms: confirmed by one ping, same epoch
    assert got == data
    assert _pings(m) == before + 1


def test_long_read_across_a_master_restart_is_discarded(master_factory, worker_factory, client_factory,
                                                        monkeypatch) -> None:
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    m = master_factory(recovery_hold_ms=1000, client_ttl=30)
    a = worker_factory(m, 16 * MiB)
    reader = client_factory(m)
    data = payload(12, 4 * MiB)
    assert a.cmd(op="put", key="k", seed=12, size=len(data))["rc"] == 0
    assert reader.get("k") == data

    pings_after_restart: list[float] = []

    def restart() -> None:
        m.stop(sig=signal.SIGKILL)
        m.start()
        pings_after_restart.append(_pings(m))

    # the lease came from the first master; the read ends under the second: its bytes are
    # discarded (confirmed by exactly one ping) and the key read once more under a fresh
    # lease -- a miss until the owner re-reports it, the right bytes after
    got = _slow_get(reader, "k", a.proc.pid, 2.5, during=restart)
    assert got in (b"", data), "wrong bytes"
    assert _pings(m) == pings_after_restart[0] + 1
    deadline = time.monotonic() + 15
    while (got := reader.get("k")) != data:
        assert got == b"", "wrong bytes"
        assert time.monotonic() < deadline, f"object never came back\n{m.log_tail()}"
        time.sleep(0.2)
