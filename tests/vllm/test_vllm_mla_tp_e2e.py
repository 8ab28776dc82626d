"""An MLA model (DeepSeek-V2 style) handed off under tensor parallelism: TP 2 -> 2, 2 -> 1, 1 -> 2.

An MLA model caches one latent per token (576 wide, bf16) and every TP rank holds all of it
(replicated, not split by heads), so a decode rank reads whole blocks from one prefill rank
(``tp.rank_plan``): rank r of rank r at equal TP; a TP 1 decode rank 0's copy of a TP 2 prefill,
confirming to both ranks; each rank of a TP 2 decode the one copy of a TP 1 prefill, which frees
its blocks once both confirmed. Three servers: a TP 2 prefill, a TP 2 decode and a TP 1 instance
that is both (decode for the TP 2 prefill, prefill for the TP 2 decode).

The tiny model has ONE layer: its latent depends on the token embeddings only, so it is the same
bytes on every TP size. (With two layers the second layer's latent depends on the first layer's
output, which vLLM CPU 0.32 computes differently at TP 1 and TP 2 -- its TP 2 greedy output
differs from its TP 1 output -- so a TP 1 decode could never reproduce its own output from a TP 2
prefill's latent.) The decode's own computation is the oracle: greedy equality for prompts whose
output is not on a bf16 near-tie (the decode computes the prompt's last token after the loaded
latent, a different kernel path than its own one-pass prefill; this random model's top logits
are a few hundredths apart, and for some prompts the two paths pick different tokens even at
TP 1 -> 1). We also check the external hits, the whole blocks each decode rank read (one line per
rank), that the prefill frees its blocks on the confirmations, and -- the negative control --
that noise over the received latent changes the output.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tp_checks import pulled, wait_pulled

from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.vllm_harness import (VllmServer, completion, corrupted_handoff, free_port, http_text,
                                       make_tiny_model, metric, own_tokens, p2p_config, prompt_ids, serving,
                                       start_proxy, stop_proxy, tp_args, wait_prefill_freed)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

HERE = str(Path(__file__).resolve().parent)
BLOCK = 16  # vLLM CPU's MLA kernel
BLOCK_BYTES = BLOCK * (512 + 64) * 2  # one block of one layer's latent, bf16 (the model has one layer)
EXT_HITS = "vllm:external_prefix_cache_hits_total"
STARTUP_S = 600.0  # three servers (five worker processes) on 2 cores
TOKENS = 8
PROMPTS = ((6, 81), (7, 33))  # (seed, length): off a near-tie on vLLM CPU 0.32 (see above)


@pytest.fixture(scope="module")
def mla_tp(vllm_py, tmp_path_factory):
    model = make_tiny_model(vllm_py, tmp_path_factory.mktemp("tiny-mla-1layer"), "--arch", "deepseek_v2",
                            "--layers", "1")
    logs = tmp_path_factory.mktemp("vllm-mla-tp-logs")
    args2, env2 = tp_args(2)
    env = {"PYTHONPATH": os.pathsep.join([shim_pythonpath(), HERE])}
    test_connector = dict(kv_connector="CorruptingMooncakeConnector", kv_connector_module_path="corrupting_connector",
                          kv_load_failure_policy="recompute")
    mla = dict(dtype="bfloat16", block_size=BLOCK)
    p2 = VllmServer(vllm_py, model, free_port(), 0, logs / "prefill-tp2.log",
                    p2p_config("kv_producer", kv_lease_s=120), env=env2, args=args2, **mla)
    d2 = VllmServer(vllm_py, model, free_port(), 0, logs / "decode-tp2.log",
                    dict(p2p_config("kv_consumer", prefill_wait_s=300), **test_connector), env=dict(env2, **env),
                    args=args2, **mla)
    x1 = VllmServer(vllm_py, model, free_port(), 1, logs / "both-tp1.log",  # decode of p2, prefill of d2
                    dict(p2p_config("kv_both", kv_lease_s=120), **test_connector), env=env, **mla)
    with serving([p2, d2, x1], "MLA TP 2 prefill, TP 2 decode and TP 1 instance", STARTUP_S):
        yield p2, d2, x1, logs


def _handoff(p: VllmServer, d: VllmServer, seed: int, n: int, prefill_tp: int, ranks: int) -> None:
    """Hand one prompt from ``p`` to ``d`` directly: greedy equality with the decode's own output,
    the whole prompt as external hits, ``ranks`` reads of whole latent blocks, the prefill freed."""
    prompt = prompt_ids(seed, n)
    want = own_tokens(d, prompt, TOKENS)
    params = completion(p.url, prompt, 1, {"do_remote_decode": True})["kv_transfer_params"]
    assert params["mooncake_tp_size"] == prefill_tp and len(set(params["mooncake_segments"])) == prefill_tp, params
    assert params["mooncake_kv_heads"] == 1 and params["mooncake_block_bytes"] == BLOCK_BYTES, params
    hits0 = metric(http_text(d.url + "/metrics"), EXT_HITS)
    got = completion(d.url, prompt, TOKENS, params, timeout=300)["choices"][0]["token_ids"]
    assert metric(http_text(d.url + "/metrics"), EXT_HITS) - hits0 == n, "the decode did not load the prompt's latent"
    assert got == want, f"greedy output from a TP {prefill_tp} prefill's latent differs from a local run"
    nb = -(-n // BLOCK)
    lines = [x[1:] for x in wait_pulled(d, lambda got: [x for x in got if x[0] == params["mooncake_transfer_id"]],
                                        ranks)]
    assert lines == [(nb, nb * BLOCK_BYTES)] * ranks, \
        f"expected {ranks} read(s) of the {nb} whole latent blocks of one prefill rank, got {lines}"
    wait_prefill_freed(p, timeout=60)  # every prefill rank confirmed, long before the 120 s lease


def test_mla_tp2_to_tp2_through_proxy_equals_local(mla_tp):
    p2, d2, _x1, logs = mla_tp
    proxy, url = start_proxy(p2, d2, "vllm", logs / "proxy.log")
    try:
        for seed, n in PROMPTS:
            prompt = prompt_ids(seed, n)
            want = own_tokens(d2, prompt, TOKENS)
            before = len(pulled(d2.log_text()))
            hits0 = metric(http_text(d2.url + "/metrics"), EXT_HITS)
            got = completion(url, prompt, TOKENS, timeout=300)["choices"][0]["token_ids"]
            assert metric(http_text(d2.url + "/metrics"), EXT_HITS) - hits0 == n, \
                "the TP 2 decode did not load the prompt's latent from the TP 2 prefill"
            assert got == want, "greedy output through the proxy differs from the TP 2 decode's own"
            nb = -(-n // BLOCK)  # rank r read rank r's copy: two reads of the whole blocks
            assert [x[1:] for x in wait_pulled(d2, lambda got: got[before:], 2)] == [(nb, nb * BLOCK_BYTES)] * 2
        wait_prefill_freed(p2, timeout=60)
    finally:
        stop_proxy(proxy)


def test_mla_tp2_to_tp1_reads_one_prefill_ranks_copy(mla_tp):
    p2, _d2, x1, _ = mla_tp
    _handoff(p2, x1, *PROMPTS[0], prefill_tp=2, ranks=1)


def test_mla_tp1_to_tp2_each_decode_rank_reads_the_one_copy(mla_tp):
    _p2, d2, x1, _ = mla_tp
    _handoff(x1, d2, *PROMPTS[0], prefill_tp=1, ranks=2)


def test_mla_tp2_to_tp1_negative_control_noise_changes_the_output(mla_tp):
    p2, _d2, x1, _ = mla_tp
    _params, got, want = corrupted_handoff(p2, x1, prompt_ids(*PROMPTS[1]), TOKENS)
    assert got != want, "noise over the latent received from the TP 2 prefill did not change the output"
