"""Hand-off protocols end to end: what each fake instance received, field by field."""

from __future__ import annotations

import asyncio
import json
import random
import string

import pytest

from mooncake_proxy.fake_engine import Behaviour

pytestmark = pytest.mark.integration


def rand_text(n: int) -> str:
    return "".join(random.choices(string.ascii_letters + " ", k=n))


def sse_payloads(raw: bytes) -> list[str]:
    return [line[len(b"data: "):].decode() for line in raw.split(b"\n\n") if line.startswith(b"data: ")]


async def test_vllm_handoff_completions_streaming(make_env) -> None:
    env = await make_env(decode_behaviour=Behaviour(chunks=6))
    prompt = rand_text(3000)
    body = {"model": "m", "prompt": prompt, "max_tokens": 37, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.3}
    async with env.session.post(env.url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        raw = await r.read()
        rid = r.headers["X-Request-Id"]
    assert r.headers["Content-Type"].startswith("text/event-stream")
    [pre] = env.prefills[0].records
    [dec] = env.decodes[0].records
    # prefill: one token, not streamed, NixlConnector-style params
    assert pre.path == "/v1/completions"
    assert pre.body["max_tokens"] == 1 and pre.body["stream"] is False
    assert "stream_options" not in pre.body
    assert pre.body["prompt"] == prompt and pre.body["temperature"] == 0.3
    assert pre.body["kv_transfer_params"] == {
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None}
    # decode: the original request plus what the prefill answered
    expect = dict(body)
    expect["kv_transfer_params"] = {"do_remote_prefill": True, "do_remote_decode": False,
                                    "remote_engine_id": "fake-engine", "remote_block_ids": [1, 2, 3],
                                    "remote_host": "127.0.0.1", "remote_port": 5600,
                                    "remote_request_id": rid}
    assert dec.body == expect
    assert pre.request_id == dec.request_id == rid and rid
    payloads = sse_payloads(raw)
    assert payloads[-1] == "[DONE]"
    assert [json.loads(p)["seq"] for p in payloads[:-1]] == list(range(6))
    assert all(json.loads(p)["served_by"] == "decode0" for p in payloads[:-1])


async def test_vllm_handoff_chat_sets_max_completion_tokens(make_env) -> None:
    env = await make_env()
    body = {"model": "m", "messages": [{"role": "user", "content": rand_text(200)}], "max_tokens": 5}
    async with env.session.post(env.url + "/v1/chat/completions", json=body,
                                headers={"X-Request-Id": "my-req-42"}) as r:
        assert r.status == 200
        data = await r.json()
        assert r.headers["X-Request-Id"] == "my-req-42"
    [pre] = env.prefills[0].records
    [dec] = env.decodes[0].records
    assert pre.path == dec.path == "/v1/chat/completions"
    assert pre.body["max_completion_tokens"] == 1 and pre.body["max_tokens"] == 1
    assert dec.body["max_tokens"] == 5 and "max_completion_tokens" not in dec.body
    assert pre.request_id == dec.request_id == "my-req-42"
    # non-streaming answer passes through as the decode wrote it
    assert data["served_by"] == "decode0" and data["choices"][0]["text"] == "x"


async def test_answer_ids_carry_one_prefix(make_env) -> None:
    """The engine prefixes the proxy's X-Request-Id (``cmpl-``, ``chatcmpl-``, as vLLM does), so
    the id the proxy makes up must not carry that prefix itself: ``cmpl-<hex>``, never ``cmpl-cmpl-``."""
    import re

    env = await make_env()
    for route, body, prefix in (("/v1/completions", {"prompt": "hi", "max_tokens": 3}, "cmpl-"),
                                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                          "max_tokens": 3}, "chatcmpl-")):
        for stream in (False, True):
            async with env.session.post(env.url + route, json={**body, "model": "m", "stream": stream}) as r:
                assert r.status == 200, await r.text()
                ids = ([json.loads(p)["id"] for p in sse_payloads(await r.read())[:-1]] if stream
                       else [(await r.json())["id"]])
            assert ids and all(re.fullmatch(re.escape(prefix) + "[0-9a-f]{32}", i) for i in ids), (route, ids)


