"""Helpers shared by the LMDeploy tests (a uniquely named module: test dirs here have no __init__)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.venvs import venv_dir

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
INSTALL_HINT = "run scripts/install_lmdeploy.sh (or set LMDEPLOY_VENV to an LMDeploy 0.18.0 venv)"


def lmdeploy_venv_python() -> str | None:
    """The LMDeploy venv's python if it has lmdeploy 0.18 and this repo installed, else None."""
    venv = str(venv_dir("lmdeploy"))  # $LMDEPLOY_VENV, else the user's cache dir (mooncake_lab/venvs.py)
    py = os.path.join(venv, "bin", "python")
    if not os.access(py, os.X_OK):
        return None
    probe = ("import importlib.util as u, importlib.metadata as m; "
             "print(m.version('lmdeploy'), bool(u.find_spec('mooncake_connectors')))")
    out = subprocess.run([py, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    return py if out.stdout.strip() == "0.18.0 True" else None


def venv_env(**extra: str) -> dict[str, str]:
    """Environment for LMDeploy-venv subprocesses: this checkout first on the path, quiet."""
    env = dict(os.environ)
    env.update({"PYTHONPATH": shim_pythonpath(), "PYTHONWARNINGS": "ignore"})
    env.update(extra)
    return env


def run_venv_json(py: str, args: list[str], *, timeout: float, prefix: list[str] | None = None,
                  env: dict[str, str] | None = None, logdir: str | None = None) -> dict[str, Any]:
    """Run a venv script that prints one JSON line last; return it (fail with stderr and logs otherwise)."""
    r = subprocess.run([*(prefix or []), py, *args], capture_output=True, text=True, timeout=timeout,
                       env=env or venv_env(), cwd=REPO, check=False)
    last = next((ln for ln in reversed(r.stdout.splitlines()) if ln.startswith("{")), None)
    if r.returncode != 0 or last is None:
        logs = ""
        if logdir and os.path.isdir(logdir):
            for name in sorted(os.listdir(logdir)):
                with open(os.path.join(logdir, name), "rb") as f:
                    logs += f"\n--- {name} ---\n" + f.read()[-3000:].decode(errors="replace")
        raise AssertionError(f"{args[0]} exited {r.returncode}\nstdout: {r.stdout[-3000:]}\n"
                             f"stderr: {r.stderr[-5000:]}{logs}")
    return json.loads(last)
