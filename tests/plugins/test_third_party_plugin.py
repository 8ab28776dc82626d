"""A third-party distribution adds a transport and a metadata backend with an entry point only.

``demo_dist/`` is a real distribution (pyproject + one module, nothing of ours edited). The
test installs it into a fresh venv (system site-packages visible, our checkout first on the
path), then runs a peer and an initiator there: both open the Transfer Engine on the plugin's
``dirkv://`` metadata backend, the initiator reaches the peer with the plugin's ``procmem``
transport, and the bytes are checked on both sides. The same scripts under the plain
interpreter (plugin not installed) must not see either, so the entry point is what did it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_core.utils.net import free_port
from mooncake_core.utils.proc import close_piped

HERE = Path(__file__).resolve().parent
PEER = HERE.parents[1] / "mooncake_lab" / "te_peer.py"
INITIATOR = HERE / "plugin_initiator.py"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def plugin_venv(tmp_path_factory) -> Path:
    """A fresh venv with the demo distribution installed (no network: no build isolation)."""
    root = tmp_path_factory.mktemp("plugin")
    src = root / "demo_dist"
    shutil.copytree(HERE / "demo_dist", src)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=120)
    py = venv / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                        "--no-build-isolation", "--no-index", "--quiet", str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"pip install of the demo plugin failed:\n{r.stdout}\n{r.stderr}"
    return py


def _env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = shim_pythonpath()
    e.pop("MC_FORCE_TCP", None)
    return e


def _listed(python: str | Path) -> dict[str, list[str]]:
    code = ("import json; from mooncake_core.plugins import transport_classes, metadata_backends; "
            "print(json.dumps({'transports': [c.name for c in transport_classes()], "
            "'schemes': sorted(metadata_backends())}))")
    r = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_entry_point_registers_transport_and_backend(plugin_venv: Path) -> None:
    got = _listed(plugin_venv)
    assert got["transports"][:3] == ["local", "procmem", "cma"], got  # by priority: 100, 90, 80
    assert "dirkv" in got["schemes"] and "etcd" in got["schemes"]
    plain = _listed(sys.executable)
    assert "procmem" not in plain["transports"] and "dirkv" not in plain["schemes"]


def test_plugin_transport_and_metadata_end_to_end(plugin_venv: Path, tmp_path: Path) -> None:
    meta_dir = tmp_path / "meta"
    metadata = f"dirkv://{meta_dir}"
    size, seed = 1 << 20, 11
    peer = subprocess.Popen([str(plugin_venv), str(PEER), "--metadata", metadata, "--size", str(size),
                             "--seed", str(seed), "--hostname", f"127.0.0.1:{free_port()}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=_env())
    try:
        line = peer.stdout.readline()
        assert line, f"peer failed to start (rc={peer.poll()})"
        info = json.loads(line)
        assert "error" not in info, info
        # the peer published its descriptor through the plugin backend (one file per key), with
        # the plugin transport's versioned section kept current by its region hooks
        key = f"mooncake/ram/{info['segment']}"
        path = meta_dir / (base64.urlsafe_b64encode(key.encode()).decode() + ".json")
        desc = json.loads(path.read_text())
        assert desc["transports"]["procmem"] == {"version": 1, "pid": info["pid"], "regions": 1}, desc
        r = subprocess.run([str(plugin_venv), str(INITIATOR), "--metadata", metadata, "--segment", info["segment"],
                            "--hostname", f"127.0.0.1:{free_port()}", "--addr", str(info["addr"]), "--size", str(size)],
                           capture_output=True, text=True, env=_env(), timeout=120)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["rc"] == [0, 0], out
        assert out["transport"] == "procmem", out
        half = size // 2
        expected = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
        assert out["read_sha"] == hashlib.sha256(expected[:half].tobytes()).hexdigest()
        peer.stdin.write(f"sha {half} {half}\n")
        peer.stdin.flush()
        assert peer.stdout.readline().strip() == out["written_sha"]
    finally:
        close_piped(peer)


def test_unknown_scheme_lists_the_plugin_forms(plugin_venv: Path) -> None:
    code = ("from mooncake_core.metadata import open_metadata\n"
            "try:\n    open_metadata('nosuch://x')\nexcept ValueError as e:\n    print(e)\n")
    r = subprocess.run([str(plugin_venv), "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert "unknown scheme 'nosuch'" in r.stdout and "dirkv:///abs/dir" in r.stdout, r.stdout + r.stderr
