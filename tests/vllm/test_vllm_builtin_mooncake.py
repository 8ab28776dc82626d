"""vLLM's *built-in* MooncakeConnector, unchanged, running on this project's Transfer Engine.

vLLM's connector does ``from mooncake.engine import TransferEngine``; our vLLM plugin installs
the ``mooncake`` alias (``mooncake_core.compat``) so that import resolves to
``mooncake_core.engine``. 1P1D through our proxy with ``--handoff mooncake`` (vLLM's Mooncake
proxy convention: bootstrap server, concurrent prefill/decode): outputs must match a plain
request and the decode must count the prompt as external hits.

The proxy is started *before* the engines, as the README's deployment does (everything with
``&``): the first completion sent once both engines answer /health must succeed (it used to be
refused with 503 until the next --health-interval).

On a CPU-only torch the built-in connector's worker calls ``torch.accelerator.current_device_index()``
and fails; ``MOONCAKE_VLLM_CPU_SHIM=1`` (our plugin, opt-in) makes that call return 0.
"""

from __future__ import annotations

import random
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from mooncake_core.utils.net import wait_for_port
from mooncake_core.utils.proc import stop_process
from mooncake_lab.vllm_harness import VllmServer, free_port, http_json, http_text, metric, start_all

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def builtin_pair(vllm_py: str, tiny_model: Path, python_exe: str,
                 tmp_path_factory) -> Iterator[tuple[VllmServer, VllmServer, str]]:
    logs = tmp_path_factory.mktemp("vllm-builtin")
    bport = free_port()
    env = {"MOONCAKE_VLLM_CPU_SHIM": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_MOONCAKE_BOOTSTRAP_PORT": str(bport)}

    def cfg(role: str) -> dict:
        return {"kv_connector": "MooncakeConnector", "kv_role": role,
                "kv_connector_extra_config": {"mooncake_protocol": "tcp"}}

    p = VllmServer(vllm_py, tiny_model, free_port(), 0, logs / "prefill.log", cfg("kv_producer"), env=env)
    d = VllmServer(vllm_py, tiny_model, free_port(), 1, logs / "decode.log", cfg("kv_consumer"), env=env)
    port = free_port()
    plog = open(logs / "proxy.log", "wb")
    proxy = subprocess.Popen([python_exe, "-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", str(port),
                              "--prefill", p.url, str(bport), "--decode", d.url, "--handoff", "mooncake",
                              # a long interval: only the start-up probing can bring them in
                              "--health-interval", "60"],
                             stdout=plog, stderr=subprocess.STDOUT)
    try:
        wait_for_port("127.0.0.1", port, 60, proxy)
        start_all([p, d])  # the proxy has been probing them while they booted
        yield p, d, f"http://127.0.0.1:{port}"
    finally:
        stop_process(proxy, 15)
        plog.close()
        p.stop()
        d.stop()


def test_builtin_mooncake_connector_runs_on_our_engine(builtin_pair):
    p, d, url = builtin_pair
    assert "Please install mooncake" not in p.log_text() + d.log_text(), "the mooncake alias was not installed"
    # the first request right after both engines answered /health: no wait for the proxy
    rng = random.Random(31)
    for n in (150, 70):
        prompt = [rng.randrange(3, 300) for _ in range(n)]
        hits0 = metric(http_text(d.url + "/metrics"), "vllm:external_prefix_cache_hits_total")
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0,
                "return_token_ids": True, "ignore_eos": True}
        got = http_json(url + "/v1/completions", body, timeout=180)["choices"][0]["token_ids"]
        hits1 = metric(http_text(d.url + "/metrics"), "vllm:external_prefix_cache_hits_total")
        assert hits1 - hits0 == n
        want = http_json(d.url + "/v1/completions", dict(body, cache_salt=uuid.uuid4().hex))
        assert got == want["choices"][0]["token_ids"]
