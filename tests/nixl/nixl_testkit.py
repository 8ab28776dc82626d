"""What the NIXL tests share besides fixtures: where they live, which python has nixl, and
``require`` (skip, or fail under ``MOONCAKE_REQUIRE_NIXL=1``). A module of its own, not
``conftest``: ``from conftest import`` finds whichever test folder's conftest pytest loaded last
(tests/lmdeploy's, when both folders run in one session)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.nixl_env import make_plugin_env, run_py  # noqa: F401  (used by the test modules)
from mooncake_lab.venvs import venv_python

HERE = Path(__file__).resolve().parent
INSTALL_HINT = ("install nixl into the framework venvs: scripts/install_nixl.sh "
                "(or set MOONCAKE_NIXL_PYTHON to a python that has nixl 1.5.1 and this repo)")


def nixl_python() -> str | None:
    """A framework venv's python that imports nixl and this repo, or None."""
    given = os.environ.get("MOONCAKE_NIXL_PYTHON")
    cands = [given] if given else [str(venv_python("vllm")), str(venv_python("sglang"))]  # mooncake_lab/venvs.py
    for py in cands:
        if not os.access(py, os.X_OK):
            continue
        r = subprocess.run([py, "-c", "import nixl._api, mooncake_connectors.nixl"], capture_output=True, timeout=120,
                           env=dict(os.environ, PYTHONPATH=shim_pythonpath()))
        if r.returncode == 0:
            return py
    return None


def require(msg: str) -> None:
    if os.environ.get("MOONCAKE_REQUIRE_NIXL") == "1":
        pytest.fail(msg + " (MOONCAKE_REQUIRE_NIXL=1)")
    pytest.skip(msg)
