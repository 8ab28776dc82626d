"""The P2P lease across hosts whose clocks differ (real vLLM 1P1D): the prefill's wall clock is
shifted by +10 s and by -10 s (an injected clock in the test connector, the machine's left alone).
The prefill states its lease expiry on its clock; the decode measures that clock's offset against
its own (one notification round trip) and checks the lease on its own clock with the offset taken
out. So with either skew: a hand-off read at once pulls the KV (a -10 s skew does not make a live
lease look expired) and the output is byte-exact; a decode that comes after the lease ended (the
prefill freed the blocks) does not read them -- a counted, logged ``lease`` failure, then a
recompute, still byte-exact (a +10 s skew does not stretch the lease on the decode's side)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.vllm_harness import (VllmServer, completion, free_port, http_json, http_text, metric, p2p_config,
                                       prompt_ids, start_all, wait_until)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
HERE = str(Path(__file__).resolve().parent)
LEASE = 4.0
PULLED = "vllm:mooncake_core_kv_pulled_blocks_total"
FAILED_LEASE = 'vllm:mooncake_core_kv_failed_pulls_total{'


def _lease_failures(text: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(FAILED_LEASE) and 'reason="lease"' in line)


def _baseline(url: str, prompt: list[int]) -> list[int]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0, "return_token_ids": True,
            "ignore_eos": True, "cache_salt": uuid.uuid4().hex}
    return http_json(url + "/v1/completions", body)["choices"][0]["token_ids"]


@pytest.fixture(scope="module")
def skewed_pair(vllm_py: str, tiny_model: Path, tmp_path_factory) -> Iterator[tuple[VllmServer, VllmServer, Path]]:
    logs = tmp_path_factory.mktemp("vllm-skew")
    skew = logs / "prefill-clock-skew"
    skew.write_text("0")
    test_connector = dict(kv_connector="CorruptingMooncakeConnector", kv_connector_module_path="corrupting_connector")
    env = {"PYTHONPATH": os.pathsep.join([shim_pythonpath(), HERE]), "MOONCAKE_TEST_CLOCK_SKEW_FILE": str(skew)}
    p = VllmServer(vllm_py, tiny_model, free_port(), 0, logs / "prefill.log",
                   dict(p2p_config("kv_producer", kv_lease_s=LEASE), **test_connector), env=env)
    d = VllmServer(vllm_py, tiny_model, free_port(), 1, logs / "decode.log",
                   dict(p2p_config("kv_consumer", clock_refresh_s=1.0), kv_load_failure_policy="recompute"))
    start_all([p, d])
    try:
        yield p, d, skew
    finally:
        p.stop()
        d.stop()


def _set_skew(p: VllmServer, d: VllmServer, skew: Path, seconds: float, seed: int) -> None:
    """Shift the prefill's clock, then let the decode measure it again (its offsets are at most
    clock_refresh_s old; a hand-off made after that uses the new one)."""
    skew.write_text(str(seconds))
    time.sleep(1.5)
    prompt = prompt_ids(seed, 96)
    completion(d.url, prompt, 2, completion(p.url, prompt, 1, {"do_remote_decode": True})["kv_transfer_params"])
    time.sleep(0.5)  # the refreshed offset's answer lands


@pytest.mark.parametrize("seconds", [10.0, -10.0])
def test_skewed_prefill_clock_neither_stretches_nor_kills_the_lease(skewed_pair, seconds: float) -> None:
    p, d, skew = skewed_pair
    _set_skew(p, d, skew, seconds, 900 + int(seconds))
    # 1. read at once: the KV is pulled (the lease is alive, whatever the prefill's clock says)
    m0 = http_text(d.url + "/metrics")
    for i in range(3):
        prompt = prompt_ids(1000 + i + int(seconds) * 10, 160)
        params = completion(p.url, prompt, 1, {"do_remote_decode": True})["kv_transfer_params"]
        assert completion(d.url, prompt, 12, params)["choices"][0]["token_ids"] == _baseline(d.url, prompt)
    # (the connector's counters reach /metrics with vLLM's stats, a step or a logging interval later)
    wait_until(lambda: metric(http_text(d.url + "/metrics"), PULLED) - metric(m0, PULLED) >= 3 * (160 // 32), 30,
               "the KV of 3 hand-offs pulled (a live lease must not look expired)")
    m1 = http_text(d.url + "/metrics")
    assert _lease_failures(m1) == _lease_failures(m0)
    assert "computing locally" not in d.log_text()
    # 2. the decode comes after the lease ended: no read of freed blocks, a counted failure, correct output
    prompt = prompt_ids(2000 + int(seconds), 160)
    params = completion(p.url, prompt, 1, {"do_remote_decode": True})["kv_transfer_params"]
    time.sleep(LEASE + 1.0)  # the prefill frees the blocks at LEASE s (its own clock: durations are exact)
    got = completion(d.url, prompt, 12, params)["choices"][0]["token_ids"]
    wait_until(lambda: _lease_failures(http_text(d.url + "/metrics")) - _lease_failures(m1) == 1, 30,
               "one counted lease failure (the decode must not read after the prefill's lease ended)")
    assert metric(http_text(d.url + "/metrics"), PULLED) == metric(m1, PULLED), "read blocks the prefill had freed"
    assert got == _baseline(d.url, prompt)
    assert "clock of prefill" in d.log_text() and "lease" in d.log_text()
