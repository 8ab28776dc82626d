"""Fixtures for the LMDeploy connector tests.

LMDeploy 0.18.0 lives in its own venv (``scripts/install_lmdeploy.sh``; ``$LMDEPLOY_VENV`` or
~/.cache/mooncake-core/venvs/lmdeploy) with a CPU torch. The tests run the LMDeploy side as subprocesses of that
venv's python; without the venv they skip with a message naming the install script, unless
``MOONCAKE_REQUIRE_LMDEPLOY=1`` (CI) turns the skip into a failure. The PD scenarios run in a
network namespace with only loopback (``unshare -n``, needs root or CAP_SYS_ADMIN); where that is
not permitted they skip, or fail under ``MOONCAKE_REQUIRE_LMDEPLOY=1``.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from lmdeploy_harness import INSTALL_HINT, lmdeploy_venv_python


def _require(msg: str) -> None:
    if os.environ.get("MOONCAKE_REQUIRE_LMDEPLOY") == "1":
        pytest.fail(msg + " (MOONCAKE_REQUIRE_LMDEPLOY=1)")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def lmdeploy_python() -> str:
    py = lmdeploy_venv_python()
    if py is None:
        _require(f"LMDeploy venv not found or incomplete: {INSTALL_HINT}")
    return py


@pytest.fixture(scope="session")
def netns() -> list[str]:
    """Command prefix that runs a process in a fresh network namespace with loopback only."""
    unshare = shutil.which("unshare")
    if unshare is None:
        _require("unshare (util-linux) not found")
    r = subprocess.run([unshare, "-n", "true"], capture_output=True, text=True, timeout=30, check=False)
    if r.returncode != 0:
        _require(f"unshare -n is not permitted here ({r.stderr.strip()}); needs root or CAP_SYS_ADMIN")
    return [unshare, "-n"]
