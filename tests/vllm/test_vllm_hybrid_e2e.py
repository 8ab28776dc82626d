"""A hybrid Mamba2 + attention model (Granite-4.0-H style) served disaggregated through our proxy
and MooncakeCoreConnector, with vLLM's hybrid KV cache manager (the connector is ``SupportsHMA``).

The tiny random model of ``scripts/make_tiny_model.py --arch granite_hybrid`` has one Mamba2 layer
and one attention layer: two KV cache groups over one shared buffer (16 KiB pages), the Mamba
group holding one state page per request (10112 bytes of conv + SSM state), the attention group
32-token blocks. As vLLM's own Mooncake connector does, the prefill computes the prompt minus its
last token and the decode loads that state and KV and computes the last token itself.

We check, through ``mooncake_proxy`` (both hand-offs), that the decode's greedy output equals its
own computation, that it counted the prompt but one token as external hits and moved exactly the
attention blocks plus one state, that the prefill frees them on the decode's confirmation, and --
the negative control -- that noise written over the received blocks changes the output. The store
connector, which keeps prefixes of one KV cache group, refuses the model at start, naming why.

vLLM CPU 0.32 runs this model only with ``--no-enable-prefix-caching`` (with prefix caching its
own Mamba2 kernel crashes on a 100-token prompt, connector or not), so the decode's own prefix
hits and the Mamba "align" cache mode are not exercised here; the pairing rules for them are
unit-tested (test_vllm_kv_groups_units.py).
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
BLOCK = 32
ATTN_BLOCK_BYTES = BLOCK * 2 * 2 * 32 * 4  # 32 tokens x (K, V) x 2 heads x 32 dims x fp32
STATE_BYTES = 10112  # the Mamba2 layer's conv + SSM state (vLLM pads its page to 16384)
NO_PREFIX_CACHING = ["--no-enable-prefix-caching"]


@pytest.fixture(scope="module")
def hybrid_pair(vllm_py, tmp_path_factory):
    model = make_tiny_model(vllm_py, tmp_path_factory.mktemp("tiny-hybrid"), "--arch", "granite_hybrid")
    logs = tmp_path_factory.mktemp("vllm-hybrid-logs")
    test_connector = dict(kv_connector="CorruptingMooncakeConnector", kv_connector_module_path="corrupting_connector")
    env = {"PYTHONPATH": os.pathsep.join([shim_pythonpath(), HERE])}
    p = VllmServer(vllm_py, model, free_port(), 0, logs / "prefill.log", p2p_config("kv_producer", kv_lease_s=60),
                   args=NO_PREFIX_CACHING)
    d = VllmServer(vllm_py, model, free_port(), 1, logs / "decode.log",
                   dict(p2p_config("kv_consumer"), kv_load_failure_policy="recompute", **test_connector), env=env,
                   args=NO_PREFIX_CACHING)
    t0 = time.monotonic()
    start_all([p, d], timeout=480)
    print(f"hybrid prefill + decode healthy in {time.monotonic() - t0:.1f} s")
    try:
        yield p, d, logs
    finally:
        p.stop()
        d.stop()


@pytest.mark.parametrize("handoff", ["vllm", "mooncake-core"])
def test_hybrid_through_proxy_equals_local_with_external_hits(hybrid_pair, handoff):
    p, d, logs = hybrid_pair
    proxy, url = start_proxy(p, d, handoff, logs / f"proxy-{handoff}.log")
    seeds = (1, 2) if handoff == "vllm" else (3, 4)
    try:
        for seed, n in zip(seeds, (100, 65)):  # the loaded n - 1 tokens end mid-block, on a block
            prompt = prompt_ids(seed, n)
            got, want, hits = proxied_vs_own(d, url, prompt, 8)
            assert hits == n - 1, \
                "the decode did not load the prompt but its last token from the prefill"
            assert got == want, "greedy output from the transferred Mamba state and KV differs from a local run"
        # exactly the attention blocks of n - 1 tokens and one Mamba state moved per request
        moved = pulled_reads(d.log_text())
        expect = [(-(-(n - 1) // BLOCK) + 1, -(-(n - 1) // BLOCK) * ATTN_BLOCK_BYTES + STATE_BYTES) for n in (100, 65)]
        assert moved[-2:] == expect, moved
        wait_prefill_freed(p)
    finally:
        stop_proxy(proxy)


def test_hybrid_negative_control_noise_over_received_blocks_changes_the_output(hybrid_pair):
    p, d, _ = hybrid_pair
    prompt = prompt_ids(5, 100)
    params, got, want = corrupted_handoff(p, d, prompt, 8)
    assert params["remote_num_tokens"] == 99 and len(params["mooncake_group_block_ids"]) == 2
    assert got != want, "noise over the received state and KV did not change the output: the decode ignores it"


def test_store_connector_refuses_a_hybrid_model_at_start_naming_why(vllm_py, tmp_path):
    """The store keeps prefixes of one KV cache group; a hybrid model must fail at start with the
    reason and the way out, not with vLLM's "Failed to promote local KV cache specs" nor with
    wrong output. (The refusal comes before the store is set up: no master needed.)"""
    model = make_tiny_model(vllm_py, tmp_path / "tiny-hybrid", "--arch", "granite_hybrid")
    cfg = {"kv_connector": "MooncakeCoreStoreConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"master_server_address": f"127.0.0.1:{free_port()}",
                                         "metadata_server": "P2PHANDSHAKE"}}
    s = VllmServer(vllm_py, model, free_port(), 1, tmp_path / "store.log", cfg, args=NO_PREFIX_CACHING).start()
    try:
        with pytest.raises(RuntimeError, match="exited"):
            s.wait_healthy(timeout=300)
        log = s.log_text()
        assert "MooncakeCoreStoreConnector: this model has 2 KV cache groups (MambaSpec, FullAttentionSpec)" in log
        assert "MooncakeCoreConnector instead" in log and "Failed to promote" not in log
    finally:
        s.stop()
