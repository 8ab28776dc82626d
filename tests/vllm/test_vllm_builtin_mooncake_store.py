"""vLLM's *built-in* MooncakeStoreConnector, unchanged, running on this project's Mooncake Store.

vLLM's connector does ``from mooncake.store import MooncakeDistributedStore``; our vLLM plugin
installs the ``mooncake`` alias (``mooncake_core.compat``), so it runs on ``mooncake_core.store``
against a real ``mooncake_master`` (configured, as upstream documents, by the JSON file in
``MOONCAKE_CONFIG_PATH``). One ``kv_both`` instance: a prompt is served and saved, vLLM's own
prefix cache is emptied, and the same prompt must then be loaded from the store (external hits)
and give the tokens the instance computes on its own.

In vLLM's ``standalone-store`` mode the rank contributes no memory and its blocks land in the
node's ``mooncake_client``: the prefix cache outlives the engine. The instance is SIGKILLed, a new
one is started, and the same prompt must be served from the pool (external hits), with the
tokens the first instance gave.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from mooncake_core.utils.proc import stop_process
from mooncake_lab.master_proc import MasterProc
from mooncake_lab.store_procs import start_mooncake_client
from mooncake_lab.vllm_harness import (VllmServer, completion, free_port, http_text, metric, own_tokens, reset_prefix_cache,
                          start_all)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BLOCK = 32
EXT_HITS = "vllm:external_prefix_cache_hits_total"


def _master(logs: Path) -> tuple[MasterProc, str]:
    """A master with its HTTP metadata server: (process, metadata URL)."""
    mport, hport, metrics_port = free_port(), free_port(), free_port()
    master = MasterProc(["--port", str(mport), "--rpc_address", "127.0.0.1", "--metrics_port", str(metrics_port),
                         "--enable_http_metadata_server=true", "--http_metadata_server_host", "127.0.0.1",
                         "--http_metadata_server_port", str(hport)], mport, metrics_port,
                        str(logs / "master.log")).wait_ready()
    return master, f"http://127.0.0.1:{hport}/metadata"


def _served_from_store(s: VllmServer, prompt: list[int], max_tokens: int, timeout: float = 60) -> tuple[list[int], float]:
    """(tokens, external hits) of ``prompt`` once vLLM loads its prefix from the store: the save
    is asynchronous, so retry (emptying vLLM's own prefix cache each time) until it does."""
    deadline = time.monotonic() + timeout
    while True:
        reset_prefix_cache(s)
        hits0 = metric(http_text(s.url + "/metrics"), EXT_HITS)
        got = completion(s.url, prompt, max_tokens)["choices"][0]["token_ids"]
        hits = metric(http_text(s.url + "/metrics"), EXT_HITS) - hits0
        if hits >= 4 * BLOCK:
            return got, hits
        assert time.monotonic() < deadline, f"the prefix was never loaded from the store:\n{s.log_tail()}"
        time.sleep(1)


@pytest.fixture
def builtin_store(vllm_py: str, tiny_model: Path, tmp_path_factory) -> Iterator[VllmServer]:
    logs = tmp_path_factory.mktemp("vllm-builtin-store")
    master, meta = _master(logs)
    (logs / "mooncake.json").write_text(json.dumps({
        "metadata_server": meta, "master_server_address": master.addr,
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
    got, _ = _served_from_store(s, prompt, 8)
    assert got == own_tokens(s, prompt, 8)


def test_standalone_store_prefix_outlives_a_sigkilled_engine(vllm_py: str, tiny_model: Path, tmp_path) -> None:
    master, meta = _master(tmp_path)
    service = start_mooncake_client(sys.executable, master.addr, meta, free_port(), str(tmp_path / "mooncake_client.log"))
    (tmp_path / "mooncake.json").write_text(json.dumps({
        "mode": "standalone-store", "global_segment_size": 0, "local_buffer_size": "16MB",
        "metadata_server": meta, "master_server_address": master.addr, "protocol": "tcp", "device_name": ""}))
    env = {"MOONCAKE_VLLM_CPU_SHIM": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_SERVER_DEV_MODE": "1",
           "MOONCAKE_CONFIG_PATH": str(tmp_path / "mooncake.json")}
    kv = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}
    rng = random.Random(41)
    prompt = [rng.randrange(3, 300) for _ in range(4 * BLOCK + 11)]
    first = VllmServer(vllm_py, tiny_model, free_port(), 0, tmp_path / "vllm-1.log", kv, env=env)
    second = VllmServer(vllm_py, tiny_model, free_port(), 1, tmp_path / "vllm-2.log", kv, env=env)
    try:
        start_all([first])
        want = completion(first.url, prompt, 8)["choices"][0]["token_ids"]
        _served_from_store(first, prompt, 8)  # the blocks are in the pool
        first.kill()  # SIGKILL: no close(), no goodbye to the master
        start_all([second])
        hits0 = metric(http_text(second.url + "/metrics"), EXT_HITS)
        got = completion(second.url, prompt, 8)["choices"][0]["token_ids"]
        hits = metric(http_text(second.url + "/metrics"), EXT_HITS) - hits0
        assert hits >= 4 * BLOCK, f"the new engine computed the prefix instead of loading it ({hits} hits):\n" \
                                  f"{second.log_tail()}"
        assert got == want
    finally:
        first.stop()
        second.stop()
        stop_process(service)
        master.kill()
