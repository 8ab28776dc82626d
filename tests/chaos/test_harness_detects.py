"""Integration: the chaos harness's detection path works on a real store, and its network
lab really cuts links.

* A rogue writer (this test) stores values the workers never wrote -- another key's
  value, a value with a write id nobody began, garbage -- and a real chaos worker process
  reads them through the public store API: the checker must call each one foreign.
* netlab: clients in network namespaces reach each other and the host; a partition cuts
  exactly the pair, an isolation everything; healing restores it; nothing is left behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from mooncake_lab import repo_pythonpath
from mooncake_lab.chaos import checker, netlab, payload
from mooncake_lab.chaos.oplog import read_records

pytestmark = pytest.mark.integration
WORKER = ["-m", "mooncake_lab.chaos.worker"]


def test_foreign_values_written_by_a_rogue_are_caught(master_factory, client_factory, python_exe, tmp_path) -> None:
    m = master_factory()
    rogue = client_factory(m, 8 << 20)
    good = payload.encode("chaos-00001", payload.WriteId(7, 0, 0, 1), 4000)
    assert rogue.put("chaos-00000", good) == 0  # chaos-00001's value under chaos-00000
    assert rogue.put("chaos-00001", payload.encode("chaos-00001", payload.WriteId(9, 9, 9, 9), 3000)) == 0
    assert rogue.put("chaos-00002", os.urandom(5000)) == 0
    logdir = tmp_path / "ops"
    logdir.mkdir()
    p = subprocess.Popen([python_exe, *WORKER, "--impl", "ours", "--master", m.addr, "--meta", m.meta,
                          "--host", "127.0.0.1", "--segment", "0", "--keys", "3", "--writer", "0",
                          "--incarnation", "0", "--logdir", str(logdir), "--mix", "get_into=3,get=1",
                          "--threads", "1", "--rate", "100"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": repo_pythonpath()})
    try:
        assert "ready" in p.stdout.readline()
        time.sleep(1.0)
        out, err = p.communicate("", timeout=60)  # stdin closed: the worker stops
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert p.returncode == 0, err[-2000:]
    ops = checker.load_ops(read_records(str(logdir)))
    reads = [o for o in ops if o.op in ("get", "get_into")]
    assert reads, out
    tl = checker.Timeline(t_start=min(o.ts for o in ops), t_end=max(o.te for o in ops))
    r = checker.check(ops, tl)
    assert r["foreign_bytes"] == len(reads), r["foreign"]
    whys = " ".join(f["why"] for f in r["foreign"])
    keys = {o.key for o in reads}
    if "chaos-00000" in keys:
        assert "wrong-key" in whys
    if "chaos-00001" in keys:
        assert "never begun" in whys
    if "chaos-00002" in keys:
        assert "bad-magic" in whys


def test_netlab_partition_and_isolation_cut_real_links() -> None:
    caps = netlab.probe()
    if not caps.netns:
        pytest.skip(f"network namespaces unavailable here: {next(iter(caps.reasons.values()))}")
    lab = netlab.NetLab(3, caps)

    def reach(i: int, dst: str) -> str:
        code = (f"import socket\ntry:\n socket.create_connection(({dst!r}, 9), timeout=0.5)\n print('open')\n"
                "except ConnectionRefusedError:\n print('refused')\nexcept OSError as e:\n print('cut', e)")
        return subprocess.run(lab.exec_prefix(i) + [sys.executable, "-c", code], capture_output=True,
                              text=True, timeout=20).stdout.strip()

    def reach_soon(i: int, dst: str) -> str:  # a healed link may need a new ARP round first
        deadline = time.monotonic() + 10
        while (got := reach(i, dst)) != "refused" and time.monotonic() < deadline:
            time.sleep(0.2)
        return got

    with lab:
        # 'refused' = the packet got there (nothing listens on port 9)
        assert reach(0, lab.ips[1]) == "refused" and reach(0, lab.host_ip) == "refused"
        lab.partition(0, 1)
        assert reach(0, lab.ips[1]).startswith("cut") and reach(1, lab.ips[0]).startswith("cut")
        assert reach(0, lab.ips[2]) == "refused" and reach(0, lab.host_ip) == "refused"
        lab.heal_partition(0, 1)
        assert reach_soon(0, lab.ips[1]) == "refused"
        lab.isolate(2)
        assert reach(2, lab.host_ip).startswith("cut") and reach(2, lab.ips[0]).startswith("cut")
        lab.heal_all()
        assert reach_soon(2, lab.host_ip) == "refused"
        if "slow-link" in caps.allowed:
            lab.shape(1, "slow-link")
            assert reach(1, lab.host_ip) == "refused"  # slower, not cut
            lab.unshape(1)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert lab.tag not in left
    assert lab.bridge not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
