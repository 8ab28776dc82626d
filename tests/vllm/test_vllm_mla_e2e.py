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

Tensor parallelism (2 -> 2, 2 -> 1, 1 -> 2): test_vllm_mla_tp_e2e.py; through the store connector:
test_vllm_mla_store_e2e.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.vllm_harness import (VllmServer, corrupted_handoff, free_port, make_tiny_model, p2p_config,
                                       prompt_ids, proxied_vs_own, pulled_reads, start_all, start_proxy, stop_proxy,
                                       wait_prefill_freed)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

HERE = str(Path(__file__).resolve().parent)
BLOCK = 16  # vLLM CPU's MLA kernel
LATENT_BYTES = (512 + 64) * 2  # one token's latent, bf16
LAYERS = 2


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
            got, want, hits = proxied_vs_own(d, url, prompt, 8)
            assert hits == n, \
                "the decode did not load the prompt's latent KV from the prefill"
            assert got == want, "greedy output from the transferred MLA latent differs from a local run"
        # exactly the prompt's blocks of latent moved, every layer's
        moved = pulled_reads(d.log_text())
        assert moved[-2:] == [(b, b * BLOCK * LATENT_BYTES * LAYERS) for b in (-(-100 // BLOCK), 64 // BLOCK)], moved
        # the decode confirmed: the prefill frees the blocks long before the lease
        wait_prefill_freed(p)
    finally:
        stop_proxy(proxy)


def test_mla_negative_control_noise_over_the_latent_changes_the_output(mla_pair):
    p, d, _ = mla_pair
    prompt = prompt_ids(3, 100)
    _params, got, want = corrupted_handoff(p, d, prompt, 8)
    assert got != want, "noise over the received latent did not change the output: the decode ignores it"
