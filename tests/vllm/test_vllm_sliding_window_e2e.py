"""A model with sliding-window and full-attention layers served disaggregated through our proxy and
MooncakeCoreConnector, with vLLM's hybrid KV cache manager (one KV cache group per kind).

The tiny random model of ``scripts/make_tiny_model.py --arch llama_sliding`` is a Llama whose
first layer attends over a 64-token window and whose second attends over everything (Gemma-2/3,
Mistral and gpt-oss style models mix the two the same way). vLLM keeps a window group and a full
group over one shared buffer; on the prefill the window group's blocks that fell out of the
window are already vLLM's null block, and the hand-off moves only the window's blocks (the
window in blocks plus one: 3 of 32 tokens) and all of the full group's.

We check, through ``mooncake_proxy``, that the decode's greedy output equals its own computation,
that it counted the whole prompt as external hits and moved exactly those blocks, that the
prefill frees them on the decode's confirmation, and -- the negative control -- that noise over
the received blocks changes the output.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.vllm_harness import (VllmServer, corrupted_handoff, free_port, make_tiny_model, p2p_config,
                                       prompt_ids, proxied_vs_own, pulled_reads, serving, start_proxy, stop_proxy,
                                       wait_prefill_freed)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

HERE = str(Path(__file__).resolve().parent)
BLOCK = 32
BLOCK_BYTES = BLOCK * 2 * 2 * 32 * 4  # one layer's block: 32 tokens x (K, V) x 2 heads x 32 dims x fp32
WINDOW_BLOCKS = 64 // BLOCK + 1  # the window (scripts/make_tiny_model.py SLIDING_WINDOW) plus one


@pytest.fixture(scope="module")
def window_pair(vllm_py, tmp_path_factory):
    model = make_tiny_model(vllm_py, tmp_path_factory.mktemp("tiny-sliding"), "--arch", "llama_sliding")
    logs = tmp_path_factory.mktemp("vllm-sliding-logs")
    env = {"PYTHONPATH": os.pathsep.join([shim_pythonpath(), HERE])}
    p = VllmServer(vllm_py, model, free_port(), 0, logs / "prefill.log", p2p_config("kv_producer", kv_lease_s=60))
    d = VllmServer(vllm_py, model, free_port(), 1, logs / "decode.log",
                   dict(p2p_config("kv_consumer"), kv_load_failure_policy="recompute",
                        kv_connector="CorruptingMooncakeConnector", kv_connector_module_path="corrupting_connector"),
                   env=env)
    with serving([p, d], "sliding-window prefill + decode", 480):
        yield p, d, logs


def test_sliding_window_through_proxy_moves_only_the_window(window_pair):
    p, d, logs = window_pair
    proxy, url = start_proxy(p, d, "vllm", logs / "proxy.log")
    lengths = (200, 100)  # 7 blocks (4 out of the window), 4 blocks (1 out of it)
    try:
        for seed, n in zip((1, 2), lengths):
            got, want, hits = proxied_vs_own(d, url, prompt_ids(seed, n), 8)
            assert hits == n, "the decode did not load the prompt's KV from the prefill"
            assert got == want, "greedy output from the transferred window and full blocks differs from a local run"
        # per request: the full group's blocks and the window group's last WINDOW_BLOCKS, one layer each
        expect = [(nb + min(nb, WINDOW_BLOCKS), (nb + min(nb, WINDOW_BLOCKS)) * BLOCK_BYTES)
                  for nb in (-(-n // BLOCK) for n in lengths)]
        assert pulled_reads(d.log_text())[-2:] == expect
        wait_prefill_freed(p)
    finally:
        stop_proxy(proxy)


def test_sliding_window_negative_control_noise_changes_the_output(window_pair):
    p, d, _ = window_pair
    params, got, want = corrupted_handoff(p, d, prompt_ids(3, 200), 8)
    assert [len(ids) for ids in params["mooncake_group_block_ids"]] == [WINDOW_BLOCKS, 7], params
    assert got != want, "noise over the received window and full blocks did not change the output"
