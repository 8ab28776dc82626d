"""Failure paths: upstream errors, timeouts, no healthy instance, overload, disconnects."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from mooncake_core.utils.net import free_port
from mooncake_proxy.fake_engine import Behaviour, start_fake

pytestmark = pytest.mark.integration

BODY = {"model": "m", "prompt": "tell me a story " * 40, "max_tokens": 8, "stream": True}


def assert_openai_error(data: dict, code: int) -> None:
    assert set(data["error"]) >= {"message", "type", "code"}
    assert data["error"]["code"] == code
    assert data["error"]["message"]


async def test_prefill_500_gives_502(make_env) -> None:
    env = await make_env(prefill_behaviour=Behaviour(fail_status=500))
    t = time.monotonic()
    async with env.session.post(env.url + "/v1/completions", json=BODY) as r:
        assert r.status == 502
        data = await r.json()
    assert time.monotonic() - t < 2
    assert_openai_error(data, 502)
    assert "prefill" in data["error"]["message"] and env.prefill_urls[0] in data["error"]["message"]
    assert env.decodes[0].records == []  # never reached decode


async def test_decode_500_gives_502(make_env) -> None:
    env = await make_env(decode_behaviour=Behaviour(fail_status=503))
    async with env.session.post(env.url + "/v1/completions", json=BODY) as r:
        assert r.status == 502
        data = await r.json()
    assert_openai_error(data, 502)
    assert "decode" in data["error"]["message"]


async def test_upstream_400_passes_through(make_env) -> None:
    env = await make_env(prefill_behaviour=Behaviour(fail_status=400))
    async with env.session.post(env.url + "/v1/completions", json=BODY) as r:
        assert r.status == 400
        data = await r.json()
    assert data["error"]["type"] == "internal_error"  # the engine's own body


async def test_prefill_timeout_gives_504_fast(make_env) -> None:
    env = await make_env(prefill_behaviour=Behaviour(hang=True), request_timeout=0.5)
    t = time.monotonic()
    async with env.session.post(env.url + "/v1/completions", json=BODY) as r:
        assert r.status == 504
        data = await r.json()
    assert time.monotonic() - t < 3
    assert_openai_error(data, 504)
    assert "request-timeout" in data["error"]["message"]
    await asyncio.sleep(0.1)
    assert env.prefills[0].records[0].cancelled  # the proxy hung up on the stuck prefill


async def test_decode_timeout_gives_504(make_env) -> None:
    env = await make_env(decode_behaviour=Behaviour(hang=True), request_timeout=0.5)
    t = time.monotonic()
    async with env.session.post(env.url + "/v1/completions", json=BODY) as r:
        assert r.status == 504
    assert time.monotonic() - t < 3


async def test_concurrent_prefill_failure_fails_fast(make_env) -> None:
    """Mooncake hand-off: the decode waits for KV that will never come; the proxy must not."""
    env = await make_env(handoff="mooncake", bootstrap_self=True, prefill_behaviour=Behaviour(fail_status=500),
                         decode_behaviour=Behaviour(hang=True))
    t = time.monotonic()
    async with env.session.post(env.url + "/v1/completions", json=BODY) as r:
        assert r.status == 502
    assert time.monotonic() - t < 2
    await asyncio.sleep(0.1)
    assert env.decodes[0].records[0].cancelled


async def test_no_instances_gives_503(make_env) -> None:
    env = await make_env(n_decode=0)
    async with env.session.post(env.url + "/v1/completions", json=BODY) as r:
        assert r.status == 503
        data = await r.json()
    assert_openai_error(data, 503)
    assert "decode" in data["error"]["message"]
    async with env.session.get(env.url + "/health") as r:
        assert r.status == 503


async def test_dead_instance_gives_503_naming_it(make_env) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    env = await make_env(n_prefill=0, prefill_urls=[dead])
    for _ in range(2):
        t = time.monotonic()
        async with env.session.post(env.url + "/v1/completions", json=BODY) as r:
            assert r.status == 503
            assert r.headers["Retry-After"] == "1"
            msg = (await r.json())["error"]["message"]
        assert time.monotonic() - t < 1.5  # the on-demand re-probe is bounded
        assert dead in msg and "down" in msg, msg
    async with env.session.get(env.url + "/health") as r:
        assert r.status == 503
        h = await r.json()
    assert h["can_serve"] is False and dead in h["reasons"][0]
    assert {i["state"] for i in h["instances"] if i["role"] == "prefill"} == {"down"}


async def test_connection_refused_mid_run_goes_elsewhere_then_back(make_env) -> None:
    """An engine that stops accepting connections costs no request: the refused one is retried on
    the other instance, and the stopped engine is back in rotation soon after it returns."""
    env = await make_env(n_prefill=2, policy="round_robin", health_interval=30)
    victim_url = env.prefill_urls[0]
    port = int(victim_url.rsplit(":", 1)[1])
    await env.runners[0].cleanup()  # prefill0 gone: its port refuses connections
    await env.post_ok(BODY, 4)
    assert len(env.prefills[1].records) == 4
    inst = env.server.registry.get(f"prefill@{victim_url}")
    assert inst is not None and inst.health.state.value == "down"
    # it comes back on the same port: the fast re-probe (not the 30 s interval) notices
    runner, _ = await start_fake(env.prefills[0], "127.0.0.1", port)
    env.runners.append(runner)
    for _ in range(100):
        if inst.healthy:
            break
        await asyncio.sleep(0.05)
    assert inst.healthy, inst.health.describe()


async def test_failed_health_check_removes_and_restores(make_env) -> None:
    env = await make_env(n_prefill=2, health_interval=0.1, health_timeout=0.5)
    sick = env.prefills[0]
    sick.behaviour.health_status = 500
    await asyncio.sleep(0.5)
    inst = env.server.registry.get(f"prefill@{env.prefill_urls[0]}")
    assert inst is not None and not inst.healthy and "500" in inst.last_error
    for _ in range(6):
        async with env.session.post(env.url + "/v1/completions", json=BODY) as r:
            assert r.status == 200
            await r.read()
    assert sick.records == [] and len(env.prefills[1].records) == 6
    async with env.session.get(env.url + "/metrics") as r:
        text = await r.text()
    assert f'mooncake_proxy_instance_healthy{{instance="prefill@{env.prefill_urls[0]}",role="prefill"}} 0.0' in text
    sick.behaviour.health_status = 200
    await asyncio.sleep(0.5)
    assert inst.healthy


async def test_busy_decode_answering_health_late_stays_in_rotation(make_env) -> None:
    """The only decode answers /health after the probe timeout (busy, as a loaded engine is):
    two late answers keep it serving; the third in a row takes it out; an answer restores it."""
    env = await make_env(health_interval=0.1, health_timeout=0.2, health_timeouts_to_down=3)
    busy = env.decodes[0]
    inst = env.server.registry.get(f"decode@{env.decode_urls[0]}")
    assert inst is not None and inst.healthy
    busy.behaviour.health_delay = 0.3
    for _ in range(200):  # wait for the first late answer
        if inst.health.late >= 1:
            break
        await asyncio.sleep(0.01)
    assert inst.health.late >= 1 and inst.healthy, inst.health.describe()
    await env.post_ok(BODY, 1)  # still served while answering late
    for _ in range(300):
        if not inst.healthy:
            break
        await asyncio.sleep(0.01)
    assert not inst.healthy and "timed out" in inst.last_error, inst.health.describe()
    busy.behaviour.health_delay = 0.0
    for _ in range(300):
        if inst.healthy:
            break
        await asyncio.sleep(0.01)
    assert inst.healthy, inst.health.describe()
    await env.post_ok(BODY, 1)


async def test_overload_429_with_retry_after(make_env) -> None:
    env = await make_env(policy="conductor", ttft_slo=1e-6, retry_after=3.0)
    t = time.monotonic()
    async with env.session.post(env.url + "/v1/completions", json=BODY) as r:
        assert r.status == 429
        assert int(r.headers["Retry-After"]) >= 1
        data = await r.json()
    assert time.monotonic() - t < 1
    assert_openai_error(data, 429)
    assert env.prefills[0].records == [] and env.decodes[0].records == []
    async with env.session.get(env.url + "/metrics") as r:
        text = await r.text()
    assert 'mooncake_proxy_rejections_total{reason="slo"} 1.0' in text


async def test_client_disconnect_cancels_decode(make_env) -> None:
    env = await make_env(decode_behaviour=Behaviour(chunks=50, chunk_delay=0.1))
    async with aiohttp.ClientSession() as s:
        r = await s.post(env.url + "/v1/completions", json=BODY)
        assert r.status == 200
        await r.content.readany()  # first chunk arrived: decode is streaming
        r.close()  # client goes away mid-stream
    for _ in range(40):
        await asyncio.sleep(0.05)
        if env.decodes[0].records[0].cancelled:
            break
    rec = env.decodes[0].records[0]
    assert rec.cancelled and not rec.finished
    # bookkeeping released: nothing left in flight
    assert all(i.in_flight == 0 for i in env.server.registry.all())


async def test_client_disconnect_cancels_prefill(make_env) -> None:
    env = await make_env(prefill_behaviour=Behaviour(hang=True))
    async with aiohttp.ClientSession() as s:
        with pytest.raises(asyncio.TimeoutError):
            await s.post(env.url + "/v1/completions", json=BODY, timeout=aiohttp.ClientTimeout(total=0.3))
    for _ in range(40):
        await asyncio.sleep(0.05)
        if env.prefills[0].records and env.prefills[0].records[0].cancelled:
            break
    assert env.prefills[0].records[0].cancelled
    assert env.decodes[0].records == []
    assert all(i.in_flight == 0 for i in env.server.registry.all())


async def test_bad_json_gives_400(make_env) -> None:
    env = await make_env()
    async with env.session.post(env.url + "/v1/completions", data=b"{not json",
                                headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400
        assert_openai_error(await r.json(), 400)
    async with env.session.post(env.url + "/v1/chat/completions", json={"model": "m"}) as r:
        assert r.status == 400
        assert "messages" in (await r.json())["error"]["message"]


async def test_unreachable_instance_retried_elsewhere(make_env) -> None:
    """A prefill that refuses connections costs the client nothing: the request goes to another."""
    dead = f"http://127.0.0.1:{free_port()}"
    env = await make_env(n_prefill=1, policy="round_robin")
    env.server.add_instance("prefill", dead)
    await env.post_ok(BODY, 4)
    assert len(env.prefills[0].records) == 4
    inst = env.server.registry.get(f"prefill@{dead}")
    assert inst is not None and not inst.healthy and "connect" in inst.last_error


async def test_client_disconnect_cancels_both_in_concurrent_handoff(make_env) -> None:
    env = await make_env(handoff="mooncake", bootstrap_self=True, prefill_behaviour=Behaviour(hang=True),
                         decode_behaviour=Behaviour(hang=True))
    async with aiohttp.ClientSession() as s:
        with pytest.raises(asyncio.TimeoutError):
            await s.post(env.url + "/v1/completions", json=BODY, timeout=aiohttp.ClientTimeout(total=0.4))
    recs = []
    for _ in range(40):
        await asyncio.sleep(0.05)
        recs = env.prefills[0].records + env.decodes[0].records
        if len(recs) == 2 and all(r.cancelled for r in recs):
            break
    assert len(recs) == 2 and all(r.cancelled for r in recs)
    assert all(i.in_flight == 0 for i in env.server.registry.all())
    assert env.server.cluster.prefill_load(f"prefill@{env.prefill_urls[0]}").queued_tokens == 0
