"""Fixtures for the NIXL plugin tests: a venv with nixl 1.5.1 and the plugin built from this checkout.

nixl lives in the framework venvs (``scripts/install_vllm.sh --with-nixl`` puts nixl-cu12 in
the vLLM venv, ``SGLANG_WITH_NIXL=1 scripts/install_sglang.sh`` nixl-cu13 in the SGLang one).
The NIXL side of each test runs as a subprocess of such a venv's python. The plugin under test
is compiled from this checkout into a temporary directory which also links every plugin nixl
bundles, and ``NIXL_PLUGIN_DIR`` points there: the tests never depend on (or change) what is
installed in the venv, and UCX & co. stay loadable beside ours. Without a nixl venv the tests
skip, unless ``MOONCAKE_REQUIRE_NIXL=1`` (CI) turns that into a failure.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.venvs import venv_python
from mooncake_lab.nixl_env import make_plugin_env, run_py  # noqa: F401  (run_py: used by the test modules)

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


@pytest.fixture(scope="session")
def nixl_py() -> str:
    py = nixl_python()
    if py is None:
        require(f"no python with nixl found: {INSTALL_HINT}")
    return py


@pytest.fixture(scope="session")
def plugin_env(nixl_py: str, tmp_path_factory) -> dict[str, str]:
    return make_plugin_env(nixl_py, tmp_path_factory.mktemp("nixl-plugins"))
