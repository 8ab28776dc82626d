"""Fixtures for the LMCache tests: the LMCache venv's python, real masters, LMCache peers.

LMCache 0.5.6 lives in the vLLM venv (``scripts/install_lmcache.sh``; ``$LMCACHE_VENV``, else
``$VLLM_VENV``, else ~/.cache/mooncake-core/venvs/vllm). Without it the tests skip naming the script, unless
``MOONCAKE_REQUIRE_LMCACHE=1`` (CI) turns the skip into a failure.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mooncake_lab.lmcache_harness import INSTALL_HINT, LmcPeer, lmcache_python, peer_env  # noqa: E402
from store.conftest import master_factory  # noqa: E402,F401  (tests/ is on sys.path: rootdir conftest)
from mooncake_lab.store_procs import Master  # noqa: E402


@pytest.fixture(scope="session")
def lmc_py() -> str:
    py = lmcache_python()
    if py is None:
        msg = f"LMCache venv not found or incomplete: {INSTALL_HINT}"
        if os.environ.get("MOONCAKE_REQUIRE_LMCACHE") == "1":
            pytest.fail(msg + " (MOONCAKE_REQUIRE_LMCACHE=1)")
        pytest.skip(msg)
    return py


@pytest.fixture
def peers(lmc_py, tmp_path) -> Iterator[Any]:
    """``peers(name, master, *flags, env=...)`` starts an LMCache peer; all closed after."""
    started: list[LmcPeer] = []

    def start(name: str, master: Master | None, *flags: str, env: dict[str, str] | None = None) -> LmcPeer:
        args = list(flags)
        if master is not None:
            args = ["--master", master.addr, "--meta", master.meta, *args]
        p = LmcPeer(lmc_py, tmp_path / f"{name}.log", *args, env=peer_env(env))
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()
