"""MooncakeCoreStoreConnector's failure paths on one real vLLM instance (issue 19).

One ``kv_both`` vLLM instance with the store connector and a real ``mooncake_master`` that the
tests kill and restart on the same port. What must hold:

* master killed while a request runs (its save happens with the master gone): the request
  completes, the save fails within the configured RPC timeout with a log line, the engine keeps
  serving; once the master is back, saves and loads work again;
* master killed before a load: the store lookup fails, the engine recomputes, and the output
  equals the instance's own computation (a salted request);
* the store full (the instance's segment filled with hard-pinned objects): saves fail with a log
  line naming the key and the code, generation is unaffected; once room is made, saves work.

Loads are exercised on the one instance by emptying vLLM's own prefix cache (dev endpoint
``/reset_prefix_cache``) so a repeated prefix can only come from the store.
"""

from __future__ import annotations

import random
import re
import time
from pathlib import Path
from typing import Iterator

import pytest

from mooncake_lab.master_proc import MasterProc
from mooncake_core.store import MooncakeDistributedStore, ReplicateConfig
from mooncake_lab.vllm_harness import (VllmServer, completion, free_port, http_text, metric, own_tokens, reset_prefix_cache,
                          start_all)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BLOCK = 32
EXT_HITS = "vllm:external_prefix_cache_hits_total"
RPC_TIMEOUT_S = 3.0
SEGMENT = 8 << 20  # the instance's contribution to the pool: small enough to fill from the test


class Rig:
    """The instance, the master (restartable on its ports) and the paths they log to."""

    def __init__(self, server: VllmServer, master_args: list[str], mport: int, metrics_port: int, logs: Path):
        self.server, self.master_args, self.mport, self.metrics_port, self.logs = (server, master_args, mport,
                                                                                   metrics_port, logs)
        self.master: MasterProc | None = None

    def start_master(self) -> None:
        self.master = MasterProc(self.master_args, self.mport, self.metrics_port,
                                 str(self.logs / "master.log")).wait_ready()

    def kill_master(self) -> None:
        assert self.master is not None
        self.master.kill()
        self.master = None


@pytest.fixture(scope="module")
def rig(vllm_py: str, tiny_model: Path, tmp_path_factory) -> Iterator[Rig]:
    logs = tmp_path_factory.mktemp("vllm-store-fail")
    mport, hport, metrics_port = free_port(), free_port(), free_port()
    args = ["--port", str(mport), "--rpc_address", "127.0.0.1", "--metrics_port", str(metrics_port),
            "--enable_http_metadata_server=true", "--http_metadata_server_host", "127.0.0.1",
            "--http_metadata_server_port", str(hport), "--client_ttl", "30"]
    cfg = {"kv_connector": "MooncakeCoreStoreConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
           "kv_connector_extra_config": {"master_server_address": f"127.0.0.1:{mport}",
                                         "metadata_server": f"http://127.0.0.1:{hport}/metadata",
                                         "global_segment_size": str(SEGMENT), "local_buffer_size": "16MB",
                                         "local_hostname": "127.0.0.1"}}
    server = VllmServer(vllm_py, tiny_model, free_port(), 0, logs / "vllm.log", cfg,
                        env={"MC_STORE_RPC_TIMEOUT": str(RPC_TIMEOUT_S), "VLLM_SERVER_DEV_MODE": "1"})
    r = Rig(server, args, mport, metrics_port, logs)
    r.start_master()
    try:
        start_all([server])
        yield r
    finally:
        server.stop()
        if r.master is not None:
            r.master.kill()


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 300) for _ in range(n)]


