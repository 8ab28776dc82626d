"""Fixtures for the vLLM connector tests: the vLLM venv, the tiny model, a 1P1D pair of real servers.

The servers are started once per module (each ~2 GB, ~30-60 s to healthy on 2 cores) and
always stopped (process groups killed) at the end.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from mooncake_core import envs

HERE = str(Path(__file__).resolve().parent)
sys.path.insert(0, HERE)

from mooncake_lab.checkout_shim import shim_pythonpath  # noqa: E402
from mooncake_lab.venvs import venv_dir  # noqa: E402
from mooncake_lab.vllm_harness import (DROP_READY, LEASE_S, WANT_RETRY_S, VllmServer, free_port, make_tiny_model, p2p_config,  # noqa: E402
                          start_all, vllm_python)


@pytest.fixture(scope="session")
def vllm_py() -> str:
    py = vllm_python()
    if py is None:
        msg = (f"vLLM venv not found at {venv_dir('vllm')} "
               "(create it with scripts/install_vllm.sh, or point VLLM_VENV at one)")
        if envs.require("vllm"):
            pytest.fail(msg)
        pytest.skip(msg)
    return py


@pytest.fixture(scope="session")
def tiny_model(vllm_py: str, tmp_path_factory) -> Path:
    return make_tiny_model(vllm_py, tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def pd_pair(vllm_py: str, tiny_model: Path, tmp_path_factory) -> Iterator[tuple[VllmServer, VllmServer]]:
    logs = tmp_path_factory.mktemp("vllm-logs")
    # both run the production connector subclassed with the test's controls (noise over received
    # KV on request; a lost ``ready``), loaded by vLLM from tests/vllm through kv_connector_module_path
    test_connector = dict(kv_connector="CorruptingMooncakeConnector", kv_connector_module_path="corrupting_connector")
    env = {"PYTHONPATH": os.pathsep.join([shim_pythonpath(), HERE])}
    p = VllmServer(vllm_py, tiny_model, free_port(), 0, logs / "prefill.log",
                   dict(p2p_config("kv_producer", kv_lease_s=LEASE_S), **test_connector),
                   env={**env, "MOONCAKE_TEST_DROP_READY_PREFIX": DROP_READY})
    d = VllmServer(vllm_py, tiny_model, free_port(), 1, logs / "decode.log",
                   dict(p2p_config("kv_consumer", want_retry_s=WANT_RETRY_S), kv_load_failure_policy="recompute",
                        **test_connector), env=env)
    t0 = time.monotonic()
    start_all([p, d])
    print(f"1P1D healthy in {time.monotonic() - t0:.1f} s")
    try:
        yield p, d
    finally:
        p.stop()
        d.stop()
