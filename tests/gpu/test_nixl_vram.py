"""NIXL ``VRAM`` through the ``MooncakeCore`` backend on a real GPU (skipped elsewhere, naming
what is missing): GPU -> GPU WRITE with a notification and GPU -> host READ, scattered pieces,
byte-exact, nothing written outside them. NIXL's own agent code drives the plugin built from
this checkout (nixl_vram_side.py). Needs a CUDA GPU, torch, nixl 1.5.1 and g++ in this python's
environment (docs/gpu.md, docs/nixl.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys

import pytest

from mooncake_core.transfer.cuda.runtime import available


def _missing() -> str | None:
    if not available():
        return "needs a CUDA GPU (cuda-python sees none here); run tests/gpu on a GPU machine (docs/gpu.md)"
    for mod in ("torch", "nixl"):
        if importlib.util.find_spec(mod) is None:
            return f"needs {mod} in this python (nixl: pip install nixl-cu13==1.5.1, docs/nixl.md)"
    if shutil.which("g++") is None:
        return "needs g++ to build the MooncakeCore plugin"
    return None


_MISSING = _missing()
pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.skipif(_MISSING is not None, reason=str(_MISSING))]

HERE = os.path.dirname(os.path.abspath(__file__))


def test_vram_write_and_read_through_mooncake_core_byte_exact(tmp_path):
    from mooncake_lab.nixl_env import make_plugin_env, run_py
    (tmp_path / "plugins").mkdir()
    env = make_plugin_env(sys.executable, tmp_path / "plugins")
    r = run_py(sys.executable, os.path.join(HERE, "nixl_vram_side.py"), env=env, timeout=180)
    assert r.returncode == 0, f"exit {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["mems"] == ["DRAM_SEG", "VRAM_SEG"]
    assert out["write"] == "DONE" and out["read"] == "DONE"
    assert out["received"] == out["sent"] and out["read_back"] == out["sent"]
    assert out["dst_rest_zero"] and out["back_rest_zero"]
    assert out["notifs"] == {"A": ["vram written"]}