def _wait_log(server: VllmServer, pattern: str, after: int, timeout: float = 60.0) -> re.Match:
    """The first match of ``pattern`` in the log past offset ``after`` (fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        m = re.search(pattern, server.log_text()[after:])
        if m:
            return m
        assert time.monotonic() < deadline, f"no {pattern!r} in the vLLM log; tail:\n{server.log_tail()}"
        time.sleep(0.25)


def _saved_and_reloaded(r: Rig, seed: int) -> None:
    """A prompt served now is saved, and after the local cache is emptied it is loaded from the store."""
    s = r.server
    prompt = _prompt(seed, 4 * BLOCK + 9)
    mark = len(s.log_text())
    rid = completion(s.url, prompt, 4)["id"]  # vLLM's request id is this plus a suffix
    m = _wait_log(s, rf"kv saved request={re.escape(rid)}\S* blocks=(\d+)", mark)
    assert int(m.group(1)) == 4, m.group(0)
    reset_prefix_cache(s)
    hits0 = metric(http_text(s.url + "/metrics"), EXT_HITS)
    got = completion(s.url, prompt, 8)["choices"][0]["token_ids"]
    assert metric(http_text(s.url + "/metrics"), EXT_HITS) - hits0 == 4 * BLOCK, "the prefix was not loaded"
    assert got == own_tokens(s, prompt, 8)


def _wait_store_back(r: Rig, seed: int, timeout: float = 90.0) -> None:
    """After a master restart: the segment re-mounts with the next heartbeat and the connector's
    back-off (at most 30 s) ends; then saves and loads must work again."""
    deadline = time.monotonic() + timeout
    while True:
        try:  # a new prompt each try: one already in the store is not saved (nor logged) again
            _saved_and_reloaded(r, seed)
            return
        except AssertionError:
            assert time.monotonic() < deadline, "saves/loads did not recover after the master came back"
            time.sleep(2)
            seed += 1000


def test_store_round_trip_on_one_instance(rig: Rig):
    """The baseline the failure tests rely on: save, empty the local cache, load."""
    _saved_and_reloaded(rig, 1)


def test_master_killed_during_request_then_back(rig: Rig):
    s = rig.server
    prompt = _prompt(2, 3 * BLOCK + 5)
    mark = len(s.log_text())
    rig.kill_master()
    t0 = time.monotonic()
    got = completion(s.url, prompt, 6, timeout=60)["choices"][0]["token_ids"]
    # the lookup waited at most one RPC timeout (plus the 2-core box's slack)
    assert time.monotonic() - t0 < RPC_TIMEOUT_S * 3 + 15
    assert len(got) == 6
    # the next requests do not wait for the master again: the connector backs off (each lookup
    # used to stall the scheduler -- every running request -- for a whole RPC timeout)
    t1 = time.monotonic()
    for seed in (7, 8):
        assert len(completion(s.url, _prompt(seed, 2 * BLOCK + 1), 2, timeout=60)["choices"][0]["token_ids"]) == 2
    assert time.monotonic() - t1 < RPC_TIMEOUT_S, "requests kept waiting for the dead master"
    _wait_log(s, r"MooncakeCoreStoreConnector: (saving request \S+ failed|saved 0 of \d+ blocks|"
                 r"save of request \S+ skipped)", mark, timeout=RPC_TIMEOUT_S * 4 + 20)
    assert s.proc is not None and s.proc.poll() is None, "the vLLM server died"
    assert http_text(s.url + "/health") == ""
    assert got == own_tokens(s, prompt, 6)
    rig.start_master()
    _wait_store_back(rig, 3)


def test_master_killed_before_load_recomputes(rig: Rig):
    s = rig.server
    prompt = _prompt(4, 4 * BLOCK + 3)
    mark = len(s.log_text())
    completion(s.url, prompt, 4)
    _wait_log(s, r"kv saved request=\S+ blocks=4", mark)
    reset_prefix_cache(s)
    rig.kill_master()
    try:
        hits0 = metric(http_text(s.url + "/metrics"), EXT_HITS)
        got = completion(s.url, prompt, 8, timeout=60)["choices"][0]["token_ids"]
        assert metric(http_text(s.url + "/metrics"), EXT_HITS) == hits0, "hits reported with the master gone"
        assert got == own_tokens(s, prompt, 8), "the recomputed output differs from the local computation"
    finally:
        rig.start_master()
    _wait_store_back(rig, 9)


def test_store_full_saves_fail_cleanly(rig: Rig):
    s = rig.server
    filler = MooncakeDistributedStore()
    extra = s.kv_config["kv_connector_extra_config"]
    assert filler.setup("127.0.0.1", extra["metadata_server"], 0, 16 << 20, "tcp", "",
                        extra["master_server_address"]) == 0
    cfg = ReplicateConfig()
    cfg.with_hard_pin = True
    filled = 0
    try:
        deadline = time.monotonic() + 60
        rc = filler.put("filler-0", bytes(8 << 10), cfg)
        while rc != 0:  # after a master restart the instance's segment comes back with its heartbeat
            assert time.monotonic() < deadline, f"the filler could not put anything (code {rc})"
            time.sleep(1)
            rc = filler.put("filler-0", bytes(8 << 10), cfg)
        filled = 1
        assert filler.remove_all(True) >= 1  # the earlier KV blocks could be evicted to make room
        filled = 0
        for chunk in (bytes(256 << 10), bytes(8 << 10)):  # big pieces, then the gaps (hard pins: no eviction)
            while filled < 2 * SEGMENT // len(chunk):
                rc = filler.put(f"filler-{filled}", chunk, cfg)
                if rc != 0:
                    break
                filled += 1
            assert rc != 0, "the segment never filled up"
        prompt = _prompt(5, 3 * BLOCK + 7)
        mark = len(s.log_text())
        got = completion(s.url, prompt, 6)["choices"][0]["token_ids"]
        m = _wait_log(s, r"saved (\d+) of (\d+) blocks of request \S+ \(first failure: key (\S+) code (-\d+)", mark)
        assert int(m.group(1)) < int(m.group(2)), m.group(0)
        assert got == own_tokens(s, prompt, 6), "generation changed with the store full"
        assert s.proc is not None and s.proc.poll() is None
    finally:
        for i in range(filled):
            filler.remove(f"filler-{i}", True)
        filler.close()
    _saved_and_reloaded(rig, 6)  # room again: saves and loads work