async def test_mooncake_handoff_concurrent_transfer_id(make_env) -> None:
    env = await make_env(handoff="mooncake", bootstrap_self=True,
                         prefill_behaviour=Behaviour(dp_size=2, engine_id="eng-p"))
    bport = int(env.prefill_urls[0].rsplit(":", 1)[1])
    body = {"model": "m", "prompt": rand_text(500), "max_tokens": 9, "stream": True}
    ranks = []
    for i in range(4):
        async with env.session.post(env.url + "/v1/completions", json=body,
                                    headers={"X-Request-Id": f"req-{i}"}) as r:
            assert r.status == 200
            await r.read()
        pre, dec = env.prefills[0].records[i], env.decodes[0].records[i]
        tid = f"xfer-req-{i}"
        assert pre.body["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False,
                                                  "transfer_id": tid}
        assert pre.body["max_tokens"] == 1 and pre.body["stream"] is False
        ranks.append(pre.dp_rank)
        assert dec.body["kv_transfer_params"] == {
            "do_remote_decode": False, "do_remote_prefill": True, "transfer_id": tid,
            "remote_bootstrap_addr": f"http://127.0.0.1:{bport}", "remote_engine_id": f"eng-p-dp{pre.dp_rank}",
            "bootstrap_server_host": "127.0.0.1", "bootstrap_server_port": bport}
        assert dec.body["max_tokens"] == 9 and dec.body["stream"] is True
        assert pre.request_id == dec.request_id == f"req-{i}"
    assert ranks == ["0", "1", "0", "1"]  # DP ranks of the prefill used in turn
    # concurrent: the decode request did not wait for the prefill's answer
    env.prefills[0].behaviour.prefill_delay = 0.5
    async with env.session.post(env.url + "/v1/completions", json=body) as r:
        assert r.status == 200
        await r.read()
    assert env.decodes[0].records[-1].t - env.prefills[0].records[-1].t < 0.4


async def test_mooncake_handoff_bootstrap_without_query(make_env) -> None:
    """Older connectors have no /query: no remote_engine_id, pairing by bootstrap address."""
    env = await make_env(handoff="mooncake", bootstrap_self=True, prefill_behaviour=Behaviour(query_status=404))
    async with env.session.post(env.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}) as r:
        assert r.status == 200
    [dec] = env.decodes[0].records
    assert "remote_engine_id" not in dec.body["kv_transfer_params"]
    assert env.prefills[0].records[0].dp_rank is None


async def test_mooncake_handoff_bootstrap_unreachable(make_env) -> None:
    import time

    from mooncake_core.utils.net import free_port

    dead = free_port()
    env = await make_env(handoff="mooncake", prefill_bootstrap_ports=[dead])
    t = time.monotonic()
    async with env.session.post(env.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}) as r:
        assert r.status == 502
        msg = (await r.json())["error"]["message"]
    assert time.monotonic() - t < 3
    assert f"127.0.0.1:{dead}/query" in msg and "bootstrap" in msg
    assert env.prefills[0].records == [] and env.decodes[0].records == []


async def test_sglang_handoff_generate(make_env) -> None:
    env = await make_env(handoff="sglang", prefill_bootstrap_ports=[8999])
    body = {"text": rand_text(300), "sampling_params": {"max_new_tokens": 4}, "stream": True}
    async with env.session.post(env.url + "/generate", json=body) as r:
        assert r.status == 200
        payloads = sse_payloads(await r.read())
    [pre] = env.prefills[0].records
    [dec] = env.decodes[0].records
    assert pre.path == dec.path == "/generate"
    room = pre.body["bootstrap_room"]
    assert isinstance(room, int) and 0 <= room < 2 ** 63
    for rec in (pre, dec):
        assert rec.body["bootstrap_host"] == "127.0.0.1"
        assert rec.body["bootstrap_port"] == 8999
        assert rec.body["bootstrap_room"] == room
        assert rec.body["text"] == body["text"] and rec.body["sampling_params"] == body["sampling_params"]
    assert payloads[-1] == "[DONE]"
    # a second request gets a different room
    async with env.session.post(env.url + "/v1/completions",
                                json={"prompt": "hi", "max_tokens": 2}) as r:
        assert r.status == 200
    assert env.prefills[0].records[1].body["bootstrap_room"] != room


