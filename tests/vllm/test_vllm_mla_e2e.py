"""An MLA model (DeepSeek-V2 style) served disaggregated through our proxy and MooncakeCoreConnector.

DeepSeek-V2/V3 and Kimi cache one latent per token (``kv_lora_rank`` 512 + rope 64 = 576 wide)
instead of per-head K and V; vLLM reports one "KV head" for it and, under tensor parallelism,
every rank holds the whole latent (replicated, not split by heads). The tiny random model built
by ``scripts/make_tiny_model.py --arch deepseek_v2`` has exactly that cache (bf16, block size 16:
what vLLM CPU's MLA kernel takes).

We check, through ``mooncake_proxy``, that the decode's greedy output equals its own computation
of the prompt, that it counted the prompt as external hits and moved exactly the prompt's
blocks of latent, that the prefill frees them on the decode's confirmation, and -- the negative
control -- that noise written over the received latent changes the output.

Not under tensor parallelism: vLLM CPU 0.32 runs this model at TP 2, but its own TP 2 greedy
output is the same in float32 and bf16 and differs from TP 1's from the second token, so no
local run is a trustworthy oracle for a TP 2 hand-off (the replicated-latent rule itself,
``tp.rank_plan``, is unit-tested in test_vllm_tp_units.py).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.vllm_harness import (VllmServer, completion, free_port, http_json, http_text, make_tiny_model, metric, own_tokens,
                          p2p_config, prompt_ids, start_all, start_proxy, stop_proxy, wait_until)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

HERE = str(Path(__file__).resolve().parent)
BLOCK = 16  # vLLM CPU's MLA kernel
LATENT_BYTES = (512 + 64) * 2  # one token's latent, bf16
LAYERS = 2
EXT_HITS = "vllm:external_prefix_cache_hits_total"
USAGE = "vllm:kv_cache_usage_perc"


@pytest.fixture(scope="module")
def mla_pair(vllm_py, tmp_path_factory):
    model = make_tiny_model(vllm_py, tmp_path_factory.mktemp("tiny-mla"), "--arch", "deepseek_v2")
    logs = tmp_path_factory.mktemp("vllm-mla-logs")
    test_connector = dict(kv_connector="CorruptingMooncakeConnector", kv_connector_module_path="corrupting_connector")
    env = {"PYTHONPATH": os.pathsep.join([shim_pythonpath(), HERE])}
    p = VllmServer(vllm_py, model, free_port(), 0, logs / "prefill.log", p2p_config("kv_producer", kv_lease_s=60),
                   dtype="bfloat16", block_size=BLOCK)
    d = VllmServer(vllm_py, model, free_port(), 1, logs / "decode.log",
                   dict(p2p_config("kv_consumer"), kv_load_failure_policy="recompute", **test_connector), env=env,
                   dtype="bfloat16", block_size=BLOCK)
    t0 = time.monotonic()
    start_all([p, d], timeout=480)
    print(f"MLA prefill + decode healthy in {time.monotonic() - t0:.1f} s")
    try:
        yield p, d, logs
    finally:
        p.stop()
        d.stop()


def test_mla_through_proxy_equals_local_with_external_hits(mla_pair):
    p, d, logs = mla_pair
    proxy, url = start_proxy(p, d, "vllm", logs / "proxy.log")
    try:
        for seed, n in ((1, 100), (2, 64)):  # ends mid-block, on a block
            prompt = prompt_ids(seed, n)
            want = own_tokens(d, prompt, 8)
            hits0 = metric(http_text(d.url + "/metrics"), EXT_HITS)
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0, "return_token_ids": True,
                    "ignore_eos": True}
            got = http_json(url + "/v1/completions", body, timeout=300)["choices"][0]["token_ids"]
            assert metric(http_text(d.url + "/metrics"), EXT_HITS) - hits0 == n, \
                "the decode did not load the prompt's latent KV from the prefill"
            assert got == want, "greedy output from the transferred MLA latent differs from a local run"
        # exactly the prompt's blocks of latent moved, every layer's
        moved = [(int(b), int(nb)) for b, nb in re.findall(r"kv pulled request=\S+ transfer=\S+ blocks=(\d+) "
                                                           r"bytes=(\d+)", d.log_text())]
        assert moved[-2:] == [(b, b * BLOCK * LATENT_BYTES * LAYERS) for b in (-(-100 // BLOCK), 64 // BLOCK)], moved
        # the decode confirmed: the prefill frees the blocks long before the lease
        wait_until(lambda: metric(http_text(p.url + "/metrics"), USAGE) == 0.0, 30,
                   "prefill KV usage back to 0 after the decode's confirmation")
    finally:
        stop_proxy(proxy)


def test_mla_negative_control_noise_over_the_latent_changes_the_output(mla_pair):
    p, d, _ = mla_pair
    prompt = prompt_ids(3, 100)
    want = own_tokens(d, prompt, 8)
    params = completion(p.url, prompt, 1, {"do_remote_decode": True})["kv_transfer_params"]
    params["mooncake_test_corrupt"] = True  # honoured by the decode's CorruptingMooncakeConnector
    got = completion(d.url, prompt, 8, params, timeout=300)["choices"][0]["token_ids"]
    assert got != want, "noise over the received latent did not change the output: the decode ignores it"
