"""The proxy's per-instance prefix index follows a real vLLM's KV cache through its KV events.

One vLLM CPU server with a cache far smaller than the prompts sent (``--num-gpu-blocks-override``),
publishing KV events over ZMQ (``--kv-events-config``); our proxy, in the vLLM venv (it needs
``transformers`` for ``--tokenizer``), subscribed to them (``--kv-events-config``), with the
engine's tokenizer and block size, routing text and chat prompts to it (a fake engine takes the
decode leg). After the cache has filled past capacity, each prompt is re-sent straight to the
engine: before every probe the proxy says how many leading blocks it believes the engine holds
(``POST /admin/prefix``), and the engine's own answer -- ``usage.prompt_tokens_details.cached_tokens``
(``--enable-prompt-tokens-details``) -- must equal it, token count included. Evictions, partial
prefixes, full hits and chat prompts (the tokenizer's chat template) are all exercised.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.vllm_harness import REPO, VllmServer, free_port, http_json, http_text, metric, start_all

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BLOCK = 32
NUM_BLOCKS = 24  # ~750 tokens of KV (one is vLLM's null block); the prompts below need ~3x that
WORDS = ("the a of to and in is that for it as was with on be by this are from at or an mooncake cache "
         "block token prefill decode transfer engine store memory kv layer head model request server proxy "
         "latency throughput batch vector tensor stream queue node alpha beta gamma delta one two three").split()


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def _wait_http(url: str, proc: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            http_text(url, timeout=5)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{what} not answering {url} after {timeout:.0f} s")


@pytest.fixture(scope="module")
def engine_and_proxy(vllm_py: str, tiny_model: Path, tmp_path_factory) -> Iterator[tuple[VllmServer, str, str]]:
    logs = tmp_path_factory.mktemp("vllm-kv-events")
    ev_port = free_port()
    # vLLM binds a '*' endpoint (a host name would make it connect); the proxy connects to it
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{ev_port}", "topic": "kv"}
    eng = VllmServer(vllm_py, tiny_model, free_port(), 0, logs / "vllm.log",
                     args=["--num-gpu-blocks-override", NUM_BLOCKS, "--enable-prompt-tokens-details",
                           "--kv-events-config", json.dumps(events)])
    fport, pport = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": shim_pythonpath(), "PYTHONUNBUFFERED": "1"}
    procs: list[subprocess.Popen] = []
    try:
        start_all([eng])
        flog = open(logs / "fake_decode.log", "wb")
        procs.append(subprocess.Popen([sys.executable, "-m", "mooncake_proxy.fake_engine", "--port", str(fport)],
                                      stdout=flog, stderr=subprocess.STDOUT, env=env, cwd=REPO))
        plog = open(logs / "proxy.log", "wb")
        procs.append(subprocess.Popen(
            [vllm_py, "-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", str(pport),
             "--prefill", eng.url, "--decode", f"http://127.0.0.1:{fport}", "--policy", "cache_aware",
             "--block-size", str(BLOCK), "--tokenizer", str(tiny_model), "--health-interval", "1",
             "--kv-events-config", json.dumps({eng.url: {"endpoint": f"tcp://127.0.0.1:{ev_port}", "topic": "kv"}})],
            stdout=plog, stderr=subprocess.STDOUT, env=env, cwd=REPO))
        purl = f"http://127.0.0.1:{pport}"
        _wait_http(f"http://127.0.0.1:{fport}/health", procs[0], "fake decode engine")
        _wait_http(purl + "/health", procs[1], f"proxy (log {logs / 'proxy.log'})")
        yield eng, purl, f"prefill@{eng.url}"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        eng.stop()


def _events_seen(purl: str) -> float:
    return metric(http_text(purl + "/metrics"), "mooncake_proxy_kv_events_total")


def _settle(purl: str, quiet_s: float = 0.6, timeout: float = 30.0) -> None:
    """Wait until the proxy has applied everything the engine published (no new event for
    ``quiet_s``; the engine is idle between our requests)."""
    deadline = time.monotonic() + timeout
    last, since = _events_seen(purl), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "KV events never went quiet"
        time.sleep(0.1)
        now = _events_seen(purl)
        if now != last:
            last, since = now, time.monotonic()


def _view(purl: str, body: dict, route: str) -> dict:
    return http_json(f"{purl}/admin/prefix?route={route}", body)


def _body(route: str, prompt) -> dict:
    body = {"model": "tiny", "max_tokens": 1, "temperature": 0}
    return {**body, "messages": prompt} if route.endswith("chat/completions") else {**body, "prompt": prompt}


def test_index_matches_engine_cache_after_evictions(engine_and_proxy):
    eng, purl, iid = engine_and_proxy
    rng = random.Random(16)
    system = _text(rng, 80)
    texts = [f"{system} {_text(rng, 180)}" for _ in range(9)]
    chat_sys = _text(rng, 80)
    chats = [[{"role": "system", "content": chat_sys}, {"role": "user", "content": _text(rng, 60)}]
             for _ in range(3)]
    prompts = [("/v1/completions", t) for t in texts] + [("/v1/chat/completions", c) for c in chats]
    # fill through the proxy: more distinct blocks than the engine holds
    total_blocks = 0
    for route, prompt in prompts:
        r = http_json(purl + route, _body(route, prompt))
        assert "choices" in r, r
        total_blocks += _view(purl, _body(route, prompt), route)["blocks"]
    assert total_blocks > 2 * NUM_BLOCKS, f"prompts too short to overflow the cache: {total_blocks} blocks"
    _settle(purl)
    m = http_text(purl + "/metrics")
    assert 'type="removed"' in m, "the engine evicted nothing (cache too big?) or its events never arrived"

    outcomes = []
    order = prompts[:] + prompts[:4]
    rng.shuffle(order)
    for route, prompt in order:
        body = _body(route, prompt)
        view = _view(purl, body, route)
        predicted = view["instances"][iid]
        ans = http_json(eng.url + route, body)  # straight to the engine: its own prefix cache decides
        usage = ans["usage"]
        n = usage["prompt_tokens"]
        assert n == view["prompt_tokens"], (
            f"{route}: the proxy tokenizes the prompt to {view['prompt_tokens']} tokens, the engine to {n}")
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        # vLLM always computes the prompt's last token, so a fully cached prompt hits (n-1)//BLOCK blocks
        expect = min(predicted, (n - 1) // BLOCK) * BLOCK
        assert cached == expect, (f"{route}: the proxy's index says {predicted} of {view['blocks']} blocks are "
                                  f"cached, the engine reused {cached} tokens")
        outcomes.append((route, predicted, view["blocks"]))
        _settle(purl)
        after = _view(purl, body, route)["instances"][iid]
        assert after == view["blocks"], "the probe's own blocks are not in the index after its events"
    assert any(p == 0 for _, p, _ in outcomes), "no probe missed: the cache never evicted a probed prompt"
    assert any(0 < p < b for _, p, b in outcomes), "no partial prefix hit (the shared prefix kept, the rest evicted)"
    assert any(p == b for _, p, b in outcomes), "no full hit"
    assert any(r.endswith("chat/completions") and p > 0 for r, p, _ in outcomes), "no chat prompt hit"
