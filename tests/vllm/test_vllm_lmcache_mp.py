"""vLLM CPU with LMCache's multiprocess mode (``LMCacheMPConnector``) and our store as its L2.

One vLLM server (the LMCache-shipped ``LMCacheMPConnector``, CPU KV through LMCache's
engine-driven transfer) and one LMCache MP cache server whose L2 tier is
``MooncakeStoreL2Adapter`` on a real ``mooncake_master``. A prompt is served (its full chunks
go to LMCache's L1 and to the store); then LMCache's L1 and vLLM's prefix cache are emptied, so
the repeated prompt's prefix can only come from the store: vLLM reports it as external hits,
the MP server's prefetch says the chunks came from L2, and the greedy output equals the first.
Negative control: with the store's objects removed, the same prompt has no external hits.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mooncake_core import envs
from mooncake_core.store.master_client import MasterClient
from mooncake_lab.lmcache_harness import LMC_ENV, MPServer, adapter_spec
from mooncake_lab.store_procs import Master
from mooncake_lab.vllm_harness import VllmServer, completion, free_port, http_text, metric, reset_prefix_cache

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BLOCK = 32  # vLLM's block size in these tests = LMCache's chunk size here
EXT_HITS = "vllm:external_prefix_cache_hits_total"


def store_keys(m: Master) -> list[str]:
    with MasterClient(m.addr, timeout=5.0) as mc:
        return list(mc.watch_keys(0).snapshot)


def test_vllm_lmcache_mp_connector_reads_prefix_back_from_our_store(vllm_py: str, tiny_model: Path,
                                                                    tmp_path) -> None:
    probe = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('lmcache') else 1)"
    ok = subprocess.run([vllm_py, "-c", probe], capture_output=True, timeout=60)
    if ok.returncode != 0:
        msg = "LMCache is not installed in the vLLM venv (scripts/install_lmcache.sh)"
        if envs.require("lmcache"):
            pytest.fail(msg)
        pytest.skip(msg)
    m = Master(sys.executable, str(tmp_path)).start()
    mp = MPServer(vllm_py, tmp_path / "lmcache-mp.log",
                  adapter_spec(m.addr, m.meta, global_segment_size=str(64 << 20)),
                  "--supported-transfer-mode", "auto", chunk_size=BLOCK)
    cfg = {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": mp.port}}
    v = VllmServer(vllm_py, tiny_model, free_port(), 0, tmp_path / "vllm.log", cfg,
                   env={"VLLM_SERVER_DEV_MODE": "1", **LMC_ENV})
    try:
        v.start()  # at once: the connector's requests wait in ZeroMQ until the cache server is up
        mp.wait_ready()
        v.wait_healthy()
        rng = random.Random(44)
        prompt = [rng.randrange(3, 300) for _ in range(5 * BLOCK + 20)]
        first = completion(v.url, prompt, 8)["choices"][0]["token_ids"]
        deadline = time.monotonic() + 60
        while len(store_keys(m)) < 5:  # LMCache's store controller writes L2 after the request
            assert time.monotonic() < deadline, f"the store holds {store_keys(m)}\n{mp.text()[-3000:]}"
            time.sleep(0.3)

        def again() -> tuple[list[int], float]:
            mp.clear_l1()
            reset_prefix_cache(v)
            hits0 = metric(http_text(v.url + "/metrics"), EXT_HITS)
            got = completion(v.url, prompt, 8)["choices"][0]["token_ids"]
            return got, metric(http_text(v.url + "/metrics"), EXT_HITS) - hits0

        got, hits = again()
        assert hits == 5 * BLOCK, (hits, mp.text()[-3000:])
        assert got == first
        assert "(0 L1, 5 L2)" in mp.text(), mp.text()[-3000:]

        with MasterClient(m.addr, timeout=5.0) as mc:
            assert mc.remove_all(True) >= 5
        got, hits = again()
        assert hits == 0 and got == first
    finally:
        v.stop()
        mp.stop()
        m.stop()
