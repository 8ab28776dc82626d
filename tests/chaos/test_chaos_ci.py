"""Integration: a ~50-second chaos run of our store (HA pair on a 3-member etcd, 4 clients,
every fault kind this machine allows; a 3 s transfer timeout so that pauses and network
faults of up to 4 s outlast it now and then) must serve no foreign bytes, have no hang,
and recover from every fault. A shorter run does the same with the HA pair electing its leader
on Redis instead of etcd. The full table is printed (see it with ``pytest -s``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NET_KINDS = ("partition", "isolate", "slow-link", "delay", "loss")


def _require(binary: str, package: str) -> None:
    if not shutil.which(binary):
        msg = f"{binary} not installed (run scripts/install.sh: apt-get install {package})"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


def _run(tmp_path, *extra: str, duration: int, clients: int) -> tuple[dict, subprocess.CompletedProcess]:
    out = tmp_path / "chaos.json"
    cmd = [sys.executable, "-m", "bench.robustness.chaos", "--duration", str(duration), "--warmup", "4",
           "--ha", *extra, "--clients", str(clients), "--threads", "2", "--gap", "0.5,1.5", "--pause", "0.5,4",
           "--net-fault", "1,4", "--transfer-timeout", "3", "--seed", "14", "--json", str(out),
           "--workdir", str(tmp_path / "run")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    print(p.stdout[-8000:])
    assert out.exists(), f"no report (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return json.loads(out.read_text())["runs"][0], p


def _check(run: dict, p: subprocess.CompletedProcess, tmp_path, min_ops: int, min_faults: int) -> None:
    c = run["check"]
    logs = f"(logs in {tmp_path / 'run'})"
    assert c["foreign_bytes"] == 0, f"foreign bytes served: {c['foreign'][:5]} {logs}"
    assert c["hangs"] == 0, f"hangs: {c['hang_list'][:5]} {logs}"
    assert p.returncode == 0, p.stderr[-3000:]
    assert c["ops_total"] > min_ops, f"too little load to mean anything: {c['ops_total']} ops"
    # the deck deals every enabled kind once before repeating one
    injected = run["faults"]
    total = sum(injected.values())
    assert total >= min_faults, f"only {total} faults: {injected} {run['fault_errors']}"
    assert len(injected) == min(total, len(run["faults_enabled"])), (injected, run["faults_enabled"])
    assert not run["fault_errors"], run["fault_errors"]
    # every network kind either ran or was skipped with the machine's reason, never silently
    for k in NET_KINDS:
        assert k in run["faults_enabled"] or run["faults_skipped"].get(k), f"{k}: neither run nor explained"
    rec = c["recovery"]["all"]
    assert rec["recovered"] == rec["n"], f"faults without recovery: {c['recovery']['faults']}"
    # every stale read has an explanation (the documented failover window)
    assert c["stale_unexplained"] == 0, c["stale"][:5]
    # no process of ours crashed on its own (a master stepping down after a lost lease is allowed)
    crashes = {n: p["unexpected_exits"] for n, p in run["procs"].items()
               if any(e["event"] == "crashed" for e in p["unexpected_exits"])}
    assert not crashes, crashes


def test_chaos_run_no_foreign_bytes_no_hangs(tmp_path) -> None:
    _require("etcd", "etcd-server")
    run, p = _run(tmp_path, duration=50, clients=4)
    _check(run, p, tmp_path, min_ops=2000, min_faults=6)


def test_chaos_run_with_redis_ha_no_foreign_bytes_no_hangs(tmp_path) -> None:
    """HA without etcd: the masters elect their leader on Redis (which also holds the metadata);
    kill-master and pause-master hit the leader."""
    _require("redis-server", "redis-server")
    run, p = _run(tmp_path, "--ha-backend", "redis", duration=30, clients=3)
    _check(run, p, tmp_path, min_ops=1000, min_faults=4)
    assert "pause-etcd-leader" in run["faults_skipped"]
    assert {"kill-master", "pause-master"} <= set(run["faults_enabled"])
