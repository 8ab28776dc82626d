"""MooncakeCoreStoreConnector on real vLLM servers: cross-instance prefix reuse via the Mooncake Store.

A real ``mooncake_master`` (with its embedded HTTP metadata server) and two vLLM instances A
(core 0) and B (core 1), both ``kv_both`` with the store connector. A serves a prompt and saves
its full blocks; B then serves a prompt sharing that prefix: B must report the shared full
blocks as external hits (loaded from the store, i.e. from A's memory) and give exactly the
tokens B computes on its own (a request with a cache salt, which changes every key).
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from mooncake_lab.vllm_harness import VllmServer, completion, free_port, http_json, http_text, metric, start_all

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BLOCK = 32
EXT_HITS = "vllm:external_prefix_cache_hits_total"


@pytest.fixture(scope="module")
def store_pair(vllm_py: str, tiny_model: Path, tmp_path_factory) -> Iterator[tuple]:
    logs = tmp_path_factory.mktemp("vllm-store")
    mport, hport, metrics_port = free_port(), free_port(), free_port()
    master_log = open(logs / "master.log", "wb")
    master = subprocess.Popen([sys.executable, "-m", "mooncake_core.store.master_main", "--port", str(mport),
                               "--rpc_address", "127.0.0.1", "--metrics_port", str(metrics_port),
                               "--enable_http_metadata_server=true", "--http_metadata_server_host", "127.0.0.1",
                               "--http_metadata_server_port", str(hport)],
                              stdout=master_log, stderr=subprocess.STDOUT)
    cfg = {"kv_connector": "MooncakeCoreStoreConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"master_server_address": f"127.0.0.1:{mport}",
                                         "metadata_server": f"http://127.0.0.1:{hport}/metadata",
                                         "global_segment_size": "64MB", "local_buffer_size": "16MB",
                                         "local_hostname": "127.0.0.1"}}
    a = VllmServer(vllm_py, tiny_model, free_port(), 0, logs / "a.log", cfg)
    b = VllmServer(vllm_py, tiny_model, free_port(), 1, logs / "b.log", cfg)
    try:
        time.sleep(1.0)
        assert master.poll() is None, (logs / "master.log").read_text()
        start_all([a, b])
        yield a, b, logs / "master.log"
    finally:
        a.stop()
        b.stop()
        master.terminate()
        try:
            master.wait(10)
        except subprocess.TimeoutExpired:
            master.kill()
        master_log.close()


def _why(a: VllmServer, b: VllmServer, master_log: Path) -> str:
    """What A, B and the master logged: the reason an assertion on saves, loads or hits failed."""
    try:
        master = "\n".join(master_log.read_text(errors="replace").splitlines()[-30:])
    except OSError as e:
        master = f"(unreadable: {e})"
    return f"\n--- A ---\n{a.connector_log()}\n--- B ---\n{b.connector_log()}\n--- master ---\n{master}"


def test_prefix_served_by_a_is_reused_by_b(store_pair):
    a, b, master_log = store_pair
    rng = random.Random(41)
    shared = [rng.randrange(3, 300) for _ in range(5 * BLOCK)]
    prompt_a = shared + [rng.randrange(3, 300) for _ in range(40)]
    prompt_b = shared + [rng.randrange(3, 300) for _ in range(27)]

    completion(a.url, prompt_a, 4)
    deadline = time.monotonic() + 60
    while "kv saved" not in a.log_text():  # the save runs right after the request finishes
        assert time.monotonic() < deadline, "A never saved its blocks to the store" + _why(a, b, master_log)
        time.sleep(0.25)
    assert re.search(r"kv saved request=\S+ blocks=6\b", a.log_text()), \
        "A's save did not store all 6 full blocks of its prompt" + _why(a, b, master_log)

    hits0 = metric(http_text(b.url + "/metrics"), EXT_HITS)
    got = completion(b.url, prompt_b, 16)["choices"][0]["token_ids"]
    hits1 = metric(http_text(b.url + "/metrics"), EXT_HITS)
    assert hits1 - hits0 == len(shared), "B did not load the shared prefix from the store" + _why(a, b, master_log)
    assert "kv loaded blocks=5 failed=0" in b.log_text(), _why(a, b, master_log)

    body = {"model": "tiny", "prompt": prompt_b, "max_tokens": 16, "temperature": 0, "return_token_ids": True,
            "ignore_eos": True, "cache_salt": uuid.uuid4().hex}
    hits2 = metric(http_text(b.url + "/metrics"), EXT_HITS)
    want = http_json(b.url + "/v1/completions", body)["choices"][0]["token_ids"]
    assert metric(http_text(b.url + "/metrics"), EXT_HITS) == hits2, "a salted request must not hit the store"
    assert got == want, "output with the prefix loaded from the store differs from B's own computation"


def test_unrelated_prompt_gets_no_hits(store_pair):
    _, b, _ = store_pair
    rng = random.Random(43)
    prompt = [rng.randrange(3, 300) for _ in range(100)]
    hits0 = metric(http_text(b.url + "/metrics"), EXT_HITS)
    completion(b.url, prompt, 4)
    assert metric(http_text(b.url + "/metrics"), EXT_HITS) == hits0
