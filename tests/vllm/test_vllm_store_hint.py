"""The proxy's store prefix hint honoured by MooncakeCoreStoreConnector on real vLLM servers.

A real ``mooncake_master``; instance A (``store_lookup: always``) serves prompts and saves their
blocks; instance B runs ``store_lookup: hint``: it asks the store only when a request carries
``kv_transfer_params.mooncake_store_prefix`` (mooncake_core/pd/store_hint.py). Checked: without a
hint B loads nothing; with a hint B reports the prefix as external hits and its output equals
B's own computation (a salted request); a stale hint (the store dropped the blocks) makes B
compute them, with the same output.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from mooncake_lab.master_proc import MasterProc
from mooncake_core.pd.store_hint import HINT_KEY, make_hint
from mooncake_core.store.master_client import MasterClient
from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.vllm_harness import VllmServer, completion, free_port, http_json, http_text, metric, start_all

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BLOCK = 32
EXT_HITS = "vllm:external_prefix_cache_hits_total"


@pytest.fixture(scope="module")
def hint_pair(vllm_py: str, tiny_model: Path, tmp_path_factory) -> Iterator[tuple]:
    logs = tmp_path_factory.mktemp("vllm-store-hint")
    mport, hport, metrics_port = free_port(), free_port(), free_port()
    master = MasterProc([f"--port={mport}", "--rpc_address=127.0.0.1", f"--metrics_port={metrics_port}",
                         "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
                         f"--http_metadata_server_port={hport}"], mport, metrics_port, str(logs / "master.log"))
    extra = {"master_server_address": f"127.0.0.1:{mport}", "metadata_server": f"http://127.0.0.1:{hport}/metadata",
             "global_segment_size": "64MB", "local_buffer_size": "16MB", "local_hostname": "127.0.0.1"}
    cfg_a = {"kv_connector": "MooncakeCoreStoreConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}
    cfg_b = {**cfg_a, "kv_connector_extra_config": {**extra, "store_lookup": "hint"}}
    a = VllmServer(vllm_py, tiny_model, free_port(), 0, logs / "a.log", cfg_a)
    b = VllmServer(vllm_py, tiny_model, free_port(), 1, logs / "b.log", cfg_b)
    try:
        master.wait_ready()
        start_all([a, b])
        yield a, b, master.addr
    finally:
        a.stop()
        b.stop()
        master.kill(signal.SIGTERM)


def _saved_by_a(a, prompt: list[int] | str) -> None:
    n = a.log_text().count("kv saved")
    completion(a.url, prompt, 2)
    deadline = time.monotonic() + 60
    while a.log_text().count("kv saved") <= n:  # the save runs right after the request finishes
        assert time.monotonic() < deadline, "A never saved its blocks to the store"
        time.sleep(0.25)


def _reference(b, prompt: list[int], n: int) -> list[int]:
    """B's own computation of ``prompt`` (a cache salt changes every key: nothing is reused)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0, "return_token_ids": True,
            "ignore_eos": True, "cache_salt": uuid.uuid4().hex,
            "kv_transfer_params": {HINT_KEY: make_hint(8, BLOCK)}}
    return http_json(b.url + "/v1/completions", body)["choices"][0]["token_ids"]


def _hits(b) -> float:
    return metric(http_text(b.url + "/metrics"), EXT_HITS)


def test_hint_makes_b_load_the_prefix_and_output_matches(hint_pair):
    a, b, _ = hint_pair
    rng = random.Random(51)
    with_hint = [rng.randrange(3, 300) for _ in range(4 * BLOCK + 9)]
    without = [rng.randrange(3, 300) for _ in range(3 * BLOCK + 5)]
    _saved_by_a(a, with_hint)
    _saved_by_a(a, without)

    h0 = _hits(b)
    completion(b.url, without, 4)  # the store holds it, but no hint: B does not ask
    assert _hits(b) == h0, "store_lookup=hint must not load without a hint"

    got = completion(b.url, with_hint, 12, {HINT_KEY: make_hint(4, BLOCK)})["choices"][0]["token_ids"]
    assert _hits(b) - h0 == 4 * BLOCK, "B did not load the hinted prefix from the store"
    assert "store hint request=" in b.log_text() and "kv loaded blocks=4 failed=0" in b.log_text()
    h1 = _hits(b)
    want = _reference(b, with_hint, 12)
    assert _hits(b) == h1, "a salted request must not hit the store"
    assert got == want, "output with the hinted prefix loaded from the store differs from B's own computation"


def test_stale_hint_recomputes_with_the_same_output(hint_pair):
    a, b, master = hint_pair
    rng = random.Random(53)
    prompt = [rng.randrange(3, 300) for _ in range(3 * BLOCK + 7)]
    _saved_by_a(a, prompt)
    with MasterClient(master) as c:  # the store drops every KV block: the hint is now stale
        assert c.remove_by_regex("^mc-vllm-kv/", True) > 0
    h0 = _hits(b)
    got = completion(b.url, prompt, 12, {HINT_KEY: make_hint(3, BLOCK)})["choices"][0]["token_ids"]
    assert _hits(b) == h0, "nothing should load for a stale hint"
    assert "hinted=3 found=0" in b.log_text()
    assert got == _reference(b, prompt, 12), "a stale hint changed the output"


PROXY_KEYS = r"""
import json, sys
from mooncake_proxy.prompt import PromptHasher, load_tokenizer
from mooncake_proxy.store_view import StoreBlockHasher, store_key
model, text = sys.argv[1], sys.argv[2]
ph = PromptHasher(StoreBlockHasher(model + "|torch.float32", 32), load_tokenizer(model, add_special_tokens=True))
print(json.dumps([store_key(h) for h in ph.info({"prompt": text}, "/v1/completions").block_hashes]))
"""


def test_proxy_keys_from_text_are_the_connectors_keys(hint_pair, vllm_py, tiny_model):
    """The proxy, with the engine's tokenizer and block size, computes exactly the keys the
    connector wrote for a text prompt (run in the vLLM venv: it has ``transformers``)."""
    a, _, master = hint_pair
    text = " ".join(f"word{i} of the shared system prompt number {i * 7}" for i in range(12))
    _saved_by_a(a, text)
    env = {**os.environ, "PYTHONPATH": shim_pythonpath()}
    out = subprocess.run([vllm_py, "-c", PROXY_KEYS, str(tiny_model), text], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    keys = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(keys) >= 3, keys
    with MasterClient(master) as c:
        assert c.batch_exist_key(keys) == [True] * len(keys), "the proxy's keys differ from the connector's"
