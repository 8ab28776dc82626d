"""vLLM's *built-in* MooncakeStoreConnector, unchanged, running on this project's Mooncake Store.

vLLM's connector does ``from mooncake.store import MooncakeDistributedStore``; our vLLM plugin
installs the ``mooncake`` alias (``mooncake_core.compat``), so it runs on ``mooncake_core.store``
against a real ``mooncake_master`` (configured, as upstream documents, by the JSON file in
``MOONCAKE_CONFIG_PATH``). One ``kv_both`` instance: a prompt is served and saved, vLLM's own
prefix cache is emptied, and the same prompt must then be loaded from the store (external hits)
and give the tokens the instance computes on its own.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Iterator

import pytest

from mooncake_lab.master_proc import MasterProc
from mooncake_lab.vllm_harness import (VllmServer, completion, free_port, http_text, metric, own_tokens, reset_prefix_cache,
                          start_all)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BLOCK = 32
EXT_HITS = "vllm:external_prefix_cache_hits_total"


@pytest.fixture(scope="module")
def builtin_store(vllm_py: str, tiny_model: Path, tmp_path_factory) -> Iterator[VllmServer]:
    logs = tmp_path_factory.mktemp("vllm-builtin-store")
    mport, hport, metrics_port = free_port(), free_port(), free_port()
    master = MasterProc(["--port", str(mport), "--rpc_address", "127.0.0.1", "--metrics_port", str(metrics_port),
                         "--enable_http_metadata_server=true", "--http_metadata_server_host", "127.0.0.1",
                         "--http_metadata_server_port", str(hport)], mport, metrics_port,
                        str(logs / "master.log")).wait_ready()
    (logs / "mooncake.json").write_text(json.dumps({
        "metadata_server": f"http://127.0.0.1:{hport}/metadata", "master_server_address": f"127.0.0.1:{mport}",
        "protocol": "tcp", "device_name": "", "global_segment_size": "64MB", "local_buffer_size": "16MB"}))
    env = {"MOONCAKE_VLLM_CPU_SHIM": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_SERVER_DEV_MODE": "1",
           "MOONCAKE_CONFIG_PATH": str(logs / "mooncake.json")}
    server = VllmServer(vllm_py, tiny_model, free_port(), 0, logs / "vllm.log",
                        {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}, env=env)
    try:
        start_all([server])
        yield server
    finally:
        server.stop()
        master.kill()


def test_builtin_store_connector_runs_on_our_store(builtin_store: VllmServer):
    s = builtin_store
    assert "Please install mooncake" not in s.log_text(), "the mooncake alias was not installed"
    rng = random.Random(51)
    prompt = [rng.randrange(3, 300) for _ in range(4 * BLOCK + 11)]
    completion(s.url, prompt, 4)
    deadline = time.monotonic() + 60
    while True:  # the save is asynchronous: retry until the store has it and the local cache is empty
        reset_prefix_cache(s)
        hits0 = metric(http_text(s.url + "/metrics"), EXT_HITS)
        got = completion(s.url, prompt, 8)["choices"][0]["token_ids"]
        if metric(http_text(s.url + "/metrics"), EXT_HITS) - hits0 >= 4 * BLOCK:
            break
        assert time.monotonic() < deadline, f"the prefix was never loaded from the store:\n{s.log_tail()}"
        time.sleep(1)
    assert got == own_tokens(s, prompt, 8)
