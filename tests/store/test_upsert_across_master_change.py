"""An upsert whose write spans a master restart must not be acknowledged unless it was
published (found by bench/robustness/chaos.py: an upsert returned 0 while the old value stayed).

The new master does not know the put in progress; when the key is back by then (its old
owner re-reported it) ``put_end`` publishes nothing and answers "already complete". For an
upsert that means the caller's value was lost: the call must fail, not return 0 while every
reader keeps getting the old value. The segment the upsert writes into is SIGSTOPped to
hold a real tcp write open across a real master restart."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from mooncake_core.store import ReplicateConfig
from mooncake_core.store.master_client import MasterClient

from mooncake_lab.store_procs import payload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MiB = 1 << 20


def test_upsert_lost_in_a_master_restart_is_not_acknowledged(master_factory, worker_factory, client_factory,
                                                            monkeypatch) -> None:
    monkeypatch.setenv("MC_FORCE_TCP", "1")  # the write must wait for the stopped target (cma would not)
    m = master_factory(client_ttl=30)
    owner = worker_factory(m, 16 * MiB)  # holds the old value in its own segment: re-reports it
    target = worker_factory(m, 16 * MiB)  # the upsert's new replica goes here
    writer = client_factory(m)
    old = payload(1, 2 * MiB)
    assert owner.cmd(op="put", key="k", seed=1, size=len(old), preferred=owner.hostname)["rc"] == 0
    assert writer.get("k") == old

    new = payload(2, 4 * MiB)
    cfg = ReplicateConfig()
    cfg.preferred_segment = target.hostname
    rcs: list[int] = []
    os.kill(target.proc.pid, signal.SIGSTOP)
    try:
        t = threading.Thread(target=lambda: rcs.append(writer.upsert("k", new, cfg)))
        t.start()
        time.sleep(0.5)  # upsert_start done, the write is stuck on the stopped target
        m.stop(sig=signal.SIGKILL)
        m.start()
        deadline = time.monotonic() + 15
        with MasterClient(m.addr, timeout=2.0) as mc:
            while not mc.exist_key("k"):  # the owner re-mounted and re-reported the old value
                assert time.monotonic() < deadline, f"old value never re-reported\n{m.log_tail()}"
                time.sleep(0.1)
    finally:
        os.kill(target.proc.pid, signal.SIGCONT)
    t.join(60)
    assert rcs, "upsert did not return"
    got = writer.get("k")
    if rcs[0] == 0:
        assert got == new, "upsert acknowledged (0) but readers still get the old value: the write was lost"
    else:
        assert got in (old, b""), "a failed upsert must leave the old value (or none)"
        assert rcs[0] < 0
