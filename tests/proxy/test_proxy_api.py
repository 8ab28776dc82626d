"""Admin API, /metrics, /v1/models, request ids, scheduling across instances."""

from __future__ import annotations

import re

import pytest

from mooncake_proxy.fake_engine import FakeEngine, start_fake

pytestmark = pytest.mark.integration

BODY = {"model": "m", "prompt": "hello " * 300, "max_tokens": 4}


async def test_request_id_generated_and_shared(make_env) -> None:
    env = await make_env()
    ids = set()
    for _ in range(3):
        async with env.session.post(env.url + "/v1/completions", json=BODY) as r:
            assert r.status == 200
            ids.add(r.headers["X-Request-Id"])
    assert len(ids) == 3
    assert [r.request_id for r in env.prefills[0].records] == [r.request_id for r in env.decodes[0].records]
    assert {r.request_id for r in env.decodes[0].records} == ids


async def test_admin_add_remove_instances(make_env) -> None:
    env = await make_env(admin_key="s3cret")
    async with env.session.get(env.url + "/admin/instances") as r:
        assert r.status == 401
    auth = {"Authorization": "Bearer s3cret"}
    extra = FakeEngine("prefill-extra")
    runner, port = await start_fake(extra)
    env.runners.append(runner)
    new_url = f"http://127.0.0.1:{port}"
    async with env.session.post(env.url + "/admin/instances", headers=auth,
                                json={"role": "prefill", "url": new_url}) as r:
        assert r.status == 201, await r.text()
        assert (await r.json())["id"] == f"prefill@{new_url}"
    async with env.session.post(env.url + "/admin/instances", headers=auth,
                                json={"role": "prefill", "url": new_url}) as r:
        assert r.status == 400 and "already registered" in await r.text()
    async with env.session.post(env.url + "/admin/instances", headers=auth,
                                json={"role": "chef", "url": new_url}) as r:
        assert r.status == 400 and "role" in await r.text()
    async with env.session.get(env.url + "/admin/instances", headers={"X-Admin-Key": "s3cret"}) as r:
        listed = {(i["role"], i["url"]) for i in (await r.json())["instances"]}
    assert ("prefill", new_url) in listed and ("prefill", env.prefill_urls[0]) in listed
    # remove the original prefill: every request now goes to the new one
    async with env.session.delete(env.url + "/admin/instances", headers=auth,
                                  params={"role": "prefill", "url": env.prefill_urls[0]}) as r:
        assert r.status == 200
    for _ in range(4):
        async with env.session.post(env.url + "/v1/completions", json=BODY) as r:
            assert r.status == 200
    assert env.prefills[0].records == [] and len(extra.records) == 4
    async with env.session.delete(env.url + "/admin/instances", headers=auth,
                                  params={"id": f"prefill@{env.prefill_urls[0]}"}) as r:
        assert r.status == 404
    async with env.session.delete(env.url + "/admin/instances", headers=auth,
                                  params={"id": f"prefill@{new_url}"}) as r:
        assert r.status == 200
    async with env.session.post(env.url + "/v1/completions", json=BODY) as r:
        assert r.status == 503


async def test_round_robin_spreads_load(make_env) -> None:
    env = await make_env(n_prefill=2, n_decode=2, policy="round_robin")
    for _ in range(8):
        async with env.session.post(env.url + "/v1/completions", json=BODY) as r:
            assert r.status == 200
    assert [len(e.records) for e in env.prefills] == [4, 4]
    assert [len(e.records) for e in env.decodes] == [4, 4]


async def test_cache_aware_keeps_prefix_on_one_instance(make_env) -> None:
    env = await make_env(n_prefill=3, policy="cache_aware", block_size=16)
    shared = "The same long system prompt. " * 100
    for i in range(6):
        body = {"prompt": shared + f" question {i}", "max_tokens": 2}
        async with env.session.post(env.url + "/v1/completions", json=body) as r:
            assert r.status == 200
    counts = sorted(len(e.records) for e in env.prefills)
    assert counts[-1] >= 5, counts  # the prefix holder got (nearly) all of them


async def test_metrics_content(make_env) -> None:
    env = await make_env()
    for _ in range(2):
        async with env.session.post(env.url + "/v1/completions", json={**BODY, "stream": True}) as r:
            await r.read()
    async with env.session.post(env.url + "/v1/completions", data=b"[") as r:
        assert r.status == 400
    async with env.session.get(env.url + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    assert 'mooncake_proxy_requests_total{route="/v1/completions",status="200"} 2.0' in text
    assert 'mooncake_proxy_requests_total{route="/v1/completions",status="400"} 1.0' in text
    assert re.search(r'mooncake_proxy_ttft_seconds_count\{route="/v1/completions"\} 2\.0', text)
    assert re.search(r'mooncake_proxy_e2e_seconds_count\{route="/v1/completions"\} 3\.0', text)
    assert f'mooncake_proxy_instance_in_flight{{instance="decode@{env.decode_urls[0]}",role="decode"}} 0.0' in text
    assert f'mooncake_proxy_prefill_queued_tokens{{instance="prefill@{env.prefill_urls[0]}"}} 0.0' in text
    assert f'mooncake_proxy_decode_running{{instance="decode@{env.decode_urls[0]}"}} 0.0' in text
    assert re.search(r'mooncake_proxy_scheduler_decisions_total\{decode="decode@[^"]+",policy="load_balance",'
                     r'prefill="prefill@[^"]+"\} 2\.0', text)


async def test_models_and_healthcheck(make_env) -> None:
    env = await make_env(n_prefill=2)
    env.prefills[1].behaviour.model = "other-model"
    async with env.session.get(env.url + "/v1/models") as r:
        ids = sorted(m["id"] for m in (await r.json())["data"])
    assert ids == ["fake-model", "other-model"]
    async with env.session.get(env.url + "/healthcheck") as r:
        data = await r.json()
    assert data == {"status": "ok", "prefill_instances": 2, "decode_instances": 1}
    async with env.session.get(env.url + "/health") as r:
        assert r.status == 200
