"""The hybrid Mamba2 + attention model (test_vllm_hybrid_e2e.py's) under tensor parallelism 2 -> 2.

A TP 2 prefill and a TP 2 decode (one worker process per rank, gloo): each rank holds half the
attention heads and half the Mamba heads (its share of the conv + SSM state), over its own
shared buffers, so decode rank r reads rank r's groups -- whole blocks and states, no re-split.
We check that the greedy output equals the TP 2 decode's own computation, directly and through
``mooncake_proxy``, that both decode ranks moved the attention blocks of the prompt but its last
token plus one state share each, and that noise over the received blocks changes the output.
A TP 1 decode is refused the TP 2 prefill's KV (a state share cannot be re-split into a whole
state by reading byte ranges): it says so and computes the prompt itself, with the same output.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.vllm_harness import (VllmServer, completion, corrupted_handoff, free_port, http_text,
                                       make_tiny_model, metric, own_tokens, p2p_config, prompt_ids, proxied_vs_own,
                                       pulled_reads, start_all, start_proxy, stop_proxy, tp_args, wait_prefill_freed)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

HERE = str(Path(__file__).resolve().parent)
BLOCK = 32
RANK_ATTN_BLOCK_BYTES = BLOCK * 2 * 1 * 32 * 4  # 32 tokens x (K, V) x 1 of the 2 heads x 32 dims x fp32
STATE_BYTES = 10112  # the whole Mamba2 state at TP 1 (each rank holds a share of it)
NO_PREFIX_CACHING = ["--no-enable-prefix-caching"]
STARTUP_S = 600.0  # two TP 2 servers (four worker processes) on 2 cores


@pytest.fixture(scope="module")
def hybrid_tp2(vllm_py, tmp_path_factory):
    model = make_tiny_model(vllm_py, tmp_path_factory.mktemp("tiny-hybrid"), "--arch", "granite_hybrid")
    logs = tmp_path_factory.mktemp("vllm-hybrid-tp-logs")
    args2, env2 = tp_args(2)
    dec_env = dict(env2, PYTHONPATH=os.pathsep.join([shim_pythonpath(), HERE]))
    p = VllmServer(vllm_py, model, free_port(), 0, logs / "prefill-tp2.log", p2p_config("kv_producer", kv_lease_s=120),
                   env=env2, args=args2 + NO_PREFIX_CACHING)
    d = VllmServer(vllm_py, model, free_port(), 0, logs / "decode-tp2.log",
                   dict(p2p_config("kv_consumer", prefill_wait_s=300), kv_load_failure_policy="recompute",
                        kv_connector="CorruptingMooncakeConnector", kv_connector_module_path="corrupting_connector"),
                   env=dec_env, args=args2 + NO_PREFIX_CACHING)
    d1 = VllmServer(vllm_py, model, free_port(), 1, logs / "decode-tp1.log", p2p_config("kv_consumer"),
                    args=NO_PREFIX_CACHING)
    t0 = time.monotonic()
    start_all([p, d, d1], timeout=STARTUP_S)
    print(f"hybrid TP 2 prefill, TP 2 decode and TP 1 decode healthy in {time.monotonic() - t0:.1f} s")
    for s in (p, d, d1):  # warm-up one at a time: vLLM CPU compiles for new shapes on the first requests
        completion(s.url, prompt_ids(900), 4, timeout=STARTUP_S)
    try:
        yield p, d, d1, logs
    finally:
        for s in (p, d, d1):
            s.stop()


def _rank_reads(d: VllmServer, count: int) -> list[tuple[int, int]]:
    return pulled_reads(d.log_text())[-count:]


def test_hybrid_tp2_to_tp2_equals_local(hybrid_tp2):
    p, d, _d1, logs = hybrid_tp2
    n = 100
    prompt = prompt_ids(21, n)
    want = own_tokens(d, prompt, 8)
    params = completion(p.url, prompt, 1, {"do_remote_decode": True})["kv_transfer_params"]
    assert params["mooncake_tp_size"] == 2 and len(set(params["mooncake_segments"])) == 2, params
    assert params["remote_num_tokens"] == n - 1 and len(params["mooncake_group_block_ids"]) == 2
    got = completion(d.url, prompt, 8, params, timeout=300)["choices"][0]["token_ids"]
    assert got == want, "greedy output from the transferred TP 2 Mamba state shares and KV differs from a local run"
    nb = -(-(n - 1) // BLOCK)
    reads = _rank_reads(d, 2)  # one line per decode rank, each its own rank's attention heads and state share
    assert len(reads) == 2 and reads[0] == reads[1], reads
    blocks, nbytes = reads[0]
    assert blocks == nb + 1 and nb * RANK_ATTN_BLOCK_BYTES < nbytes < nb * RANK_ATTN_BLOCK_BYTES + STATE_BYTES, reads
    wait_prefill_freed(p, timeout=60)

    proxy, url = start_proxy(p, d, "vllm", logs / "proxy.log")
    try:
        got, want, hits = proxied_vs_own(d, url, prompt_ids(22, 65), 8)
        assert hits == 64, "the decode did not load the prompt but its last token from the TP 2 prefill"
        assert got == want, "greedy output through the proxy differs from the TP 2 decode's own"
    finally:
        stop_proxy(proxy)


def test_hybrid_tp2_negative_control_noise_changes_the_output(hybrid_tp2):
    p, d, _d1, _ = hybrid_tp2
    _params, got, want = corrupted_handoff(p, d, prompt_ids(23, 100), 8, ranks=2)
    assert got != want, "noise over the received TP 2 state shares and KV did not change the output"


def test_hybrid_tp2_to_tp1_is_refused_and_computed_locally(hybrid_tp2):
    p, _d, d1, _ = hybrid_tp2
    prompt = prompt_ids(24, 100)
    want = own_tokens(d1, prompt, 8)
    hits0 = metric(http_text(d1.url + "/metrics"), "vllm:external_prefix_cache_hits_total")
    params = completion(p.url, prompt, 1, {"do_remote_decode": True})["kv_transfer_params"]
    got = completion(d1.url, prompt, 8, params, timeout=300)["choices"][0]["token_ids"]
    assert got == want, "the refused decode's own computation differs from its local run"
    assert metric(http_text(d1.url + "/metrics"), "vllm:external_prefix_cache_hits_total") == hits0, \
        "a TP 1 decode loaded a TP 2 prefill's hybrid KV"
    assert "prefill TP 2, decode TP 1: a hybrid model's KV moves between equal TP sizes only" in d1.log_text()
