"""P2P + store connectors together inside vLLM's ``MultiConnector`` on real vLLM (CPU) servers.

One ``mooncake_master`` (embedded HTTP metadata server) and a 1P1D pair, both instances running
``MultiConnector`` with ``[MooncakeCoreConnector, MooncakeCoreStoreConnector]``. Checks:

(a) the P2P hand-off works inside MultiConnector: the decode pulls the prompt's blocks from the
    prefill (its external-hit counter grows by the whole prompt, a ``kv pulled`` line names the
    transfer) and greedy output equals a local computation on the decode;
(b) the store child saved the prompt's full blocks: every expected prefix-chained key is in
    the store (asked from this test process through our store client; none was before), the
    prefill logged its save, and the prefill gets its blocks back well before the P2P lease:
    MultiConnector counted both children's pending work (decode confirmation + store save) and
    neither child left the blocks held;
(c) the store half really serves: after the decode's local prefix cache is reset, a new prompt
    sharing that prefix is loaded from the store (external hits = the shared full blocks) and
    decodes to the same tokens as a local computation; the decode's store child, ``kv_consumer``,
    saved none of the prompts it computed.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mooncake_core.utils.proc import stop_process
from mooncake_lab.vllm_harness import (
    VllmServer,
    completion,
    free_port,
    http_json,
    http_text,
    metric,
    p2p_config,
    start_all,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BLOCK = 32
LEASE_S = 30.0  # long: freeing before it proves the confirmation + save path, not the lease
EXT_HITS = "vllm:external_prefix_cache_hits_total"
USAGE = "vllm:kv_cache_usage_perc"


def multi_config(role: str, store_extra: dict, **p2p_extra) -> dict:
    """The documented shape: MultiConnector's children go in ``kv_connector_extra_config.connectors``;
    the P2P one first, so a request carrying P2P params loads from the prefill, anything else
    from the store. The decode's store child is ``kv_consumer``: it loads, the prefill saves."""
    store = {"kv_connector": "MooncakeCoreStoreConnector",
             "kv_role": "kv_consumer" if role == "kv_consumer" else "kv_both",
             "kv_connector_extra_config": store_extra}
    return {"kv_connector": "MultiConnector", "kv_role": role,
            "kv_connector_extra_config": {"connectors": [p2p_config(role, **p2p_extra), store]}}


@contextmanager
def mooncake_master(logs: Path) -> Iterator[tuple[str, str]]:
    """A real master with its embedded HTTP metadata server; yields (master address, metadata URL)."""
    mport, hport, metrics_port = free_port(), free_port(), free_port()
    with open(logs / "master.log", "wb") as master_log:
        master = subprocess.Popen([sys.executable, "-m", "mooncake_core.store.master_main", "--port", str(mport),
                                   "--rpc_address", "127.0.0.1", "--metrics_port", str(metrics_port),
                                   "--enable_http_metadata_server=true", "--http_metadata_server_host",
                                   "127.0.0.1", "--http_metadata_server_port", str(hport)],
                                  stdout=master_log, stderr=subprocess.STDOUT)
        try:
            time.sleep(1.0)
            assert master.poll() is None, (logs / "master.log").read_text()
            yield f"127.0.0.1:{mport}", f"http://127.0.0.1:{hport}/metadata"
        finally:
            stop_process(master, 10)


@pytest.fixture(scope="module")
def multi_pair(vllm_py: str, tiny_model: Path, tmp_path_factory) -> Iterator[dict]:
    logs = tmp_path_factory.mktemp("vllm-multi")
    with mooncake_master(logs) as (master_addr, metadata_url):
        store_extra = {"master_server_address": master_addr, "metadata_server": metadata_url,
                       "global_segment_size": "64MB", "local_buffer_size": "16MB", "local_hostname": "127.0.0.1"}
        dev = {"VLLM_SERVER_DEV_MODE": "1"}  # for POST /reset_prefix_cache
        p = VllmServer(vllm_py, tiny_model, free_port(), 0, logs / "prefill.log",
                       multi_config("kv_producer", store_extra, kv_lease_s=LEASE_S), env=dev)
        d_cfg = multi_config("kv_consumer", store_extra)
        d_cfg["kv_load_failure_policy"] = "recompute"
        d = VllmServer(vllm_py, tiny_model, free_port(), 1, logs / "decode.log", d_cfg, env=dev)
        try:
            t0 = time.monotonic()
            start_all([p, d])
            print(f"MultiConnector 1P1D healthy in {time.monotonic() - t0:.1f} s")
            yield {"p": p, "d": d, "master": master_addr, "metadata": metadata_url, "model": tiny_model}
        finally:
            p.stop()
            d.stop()


