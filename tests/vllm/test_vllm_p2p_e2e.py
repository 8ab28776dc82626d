"""1P1D end to end on real vLLM (CPU) servers with MooncakeCoreConnector.

Two vLLM servers (prefill pinned to core 0, decode to core 1) run the tiny random Llama. We
check that decoding from transferred KV gives exactly the tokens a plain (non-disaggregated)
request gives, that the decode counted the prompt as external prefix-cache hits, that exactly
the needed blocks moved, that the prefill frees its blocks on confirmation or lease expiry,
and -- the negative control -- that corrupting the received blocks changes the output (so the
decode really uses the transferred KV). The proxy path uses our ``mooncake_proxy``.

Tests run in file order; the last one kills the prefill.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import pytest

from concurrent.futures import ThreadPoolExecutor

from mooncake_core.pd.params import concurrent_decode_params, concurrent_prefill_params
from mooncake_core.pd.peer_prefix import PEER_KEY
from mooncake_lab.vllm_harness import (DROP_READY, LEASE_S, completion, free_port, http_json, http_text, metric,
                                       prompt_ids, ranks_that_pulled, start_proxy, stop_proxy, wait_until)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BLOCK = 32
EXT_HITS = "vllm:external_prefix_cache_hits_total"
USAGE = "vllm:kv_cache_usage_perc"
FAILED_PULLS = "vllm:mooncake_core_kv_failed_pulls_total"


def baseline(url: str, prompt: list[int], max_tokens: int = 16) -> list[int]:
    """A plain request on the decode instance; a unique cache_salt guarantees it computes the
    prompt itself instead of reusing KV an earlier (transferred) request left in its prefix cache."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, "ignore_eos": True, "cache_salt": uuid.uuid4().hex}
    return http_json(url + "/v1/completions", body)["choices"][0]["token_ids"]


def prefill(url: str, prompt: list[int]) -> dict:
    r = completion(url, prompt, 1, {"do_remote_decode": True})
    params = r["kv_transfer_params"]
    assert params and params["do_remote_prefill"] is True, r
    return params


def pulled_line(log: str, transfer_id: str) -> dict[str, int]:
    m = re.search(r"kv pulled request=\S+ transfer=" + re.escape(transfer_id) + r" blocks=(\d+) bytes=(\d+)", log)
    assert m, f"no 'kv pulled' log line for transfer {transfer_id}"
    return {"blocks": int(m.group(1)), "bytes": int(m.group(2))}


