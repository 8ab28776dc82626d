"""A value removed while its owner was silent must not come back when the owner returns.

Found by bench/robustness/chaos.py (an isolated client outlived --client_ttl): the master expired the
client together with the removal notices it had not delivered yet; when the client came
back it re-mounted and re-reported every object it believed it owned -- including removed
ones, whose ranges the master may meanwhile have handed to other writers (the chaos run
saw foreign bytes there). The owner is SIGSTOPped past client_ttl, a real process."""

from __future__ import annotations

import os
import signal
import time

import pytest

from mooncake_lab.store_procs import payload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MiB = 1 << 20


def test_removed_value_stays_removed_after_its_owner_expired(master_factory, worker_factory,
                                                             client_factory) -> None:
    m = master_factory(client_ttl=2)
    owner = worker_factory(m, 16 * MiB)
    other = client_factory(m)
    data = payload(7, MiB)
    assert owner.cmd(op="put", key="gone", seed=7, size=MiB, preferred=owner.hostname)["rc"] == 0
    assert owner.cmd(op="put", key="kept", seed=8, size=MiB, preferred=owner.hostname)["rc"] == 0
    assert other.get("gone") == data
    os.kill(owner.proc.pid, signal.SIGSTOP)
    try:
        rc = other.remove("gone", force=True)  # force: the read above still holds a lease
        assert rc == 0, rc
        time.sleep(3.5)  # > client_ttl: the master expires the silent owner
    finally:
        os.kill(owner.proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 15
    while other.get("kept") != payload(8, MiB):  # the owner re-mounted and re-reported
        assert time.monotonic() < deadline, f"the owner never came back\n{m.log_tail()}"
        time.sleep(0.2)
    assert other.get("gone") == b"", "a removed value came back with its owner's re-report"