def local_tokens(url: str, prompt: list[int], max_tokens: int = 16) -> list[int]:
    """Greedy tokens the instance computes itself (a fresh cache_salt: no prefix or store hits)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, "ignore_eos": True, "cache_salt": uuid.uuid4().hex}
    return http_json(url + "/v1/completions", body)["choices"][0]["token_ids"]


def expected_keys(model: Path, prompt: list[int]) -> list[str]:
    """The store keys MooncakeCoreStoreConnector derives for ``prompt`` (model tag = model path + dtype)."""
    from mooncake_core.pd.keys import chained_block_keys, namespace

    return chained_block_keys(namespace(f"{model}|torch.float32", BLOCK, "v1", None), prompt, BLOCK)


def test_p2p_handoff_and_store_save_inside_multiconnector(multi_pair):
    from mooncake_core.store import MooncakeDistributedStore

    p, d = multi_pair["p"], multi_pair["d"]
    rng = random.Random(71)
    prompt = [rng.randrange(3, 300) for _ in range(6 * BLOCK + 8)]  # 6 full blocks + a partial one
    keys = expected_keys(multi_pair["model"], prompt)
    assert len(keys) == 6

    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", multi_pair["metadata"], 0, "16MB", "tcp", "", multi_pair["master"]) == 0
    try:
        assert store.batch_is_exist(keys) == [0] * 6, "store not empty before the first request"

        # (a) P2P hand-off through MultiConnector
        r = completion(p.url, prompt, 1, {"do_remote_decode": True})
        params = r["kv_transfer_params"]
        assert params and params["do_remote_prefill"] is True, r
        assert params["remote_num_tokens"] == len(prompt)
        hits0 = metric(http_text(d.url + "/metrics"), EXT_HITS)
        out = completion(d.url, prompt, 16, params)["choices"][0]["token_ids"]
        hits1 = metric(http_text(d.url + "/metrics"), EXT_HITS)
        assert hits1 - hits0 == len(prompt), "decode did not take the prompt from the prefill (P2P child)"
        assert re.search(r"kv pulled request=\S+ transfer=" + re.escape(params["mooncake_transfer_id"])
                         + r" blocks=7 ", d.log_text()), "no 'kv pulled' line for the hand-off"
        assert out == local_tokens(d.url, prompt), "greedy output from transferred KV differs from a local run"

        # (b) the store child saved the prompt's full blocks; the prefill frees its blocks once
        # both children are done (decode confirmation + store save), long before the lease
        wait_until(lambda: store.batch_is_exist(keys) == [1] * 6, 30, "all 6 prefix keys in the store")
        wait_until(lambda: metric(http_text(p.url + "/metrics"), USAGE) == 0.0, LEASE_S / 2,
                   "prefill KV usage back to 0 (P2P confirmed and store saved)")
        assert "lease expired" not in p.log_text()
        assert "kv saved" in p.log_text(), "the prefill's store child never saved"
    finally:
        store.close()

    # (c) the store child serves the prefix on the decode once its own prefix cache is gone
    def reset() -> bool:
        return bool(http_json(d.url + "/reset_prefix_cache", {}, timeout=30).get("success"))

    wait_until(reset, 30, "the decode's prefix cache reset", step=0.5)
    prompt_b = prompt[:6 * BLOCK] + [rng.randrange(3, 300) for _ in range(21)]
    want = local_tokens(d.url, prompt_b)
    hits2 = metric(http_text(d.url + "/metrics"), EXT_HITS)
    got = completion(d.url, prompt_b, 16)["choices"][0]["token_ids"]
    hits3 = metric(http_text(d.url + "/metrics"), EXT_HITS)
    assert hits3 - hits2 == 6 * BLOCK, "decode did not load the shared prefix from the store (store child)"
    assert "kv loaded blocks=6 failed=0" in d.log_text()
    assert got == want, "output with the prefix loaded from the store differs from a local computation"
    # the decode's store child is kv_consumer: it computed four prompts itself and saved none of them
    assert "kv saved" not in d.log_text(), "the decode's kv_consumer store child saved blocks"


MC = "vllm:mooncake_core_"


def test_connector_figures_reach_vllm_metrics(multi_pair):
    """Both connectors' figures (vLLM's KV connector stats hook -> the server's own /metrics, from
    the workers and the schedulers) after one P2P hand-off and one store load equal the blocks
    that moved; no failure is counted; and the Grafana board of the vLLM connectors asks only for
    series the servers export."""
    p, d = multi_pair["p"], multi_pair["d"]
    d0, p0 = http_text(d.url + "/metrics"), http_text(p.url + "/metrics")

    def grew(srv, before: str, name: str) -> float:
        return metric(http_text(srv.url + "/metrics"), MC + name) - metric(before, MC + name)

    rng = random.Random(97)
    prompt = [rng.randrange(3, 300) for _ in range(5 * BLOCK + 3)]  # 5 full blocks + a partial one
    params = completion(p.url, prompt, 1, {"do_remote_decode": True})["kv_transfer_params"]
    per_block = params["mooncake_block_bytes"] * params["mooncake_num_slabs"]
    completion(d.url, prompt, 4, params)
    wait_until(lambda: grew(d, d0, "kv_pulled_blocks_total") == 6, 30, "the decode's pulled-blocks counter")
    assert grew(d, d0, "kv_pulled_bytes_total") == 6 * per_block
    assert grew(d, d0, "kv_pull_seconds_count") == 1
    assert 0 < grew(d, d0, "kv_pull_seconds_sum") < 60
    # the scheduler sides: the decode's scheduler set one request to load 6 blocks and saw it
    # arrive; the prefill's scheduler held that request's blocks for it
    assert grew(d, d0, "kv_remote_requests_total") == 1 and grew(d, d0, "kv_remote_blocks_total") == 6
    assert grew(d, d0, "kv_remote_local_hits_total") == 0
    wait_until(lambda: grew(d, d0, "kv_remote_wait_seconds_count") == 1, 30, "the decode's KV wait histogram")
    assert grew(d, d0, "kv_pull_seconds_sum") <= grew(d, d0, "kv_remote_wait_seconds_sum") < 60
    assert grew(p, p0, "kv_handoff_requests_total") == 1 and grew(p, p0, "kv_handoff_blocks_total") == 6

    # the prefill looked its fresh prompt up in the store (5 full blocks, none there), saved them,
    # and held its blocks for the decode until the decode's confirmation
    wait_until(lambda: grew(p, p0, "store_saved_blocks_total") == 5, 30, "the prefill's saved-blocks counter")
    assert grew(p, p0, "store_saved_bytes_total") == 5 * per_block
    assert grew(p, p0, "store_miss_blocks_total") >= 5 and grew(p, p0, "store_hit_blocks_total") == 0
    wait_until(lambda: grew(p, p0, "kv_hold_seconds_count") == 1, 30, "the prefill's hold-time histogram")
    assert grew(p, p0, "kv_leases_expired_total") == 0

    # the decode loads those 5 blocks from the store once its own prefix cache is gone
    wait_until(lambda: http_json(d.url + "/reset_prefix_cache", {}, timeout=30).get("success"), 30,
               "the decode's prefix cache reset", step=0.5)
    d1 = http_text(d.url + "/metrics")
    completion(d.url, prompt[:5 * BLOCK] + [rng.randrange(3, 300) for _ in range(9)], 4)
    wait_until(lambda: grew(d, d1, "store_loaded_blocks_total") == 5, 30, "the decode's loaded-blocks counter")
    assert grew(d, d1, "store_loaded_bytes_total") == 5 * per_block
    assert grew(d, d1, "store_hit_blocks_total") == 5
    assert grew(d, d1, "store_load_seconds_count") == 1
    for srv, before in ((d, d0), (p, p0)):
        assert grew(srv, before, "kv_failed_pulls_total") == 0 and grew(srv, before, "store_failed_blocks_total") == 0

    board = json.loads((Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "mooncake-vllm.json").read_text())
    queried = {m for pnl in board["panels"] if pnl["type"] != "row" for t in pnl["targets"]
               for m in re.findall(r"vllm:[a-z0-9_]+", t["expr"])}
    exported = {line.split("{")[0].split(" ")[0] for line in http_text(d.url + "/metrics").splitlines()
                if line and not line.startswith("#")}
    assert queried and not queried - exported, f"the vLLM board queries series vLLM does not export: {queried - exported}"
