"""The NIXL backend ``MooncakeCore`` under real nixl 1.5.1: two agents in one process, and in two
processes exchanging metadata as bytes. The NIXL side runs in a framework venv (nixl_side.py);
these tests assert on what it observed in real buffers."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from mooncake_lab.checkout_shim import shim_pythonpath
from nixl_testkit import HERE, require, run_py
from mooncake_connectors.nixl.config import PARAMS

pytestmark = pytest.mark.integration
SIDE = str(HERE / "nixl_side.py")


def scenario_with_log(py: str, env: dict, name: str) -> tuple[dict, str]:
    """The scenario's observations and its stderr (where the engine's log lines go)."""
    r = run_py(py, SIDE, name, env=env, timeout=180)
    assert r.returncode == 0, f"{name} failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def scenario(py: str, env: dict, name: str) -> dict:
    return scenario_with_log(py, env, name)[0]


def test_listed_beside_the_bundled_backends(nixl_py, plugin_env) -> None:
    out = scenario(nixl_py, plugin_env, "plugins")
    assert "MooncakeCore" in out["plugins"] and "UCX" in out["plugins"] and "POSIX" in out["plugins"]
    assert out["mems"] == ["DRAM_SEG", "VRAM_SEG"] and out["backend_mems"] == ["DRAM_SEG", "VRAM_SEG"]
    # the C++ plugin's advertised defaults are the Python adapter's (config.PARAMS)
    assert out["params"] == {k: v[0] for k, v in PARAMS.items()}
    assert out["created"] == ["MooncakeCore", "UCX"]


def test_vram_listed_but_refused_without_a_gpu_transport(nixl_py, plugin_env) -> None:
    """NIXL itself routes a VRAM registration to MooncakeCore (it lists VRAM); on a host whose
    engine has no GPU transport it fails with the engine's reason, and the agent stays usable."""
    from mooncake_core.transfer import device_memory
    if device_memory.copier_for("cuda") is not None:
        pytest.skip("this host has a CUDA device: tests/gpu/test_nixl_vram.py covers VRAM here")
    out, log = scenario_with_log(nixl_py, plugin_env, "vram_without_gpu")
    assert out["backend_mems"] == ["DRAM_SEG", "VRAM_SEG"]
    assert out["vram"] == "nixlBackendError" and out["dram_after"] == ""
    assert "NIXL registerMem of VRAM (GPU 0) failed: location 'cuda:0'" in log
    assert "GPU memory needs the cuda plugin" in log  # what is missing and where the fix is documented


def test_protocol_and_device_name_reach_the_engine(nixl_py, plugin_env) -> None:
    """Backend params protocol="rdma", device_name="lo" start the engine's UCX transport on that
    NIC only (its no-RDMA warning lists the lanes it got), bytes move; an unknown NIC fails
    backend creation with the engine's message naming it."""
    out, log = scenario_with_log(nixl_py, plugin_env, "protocol")
    assert out["write"] == "DONE" and out["equal"]
    warned = [ln for ln in log.splitlines() if "protocol 'rdma' asked" in ln]
    assert len(warned) == 2 and all("tcp/lo" in ln and "tcp/eth" not in ln for ln in warned), log[-3000:]
    assert out["unknown_nic"] == "nixlBackendError"
    assert "'rdma', 'no_such_nic0') failed: device_name 'no_such_nic0': unknown device" in log


def test_scattered_write_and_read_byte_exact_with_notification(nixl_py, plugin_env) -> None:
    out = scenario(nixl_py, plugin_env, "write_read")
    assert out["first"] in ("PROC", "DONE") and out["write"] == "DONE" and out["read"] == "DONE"
    assert out["pieces"] == 97
    assert out["received"] == out["sent"] and out["read_back"] == out["sent"]
    assert out["dst_rest_zero"] and out["back_rest_zero"]  # nothing written outside the descriptors
    assert out["notifs"] == {"A": ["written:1"]}  # keyed by the sender's agent name


def test_standalone_notifications(nixl_py, plugin_env) -> None:
    out = scenario(nixl_py, plugin_env, "notifs")
    assert out["got"] == {"A": out["want"]}  # binary-safe, in order, 5,000-byte message included
    assert out["back"] == {"B": ["back"]} and out["own"] == {"A": ["self"]}


