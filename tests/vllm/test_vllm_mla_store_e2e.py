"""An MLA model (DeepSeek-V2 style) through MooncakeCoreStoreConnector: a prefix one instance
computed is reused by another through the Mooncake Store.

A real ``mooncake_master`` (embedded HTTP metadata server) and two vLLM CPU instances A and B
(``kv_both``) serving the tiny MLA model of ``scripts/make_tiny_model.py --arch deepseek_v2`` (one
576-wide bf16 latent per token and layer, block size 16). A serves a prompt and saves its full
blocks; B serves a prompt sharing five of them and loads them from the store (external hits).

The oracle is the latent itself: B also computes the prompt on its own (a cache salt changes
every key, so B saves its own latent under other keys), and this test reads both copies back from
the store -- the latent B loaded is byte for byte the latent B computes. A and B decode the same
tokens from the same stored prefix, and noise stored under a prompt's keys changes B's output (the
negative control). Greedy equality with a local run is NOT the oracle here: vLLM CPU 0.32
computes the tokens after a loaded MLA prefix on another path (its "prefill with context", which
its CPU platform otherwise turns off with prefix caching for MLA) than a one-pass prefill, and on
this random model the two paths pick different tokens for most prompts although the loaded latent
is the one B computes itself, bit for bit.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import numpy as np
import pytest

from mooncake_core.pd.keys import chained_block_keys, namespace
from mooncake_lab.master_proc import MasterProc
from mooncake_lab.vllm_harness import (VllmServer, completion, free_port, http_json, http_text, make_tiny_model,
                                       metric, start_all, wait_until)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BLOCK = 16  # vLLM CPU's MLA kernel
LAYERS = 2
OBJECT_BYTES = LAYERS * BLOCK * (512 + 64) * 2  # one stored block: every layer's latent, bf16
EXT_HITS = "vllm:external_prefix_cache_hits_total"
TOKENS = 8


@pytest.fixture(scope="module")
def mla_store(vllm_py, tmp_path_factory):
    from mooncake_core.store import MooncakeDistributedStore

    model = make_tiny_model(vllm_py, tmp_path_factory.mktemp("tiny-mla"), "--arch", "deepseek_v2")
    logs = tmp_path_factory.mktemp("vllm-mla-store")
    port, hport = free_port(), free_port()
    master = MasterProc([f"--port={port}", "--rpc_address=127.0.0.1", f"--metrics_port={free_port()}",
                         "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
                         f"--http_metadata_server_port={hport}"], port, 0, str(logs / "master.log")).wait_ready()
    metadata = f"http://127.0.0.1:{hport}/metadata"
    cfg = {"kv_connector": "MooncakeCoreStoreConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"master_server_address": master.addr, "metadata_server": metadata,
                                         "global_segment_size": "64MB", "local_buffer_size": "16MB",
                                         "local_hostname": "127.0.0.1"}}
    a = VllmServer(vllm_py, model, free_port(), 0, logs / "a.log", cfg, dtype="bfloat16", block_size=BLOCK)
    b = VllmServer(vllm_py, model, free_port(), 1, logs / "b.log", cfg, dtype="bfloat16", block_size=BLOCK)
    store = MooncakeDistributedStore()  # this test's own client: reads the stored latent back
    try:
        start_all([a, b], timeout=480)
        assert store.setup("127.0.0.1", metadata, 0, "16MB", "tcp", "", master.addr) == 0
        yield a, b, store, model
    finally:
        store.close()
        a.stop()
        b.stop()
        master.kill()


def _keys(model: Path, prompt: list[int], salt: str | None = None) -> list[str]:
    """The keys MooncakeCoreStoreConnector stores ``prompt``'s full blocks under (model path + dtype)."""
    return chained_block_keys(namespace(f"{model}|torch.bfloat16", BLOCK, "v1", salt), prompt, BLOCK)


