"""``mooncake_doctor`` end to end (real processes, real sockets): against a dead metadata service
it exits non-zero naming the service and the fix; against a live master, its metadata server and
a peer store client it passes every step (a 4 KiB read from the peer included), exit 0, and
``--json`` parses. The verdict logic itself: tests/unit/test_doctor_checks.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mooncake_core.utils.net import free_port
from mooncake_lab.store_procs import Master, make_client

pytestmark = pytest.mark.integration


def _doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mooncake_core.cli.doctor", *args], capture_output=True,
                          text=True, timeout=60)


def test_dead_metadata_service_fails_naming_it_and_the_fix() -> None:
    dead = f"http://127.0.0.1:{free_port()}/metadata"
    out = _doctor("--metadata_server", dead, "--timeout", "1")
    assert out.returncode == 1, out.stdout + out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("[FAIL] 1. metadata service reachable") and dead in first, out.stdout
    assert "fix: start the metadata service" in out.stdout
    assert "1 check(s) failed: metadata service reachable" in out.stdout


def test_protocol_and_device_name_reach_the_checked_engine() -> None:
    """--protocol rdma --device_name start the checked engine with them: a NIC that exists passes;
    an unknown one fails the engine step with the engine's message naming it (the NIC check runs
    only under protocol rdma, so both values arrived)."""
    out = _doctor("--protocol", "rdma", "--device_name", "lo", "--timeout", "1", "--json")
    by = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert by["RPC port reachable"]["status"] == "ok", out.stdout + out.stderr
    out = _doctor("--protocol", "rdma", "--device_name", "no_such_nic0", "--timeout", "1")
    assert out.returncode == 1
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("[FAIL] 4. RPC port reachable"))
    assert "protocol 'rdma', device_name 'no_such_nic0'" in line and "unknown device(s) no_such_nic0" in line
    assert "[SKIP] 8. transports: no Transfer Engine started" in out.stdout


def test_live_master_and_peer_pass_and_json_parses(python_exe, tmp_path) -> None:
    master = Master(python_exe, str(tmp_path)).start()
    peer = make_client(master, 1 << 20)
    try:
        seg = peer._core.segment_name
        out = _doctor("--metadata_server", master.meta, "--master_server_address", master.addr,
                      "--peer", seg, "--json")
        report = json.loads(out.stdout)
        by = {c["name"]: c for c in report["checks"]}
        assert out.returncode == 0 and report["ok"], out.stdout + out.stderr
        assert by["metadata service reachable"]["status"] == "ok"
        assert by["master reachable, auth accepted"]["status"] == "ok"
        assert by["master reachable, auth accepted"]["data"]["rpc_address"] == master.addr
        assert by["advertised address"]["data"]["address"] == "127.0.0.1"  # the route toward 127.0.0.1
        assert by["RPC port reachable"]["status"] == "ok"
        rt = by["4 KiB round trip to the peer"]
        assert rt["status"] == "ok" and rt["data"]["seconds"] < 5, rt
        assert by["clock offset against the master"]["status"] == "ok"  # same host: same clock
        assert abs(by["clock offset against the master"]["data"]["offset_s"]) < 0.5
        assert not [c for c in report["checks"] if c["status"] == "fail"]
        # a peer that does not exist: that step fails, naming the segment and the fix
        out = _doctor("--metadata_server", master.meta, "--master_server_address", master.addr,
                      "--peer", "127.0.0.1:1", "--timeout", "1")
        assert out.returncode == 1 and "[FAIL] 5. 4 KiB round trip to the peer" in out.stdout, out.stdout
        assert "127.0.0.1:1" in out.stdout
    finally:
        peer.close()
        master.stop()