async def test_streaming_is_not_buffered(make_env) -> None:
    """The first chunk reaches the client before the fake decode has even sent the last."""
    import time

    env = await make_env(decode_behaviour=Behaviour(chunks=5, chunk_delay=0.25))
    body = {"prompt": rand_text(100), "max_tokens": 5, "stream": True}
    got: list[tuple[float, bytes]] = []
    async with env.session.post(env.url + "/v1/completions", json=body) as r:
        assert r.status == 200
        async for chunk in r.content.iter_any():
            got.append((time.time(), chunk))
    raw = b"".join(c for _, c in got)
    payloads = [json.loads(p) for p in sse_payloads(raw)[:-1]]
    assert [p["seq"] for p in payloads] == [0, 1, 2, 3, 4]
    first_arrival = got[0][0]
    last_sent = payloads[-1]["t"]
    assert first_arrival < last_sent - 0.5, (first_arrival, last_sent)
    assert len(got) >= 3  # arrived in several pieces, not one buffered blob


async def test_random_payload_roundtrip_non_streaming(make_env) -> None:
    """Random unicode prompt and extra fields arrive byte-identical at the decode."""
    env = await make_env()
    prompt = "".join(chr(random.randint(32, 0x2FFF)) for _ in range(2000))
    extra = {"seed": random.randint(0, 2**31), "logit_bias": {str(random.randint(0, 999)): 1.5},
             "stop": [rand_text(5), rand_text(7)]}
    body = {"model": "m", "prompt": prompt, "max_tokens": 3, **extra}
    async with env.session.post(env.url + "/v1/completions", json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("application/json")
    [dec] = env.decodes[0].records
    for k, v in body.items():
        assert dec.body[k] == v


@pytest.mark.parametrize("handoff", ["vllm", "mooncake"])
async def test_load_bookkeeping_follows_the_request(make_env, handoff) -> None:
    """While the decode streams, the prefill's load is already released; afterwards all is zero."""
    env = await make_env(handoff=handoff, decode_behaviour=Behaviour(chunks=6, chunk_delay=0.1),
                         bootstrap_self=True)
    p_id, d_id = f"prefill@{env.prefill_urls[0]}", f"decode@{env.decode_urls[0]}"
    cluster = env.server.cluster
    async with env.session.post(env.url + "/v1/completions",
                                json={"prompt": rand_text(4000), "max_tokens": 6, "stream": True}) as r:
        assert r.status == 200
        await r.content.readany()
        await asyncio.sleep(0.15)
        assert env.server.registry.get(p_id).in_flight == 0
        assert env.server.registry.get(d_id).in_flight == 1
        assert cluster.prefill_load(p_id).queued_tokens == 0
        assert cluster.decode_load(d_id).running == 1
        await r.read()
    assert env.server.registry.get(d_id).in_flight == 0
    assert cluster.decode_load(d_id).running == 0


async def test_decode_recompute_is_counted_and_shown(make_env) -> None:
    """A prefill that answers without kv_transfer_params makes the decode recompute the prompt:
    the request succeeds, so the proxy counts it (metric, dashboard) -- the alert's only signal."""
    env = await make_env(prefill_behaviour=Behaviour(no_kv_params=True), n_decode=1)
    body = {"model": "m", "prompt": rand_text(200), "max_tokens": 4}
    await env.post_ok(body, 3)
    [dec, *_] = env.decodes[0].records
    assert "kv_transfer_params" not in dec.body  # nothing to load: the decode recomputes
    async with env.session.get(env.url + "/metrics") as r:
        text = await r.text()
    p_id, d_id = env.server.registry.all("prefill")[0].instance_id, env.server.registry.all("decode")[0].instance_id
    line = (f'mooncake_proxy_decode_recomputes_total{{decode="{d_id}",prefill="{p_id}",'
            f'reason="no_kv_transfer_params"}} 3.0')
    assert line in text, text
    for _ in range(30):  # the page samples the registry at most every 0.5 s
        async with env.session.get(env.url + "/dashboard/data.json") as r:
            data = await r.json()
        if data["summary"]["decode_recomputes"]:
            break
        await asyncio.sleep(0.1)
    assert data["summary"]["decode_recomputes"] == 3
    assert [i["recomputes"] for i in data["instances"] if i["role"] == "prefill"] == [3]
    # a normal hand-off is not counted
    env.prefills[0].behaviour.no_kv_params = False
    await env.post_ok(body, 2)
    async with env.session.get(env.url + "/metrics") as r:
        assert line in await r.text()