def test_reposting_a_handle(nixl_py, plugin_env) -> None:
    out = scenario(nixl_py, plugin_env, "repost")
    assert [r["state"] for r in out["rounds"]] == ["DONE"] * 4
    assert all(r["equal"] for r in out["rounds"])
    assert [r["notif"] for r in out["rounds"]] == [["n0"], ["n1"], ["n2"], ["n3"]]


def test_releasing_in_flight_handles(nixl_py, plugin_env) -> None:
    out = scenario(nixl_py, plugin_env, "release_inflight")
    assert out["release_errors"] == ["", "", ""]
    assert out["after"] == "DONE" and out["after_equal"]


def test_remove_remote_agent(nixl_py, plugin_env) -> None:
    out = scenario(nixl_py, plugin_env, "remove_remote")
    assert out["first"] == "DONE"
    assert out["repost_after_remove"] and out["new_after_remove"] and out["notif_after_remove"]
    assert out["again"] == "DONE" and out["again_equal"]


def test_errors_are_statuses_not_crashes(nixl_py, plugin_env) -> None:
    out = scenario(nixl_py, plugin_env, "errors")
    assert out["unknown_peer"] == "nixlNotFoundError" and out["unknown_peer_notif"] == "nixlNotFoundError"
    assert out["unregistered_range"] == "nixlNotFoundError"
    # deregistered on the target after the initiator loaded its metadata: our engine refuses
    assert out["stale_range_post"] == "" and out["stale_range_state"].startswith("ERR")
    assert out["dst_untouched"]


class Peer:
    """One nixl_side.py role in its own process, spoken to over stdin/stdout lines."""

    def __init__(self, py: str, role: str, env: dict):
        self.proc = subprocess.Popen([py, SIDE, role], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=dict(os.environ, **env))

    def read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()  # each role answers within its own bounded waits
            if not line:
                raise AssertionError(f"peer exited: {self.proc.stderr.read()[-4000:]}")
            if line.startswith("{"):  # libraries may print other lines to stdout
                return json.loads(line)

    def send(self, tag: str, value: str = "") -> None:
        self.proc.stdin.write(f"{tag} {value}\n")
        self.proc.stdin.flush()

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.mark.parametrize("transport", ["same-host", "tcp"])
def test_two_processes(nixl_py, plugin_env, transport) -> None:
    env = dict(plugin_env, **({"MC_FORCE_TCP": "1"} if transport == "tcp" else {}))
    b = Peer(nixl_py, "target", env)
    a = Peer(nixl_py, "initiator", env)
    try:
        tb = b.read()
        ta = a.read()
        a.send("META", tb["meta"])  # metadata travels as bytes (hex on the pipe)
        a.send("BASE", str(tb["base"]))
        b.send("META", ta["meta"])
        res_a = a.read()
        res_b = b.read()
        assert res_a["write"] == "DONE" and res_a["read"] == "DONE"
        assert res_b["received"] == res_a["sent"]  # 300 scattered pieces, hashed on the target
        assert res_a["read_back"] == tb["read_src"]  # 200 scattered pieces read from the target
        assert res_b["notifs"] == {"A": ["done A->B"]}
        assert res_a["notifs"] == {"B": ["bye from B"]}
        b.send("EXIT")
        assert b.close() == 0
        a.send("GONE")
        res = a.read()  # the target is gone: an error status, not a crash or a hang
        assert res["after_peer_exit"].startswith("ERR") or res["post_after_peer_exit"], res
        assert res["notif_after_exit"]
        assert a.close() == 0
    finally:
        for p in (a, b):
            if p.proc.poll() is None:
                p.proc.kill()


def test_installed_plugin_sits_beside_ucx(nixl_py) -> None:
    """What `mooncake_nixl_plugin install` put into the venv (scripts/install.sh does it):
    found by NIXL without NIXL_PLUGIN_DIR, next to UCX."""
    r = run_py(nixl_py, "-m", "mooncake_connectors.nixl.cli", "path")
    if r.returncode == 1:
        require(f"plugin not installed in {nixl_py}'s nixl: run `mooncake_nixl_plugin install` there")
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    assert path.name == "libplugin_MooncakeCore.so" and (path.parent / "libplugin_UCX.so").exists()
    env = {k: v for k, v in os.environ.items() if k != "NIXL_PLUGIN_DIR"}
    out = subprocess.run([nixl_py, SIDE, "plugins"], capture_output=True, text=True, timeout=120,
                         env=dict(env, PYTHONPATH=shim_pythonpath()))
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert "MooncakeCore" in res["plugins"] and "UCX" in res["plugins"]
    assert res["created"] == ["MooncakeCore", "UCX"]