def test_disaggregated_equals_local_and_moves_exactly_the_blocks(pd_pair):
    p, d = pd_pair
    prompt = prompt_ids(1)
    hits0 = metric(http_text(d.url + "/metrics"), EXT_HITS)
    params = prefill(p.url, prompt)
    assert params["remote_num_tokens"] == len(prompt)
    assert len(params["remote_block_ids"]) == -(-len(prompt) // BLOCK)
    out = completion(d.url, prompt, 16, params)["choices"][0]["token_ids"]
    hits1 = metric(http_text(d.url + "/metrics"), EXT_HITS)
    assert hits1 - hits0 == len(prompt), "decode must count the whole prompt as external (P2P) hits"

    assert out == baseline(d.url, prompt), "greedy output from transferred KV differs from a local run"

    moved = pulled_line(d.log_text(), params["mooncake_transfer_id"])
    nblocks = -(-len(prompt) // BLOCK)
    assert moved["blocks"] == nblocks
    assert moved["bytes"] == nblocks * params["mooncake_block_bytes"] * params["mooncake_num_slabs"]

    # the decode confirmed: the prefill frees the blocks long before the lease would
    wait_until(lambda: metric(http_text(p.url + "/metrics"), USAGE) == 0.0, LEASE_S / 2,
               "prefill KV usage back to 0 after the decode's confirmation")


def test_negative_control_corrupted_blocks_change_the_output(pd_pair):
    p, d = pd_pair
    prompt = prompt_ids(2)
    want = baseline(d.url, prompt)
    params = prefill(p.url, prompt)
    params["mooncake_test_corrupt"] = True  # honoured by the decode's CorruptingMooncakeConnector (conftest)
    got = completion(d.url, prompt, 16, params)["choices"][0]["token_ids"]
    # a failed read is recomputed and would equal ``want`` for another reason
    assert ranks_that_pulled(d, params["mooncake_transfer_id"], 1) == 1, d.connector_log()
    assert got != want, "overwriting the received KV with noise did not change the output: decode ignores it"


@pytest.mark.parametrize("handoff", ["vllm", "mooncake-core"])
def test_through_mooncake_proxy(pd_pair, python_exe, tmp_path, handoff):
    """Both hand-offs; ``mooncake-core`` goes sequentially for the first request (it learns the
    prefill's segment from the answer) and concurrently after that."""
    p, d = pd_pair
    port = free_port()
    log = open(tmp_path / "proxy.log", "wb")
    proc = subprocess.Popen([python_exe, "-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", str(port),
                             "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", str(p.port),
                             "--decoder-hosts", "127.0.0.1", "--decoder-ports", str(d.port),
                             "--handoff", handoff], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"

        def up():
            try:
                return http_json(url + "/v1/models", timeout=5)
            except (urllib.error.URLError, OSError, json.JSONDecodeError):
                return None

        wait_until(up, 60, "the proxy to answer /v1/models", step=0.5)
        concurrent0 = d.log_text().count("transfer=mc-")
        for seed in (3, 4, 13):  # fresh prompts per hand-off: none in the decode's prefix cache
            prompt = prompt_ids(seed + (100 if handoff == "mooncake-core" else 0), 150)
            hits0 = metric(http_text(d.url + "/metrics"), EXT_HITS)
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0,
                    "return_token_ids": True, "ignore_eos": True}
            r = http_json(url + "/v1/completions", body, timeout=180)
            hits1 = metric(http_text(d.url + "/metrics"), EXT_HITS)
            assert hits1 - hits0 == len(prompt), "proxy path did not hand the KV off to the decode"
            assert r["choices"][0]["token_ids"] == baseline(d.url, prompt, 12)
        pulled_concurrently = d.log_text().count("transfer=mc-") - concurrent0
        assert pulled_concurrently == (2 if handoff == "mooncake-core" else 0)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def sse(url: str, body: dict, timeout: float = 180.0) -> list:
    """The ``data:`` events of a streamed completion, decoded (``"[DONE]"`` as the string)."""
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    out = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for ev in r.read().decode().split("\n\n"):
            if ev.strip():
                assert ev.startswith("data: "), ev
                out.append("[DONE]" if ev[6:] == "[DONE]" else json.loads(ev[6:]))
    return out


def test_prefill_first_token_through_proxy(pd_pair, tmp_path):
    """``--prefill-first-token``: the client's first chunk is the prefill's token, the decode gets
    the prompt plus that token and loads the prompt's KV from the prefill; the streamed text and
    the usage equal a plain run's. A one-token request is answered by the prefill alone (and
    leaves no KV held for a decode that never comes); an ineligible one takes the normal path."""
    p, d = pd_pair
    proc, url = start_proxy(p, d, "vllm", tmp_path / "proxy.log", extra=("--prefill-first-token",))
    try:
        for seed, n in ((30, 150), (31, 64), (32, 97)):  # prompt ends mid-block, on a block, mid-block
            prompt = prompt_ids(seed, n)
            want = http_json(d.url + "/v1/completions", {
                "model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                "cache_salt": uuid.uuid4().hex})["choices"][0]["text"]
            hits0 = metric(http_text(d.url + "/metrics"), EXT_HITS)
            evs = sse(url, {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0,
                            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
            hits1 = metric(http_text(d.url + "/metrics"), EXT_HITS)
            assert evs[-1] == "[DONE]"
            texts = [e["choices"][0]["text"] for e in evs[:-1] if e["choices"]]
            assert "".join(texts) == want, "first token from the prefill + decode's rest differ from a plain run"
            assert evs[-2]["usage"] == {"prompt_tokens": n, "completion_tokens": 12, "total_tokens": n + 12}
            assert len({e["id"] for e in evs[:-1]}) == 1, "chunk ids change at the seam"
            assert hits1 - hits0 == n, "the decode did not load the prompt's KV from the prefill"
        m = http_text(url + "/metrics")
        assert metric(m, 'mooncake_proxy_prefill_first_token_total{outcome="streamed"}') == 3

        # one token asked: the prefill answers alone and holds no KV afterwards
        prompt = prompt_ids(33, 90)
        evs = sse(url, {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True})
        one = http_json(d.url + "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 1,
                                                    "temperature": 0, "cache_salt": uuid.uuid4().hex})
        assert [e["choices"][0]["text"] for e in evs[:-1]] == [one["choices"][0]["text"]]
        assert evs[0]["choices"][0]["finish_reason"] == "length" and evs[-1] == "[DONE]"
        m = http_text(url + "/metrics")
        assert metric(m, 'mooncake_proxy_prefill_first_token_total{outcome="prefill_only"}') == 1
        wait_until(lambda: metric(http_text(p.url + "/metrics"), USAGE) == 0.0, LEASE_S / 2,
                   "prefill KV usage 0 after a one-token request (nothing held for a decode)")

        # sampled decoding through the seam: a complete, well-counted answer
        evs = sse(url, {"model": "tiny", "prompt": prompt_ids(34, 120), "max_tokens": 10, "temperature": 1.0,
                        "seed": 7, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
        assert evs[-2]["usage"]["completion_tokens"] == 10 and evs[-1] == "[DONE]"

        # ineligible (stop strings): the normal hand-off, same answer as before
        prompt = prompt_ids(35, 100)
        evs = sse(url, {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                        "stop": ["never-in-this-vocab"], "stream": True})
        assert evs[-1] == "[DONE]" and len([e for e in evs[:-1] if e["choices"]]) >= 1
        m = http_text(url + "/metrics")
        assert metric(m, 'mooncake_proxy_prefill_first_token_total{outcome="ineligible"}') == 1
    finally:
        stop_proxy(proc)


def concurrent_pair(p_url: str, d_url: str, prompt: list[int], segment: str, decode_first: bool,
                    gap_s: float = 1.0, tid: str | None = None) -> list[int]:
    """Prefill and decode of a concurrent hand-off, the second sent ``gap_s`` after the first;
    returns the decode's tokens."""
    tid = tid or f"mc-test-{uuid.uuid4().hex}"

    def run_prefill() -> dict:
        if decode_first:
            time.sleep(gap_s)
        return completion(p_url, prompt, 1, concurrent_prefill_params(tid))

    def run_decode() -> dict:
        if not decode_first:
            time.sleep(gap_s)
        return completion(d_url, prompt, 16, concurrent_decode_params(tid, segment), timeout=180)

    with ThreadPoolExecutor(2) as ex:
        fp, fd = ex.submit(run_prefill), ex.submit(run_decode)
        assert fp.result()["kv_transfer_params"]["mooncake_transfer_id"] == tid
        return fd.result()["choices"][0]["token_ids"]


@pytest.mark.parametrize("decode_first", [True, False], ids=["decode-asks-first", "prefill-finishes-first"])
def test_concurrent_handoff_either_order(pd_pair, decode_first):
    """The decode's ``want`` may reach the prefill worker before or after the request finished."""
    p, d = pd_pair
    segment = prefill(p.url, prompt_ids(20, 40))["mooncake_segment"]  # freed by its lease
    prompt = prompt_ids(21 + decode_first)
    hits0 = metric(http_text(d.url + "/metrics"), EXT_HITS)
    got = concurrent_pair(p.url, d.url, prompt, segment, decode_first)
    assert metric(http_text(d.url + "/metrics"), EXT_HITS) - hits0 == len(prompt)
    assert got == baseline(d.url, prompt)


def test_concurrent_handoff_survives_a_lost_ready(pd_pair):
    """The prefill's ``ready`` is its first contact with the decode's segment and can be lost (the
    test connector drops the first one of this transfer): the decode asks again after
    ``want_retry_s``, the prefill answers again, and the KV still arrives."""
    p, d = pd_pair
    segment = prefill(p.url, prompt_ids(23, 40))["mooncake_segment"]
    prompt = prompt_ids(24)
    tid = f"{DROP_READY}{uuid.uuid4().hex}"
    hits0 = metric(http_text(d.url + "/metrics"), EXT_HITS)
    got = concurrent_pair(p.url, d.url, prompt, segment, decode_first=True, tid=tid)
    assert f"dropped the ready of transfer {tid}" in p.log_text(), "the test connector did not lose the ready"
    assert re.search(rf"no ready from prefill \S+ for transfer {tid} yet; asking again", d.log_text())
    assert metric(http_text(d.url + "/metrics"), EXT_HITS) - hits0 == len(prompt), \
        "the decode did not get the KV after asking again"
    assert got == baseline(d.url, prompt)


def test_concurrent_decode_aborted_while_waiting_frees_its_blocks(pd_pair):
    """A decode waiting for a prefill that never comes, then abandoned by its client: vLLM aborts
    it; its blocks (kept while a read could write them) are freed and the decode keeps serving."""
    p, d = pd_pair
    segment = prefill(p.url, prompt_ids(30, 40))["mooncake_segment"]
    wait_until(lambda: metric(http_text(d.url + "/metrics"), USAGE) == 0.0, 30, "decode idle")
    with pytest.raises((urllib.error.URLError, TimeoutError, OSError)):
        completion(d.url, prompt_ids(31), 8, concurrent_decode_params(f"mc-never-{uuid.uuid4().hex}", segment),
                   timeout=4)
    wait_until(lambda: metric(http_text(d.url + "/metrics"), USAGE) == 0.0, 30,
               "decode KV usage back to 0 after the abort")
    other = prompt_ids(32, 64)
    assert completion(d.url, other, 8)["choices"][0]["token_ids"] == baseline(d.url, other, 8)


def test_bad_params_fall_back_to_local_compute(pd_pair):
    """Garbage (or another connector's) params never crash the decode: it computes the prompt."""
    _, d = pd_pair
    prompt = prompt_ids(5, 80)
    want = baseline(d.url, prompt)
    bad = {"do_remote_prefill": True, "mooncake_version": 1, "mooncake_segment": "no-port",
           "remote_block_ids": [1, 2, 3], "remote_num_tokens": 80}
    assert completion(d.url, prompt, 16, bad)["choices"][0]["token_ids"] == want
    assert "mooncake_segment" in d.log_text()  # the error names the offending key


def _held(p) -> float:
    return metric(http_text(p.url + "/metrics"), USAGE)


def test_peer_prefix_hint_loads_the_prefix_from_another_instance(pd_pair):
    """The proxy's peer prefix hint (mooncake_core/pd/peer_prefix.py): the peer exports a prefix
    (a hand-off request of the prefix alone), the other instance reads those blocks, computes the
    rest of its prompt, and answers exactly what it computes alone; the peer frees its blocks on
    the reader's confirmation."""
    p, d = pd_pair
    prompt = prompt_ids(61, 4 * BLOCK + 9)
    export = prefill(p.url, prompt[:4 * BLOCK])
    assert export["remote_num_tokens"] == 4 * BLOCK and len(export["mooncake_tokens_digest"]) == 32
    h0 = metric(http_text(d.url + "/metrics"), EXT_HITS)
    got = completion(d.url, prompt, 12, {PEER_KEY: export})["choices"][0]["token_ids"]
    assert metric(http_text(d.url + "/metrics"), EXT_HITS) - h0 == 4 * BLOCK, "the prefix was not loaded"
    assert "peer prefix request=" in d.log_text()
    assert pulled_line(d.log_text(), export["mooncake_transfer_id"])["blocks"] == 4
    assert got == baseline(d.url, prompt, 12), "output with the peer's prefix differs from local compute"
    wait_until(lambda: _held(p) == 0.0, 30, "the peer to free the exported blocks after the read")


def test_peer_prefix_of_another_prompt_is_refused_and_released(pd_pair):
    """A hint whose blocks hold another prompt's KV (digest differs): nothing is read, the
    engine computes (same output), and the peer is told to free its blocks before its lease."""
    p, d = pd_pair
    export = prefill(p.url, prompt_ids(62, 3 * BLOCK))
    t0 = time.monotonic()
    prompt = prompt_ids(63, 3 * BLOCK + 5)
    h0 = metric(http_text(d.url + "/metrics"), EXT_HITS)
    got = completion(d.url, prompt, 12, {PEER_KEY: export})["choices"][0]["token_ids"]
    assert metric(http_text(d.url + "/metrics"), EXT_HITS) == h0, "blocks of another prompt were loaded"
    assert "digest differs" in d.log_text()
    assert got == baseline(d.url, prompt, 12)
    wait_until(lambda: _held(p) == 0.0, LEASE_S, "the peer to free the refused export")
    assert time.monotonic() - t0 < LEASE_S, "freed by the lease, not by the reader's release"


def test_refused_handoff_is_released_before_the_lease(pd_pair):
    """A hand-off the decode refuses -- here params naming another block size, as from a prefill
    started with another --block-size -- is computed locally, and the prefill is told to free
    its blocks at once instead of holding them to its lease's end."""
    p, d = pd_pair
    prompt = prompt_ids(64, 3 * BLOCK)
    want = baseline(d.url, prompt, 8)
    params = prefill(p.url, prompt)
    assert _held(p) > 0.0, "the prefill should hold the blocks for the decode"
    t0 = time.monotonic()
    h0 = metric(http_text(d.url + "/metrics"), EXT_HITS)
    got = completion(d.url, prompt, 8, {**params, "mooncake_block_size": 2 * BLOCK})["choices"][0]["token_ids"]
    assert got == want
    assert metric(http_text(d.url + "/metrics"), EXT_HITS) == h0, "a refused hand-off was loaded"
    assert f"prefill block size {2 * BLOCK} != decode block size {BLOCK}" in d.log_text()
    wait_until(lambda: _held(p) == 0.0, LEASE_S, "the prefill to free the refused hand-off's blocks")
    assert time.monotonic() - t0 < LEASE_S * 0.75, "freed by the lease, not by the decode's release"


def test_unclaimed_blocks_are_freed_when_the_lease_expires(pd_pair):
    p, _ = pd_pair
    prefill(p.url, prompt_ids(6))  # no decode ever comes for it
    assert metric(http_text(p.url + "/metrics"), USAGE) > 0.0, "prefill should hold the blocks for a decode"
    t0 = time.monotonic()
    wait_until(lambda: metric(http_text(p.url + "/metrics"), USAGE) == 0.0, LEASE_S + 30,
               "prefill to free unclaimed blocks after the lease")
    assert time.monotonic() - t0 > LEASE_S / 3  # freed by the lease, not right away
    assert "lease expired without a decode confirmation" in p.log_text()


def test_prefill_killed_decode_recomputes_and_keeps_serving(pd_pair):
    """Runs last: kills the prefill. The decode (kv_load_failure_policy=recompute) must answer
    correctly within the timeout and keep serving, with no blocks leaked."""
    p, d = pd_pair
    prompt = prompt_ids(7)
    want = baseline(d.url, prompt)
    params = prefill(p.url, prompt)
    failed0 = metric(http_text(d.url + "/metrics"), FAILED_PULLS)
    p.kill()
    t0 = time.monotonic()
    got = completion(d.url, prompt, 16, params, timeout=120)["choices"][0]["token_ids"]
    assert got == want
    assert time.monotonic() - t0 < 90
    assert "failed" in d.log_text()
    # the connector's stats hook counted the one failed pull on the decode's own /metrics
    wait_until(lambda: metric(http_text(d.url + "/metrics"), FAILED_PULLS) - failed0 == 1, 30,
               "the decode's failed-pulls counter to grow by 1")
    other = prompt_ids(8, 64)
    assert completion(d.url, other, 8)["choices"][0]["token_ids"] == baseline(d.url, other, 8)
    wait_until(lambda: metric(http_text(d.url + "/metrics"), USAGE) == 0.0, 30, "decode KV usage back to 0")