def _tokens(server: VllmServer, prompt: list[int], salt: str | None = None) -> tuple[list[int], float]:
    """(greedy tokens, external hits counted for them)."""
    hits0 = metric(http_text(server.url + "/metrics"), EXT_HITS)
    body_salt = {"cache_salt": salt} if salt else {}
    out = http_json(server.url + "/v1/completions",
                    {"model": "tiny", "prompt": prompt, "max_tokens": TOKENS, "temperature": 0,
                     "return_token_ids": True, "ignore_eos": True, **body_salt}, timeout=300)
    return out["choices"][0]["token_ids"], metric(http_text(server.url + "/metrics"), EXT_HITS) - hits0


def _stored(store, keys: list[str]) -> None:
    wait_until(lambda: store.batch_is_exist(keys) == [1] * len(keys), 60, f"{len(keys)} blocks in the store")


def test_mla_prefix_stored_by_a_is_loaded_by_b_byte_for_byte(mla_store):
    a, b, store, model = mla_store
    rng = random.Random(61)
    shared = [rng.randrange(3, 300) for _ in range(5 * BLOCK)]
    prompt_a = shared + [rng.randrange(3, 300) for _ in range(40)]
    prompt_b = shared + [rng.randrange(3, 300) for _ in range(27)]
    keys_a = _keys(model, prompt_a)
    assert store.batch_is_exist(keys_a) == [0] * 7, "the store holds the prompt before anyone served it"

    completion(a.url, prompt_a, 4)
    _stored(store, keys_a)  # A saved the prompt's 7 full blocks
    _got_b, hits = _tokens(b, prompt_b)
    assert hits == 5 * BLOCK, "B did not load the shared prefix's latent from the store"
    assert "kv loaded blocks=5 failed=0" in b.log_text()
    # B saved prompt_b's sixth block; both instances now load six blocks (vLLM CPU keeps no MLA
    # prefix cache of its own) and decode alike from the same stored latent
    _stored(store, _keys(model, prompt_b))
    got_a, hits_a = _tokens(a, prompt_b)
    again_b, hits_b = _tokens(b, prompt_b)
    assert hits_a == hits_b == 6 * BLOCK, (hits_a, hits_b)
    assert got_a == again_b, "A and B decode differently from the same stored latent"

    # B computes prompt_a itself (salted: its own latent, saved under other keys): every stored
    # block of A's is byte for byte the latent B computes
    salt = uuid.uuid4().hex
    _own, own_hits = _tokens(b, prompt_a, salt)
    assert own_hits == 0, "a salted request hit the store"
    keys_own = _keys(model, prompt_a, salt)
    _stored(store, keys_own)
    for i, (ka, kb) in enumerate(zip(keys_a, keys_own)):
        mine, theirs = store.get(kb), store.get(ka)
        assert len(mine) == OBJECT_BYTES and mine == theirs, \
            f"block {i}: the latent A stored differs from the latent B computes itself"


def test_mla_store_negative_control_noise_under_the_keys_changes_the_output(mla_store):
    a, b, store, model = mla_store
    rng = random.Random(62)
    prompt = [rng.randrange(3, 300) for _ in range(3 * BLOCK + 5)]
    keys = _keys(model, prompt)
    noise = np.random.default_rng(62).normal(0.0, 1.0, OBJECT_BYTES // 2).astype(np.float32)
    noise_bf16 = (noise.view(np.uint32) >> 16).astype(np.uint16).tobytes()  # bf16: float32's upper half
    for k in keys:
        assert store.put(k, noise_bf16) == 0
    got_noise, hits = _tokens(b, prompt)
    assert hits == 3 * BLOCK, "B did not load the noise stored under the prompt's keys"
    for k in keys:  # B's read lease on them ends only later
        assert store.remove(k, force=True) == 0
    completion(a.url, prompt, 4)
    _stored(store, keys)
    got, hits = _tokens(b, prompt)
    assert hits == 3 * BLOCK
    assert got != got_noise, "noise in place of the stored latent did not change the output: B ignores it"
