"""Scale-in without failed requests: ``POST /admin/instances/<id>/drain`` takes an instance out of
scheduling, requests on it finish (a drained prefill also outlives its decodes' reads), the drain
status says when it is safe to stop; the instance is then stopped and deleted -- under load, and
no request fails."""

from __future__ import annotations

import asyncio
import time
import urllib.parse

import pytest

from mooncake_proxy.fake_engine import Behaviour

pytestmark = pytest.mark.integration


async def test_scale_in_under_load_fails_no_request(make_env) -> None:
    env = await make_env(n_prefill=2, n_decode=2, policy="round_robin", admin_key="k",
                         prefill_behaviour=Behaviour(prefill_delay=0.05),
                         decode_behaviour=Behaviour(chunks=6, chunk_delay=0.05))
    auth = {"X-Admin-Key": "k"}
    results: list[tuple[int, bool]] = []
    stop = asyncio.Event()

    async def client() -> None:
        body = {"model": "m", "prompt": "hello " * 20, "max_tokens": 6, "stream": True}
        while not stop.is_set():
            async with env.session.post(env.url + "/v1/completions", json=body) as r:
                raw = await r.read()
                results.append((r.status, raw.rstrip().endswith(b"data: [DONE]")))

    clients = [asyncio.create_task(client()) for _ in range(6)]
    await asyncio.sleep(0.6)
    p1, d1 = (f"prefill@{env.prefill_urls[1]}", f"decode@{env.decode_urls[1]}")
    for iid in (p1, d1):  # percent-encoded id, as a client library would send it
        async with env.session.post(f"{env.url}/admin/instances/{urllib.parse.quote(iid, safe='')}/drain",
                                    headers=auth) as r:
            assert r.status == 202, await r.text()
            st = await r.json()
            assert st["draining"] and st["id"] == iid
    t_drain = time.monotonic()
    for iid in (p1, d1):
        async with env.session.get(f"{env.url}/admin/instances/{iid}/drain?wait=10", headers=auth) as r:
            st = await r.json()
        assert st["safe_to_stop"] and st["active"] == 0, st
    waited = time.monotonic() - t_drain
    assert waited < 5, f"drain took {waited:.1f} s for sub-second requests"
    seen = (len(env.prefills[1].records), len(env.decodes[1].records))
    # stop the drained engines (the pods going away), then forget them
    await env.runners[1].cleanup()
    await env.runners[3].cleanup()
    for iid in (p1, d1):
        async with env.session.delete(env.url + "/admin/instances", params={"id": iid}, headers=auth) as r:
            assert r.status == 200, await r.text()
    await asyncio.sleep(0.6)
    stop.set()
    await asyncio.gather(*clients)
    assert len(results) > 20, len(results)
    bad = [r for r in results if r != (200, True)]
    assert not bad, f"{len(bad)} of {len(results)} requests failed during the scale-in: {bad[:5]}"
    assert (len(env.prefills[1].records), len(env.decodes[1].records)) == seen
    # the remaining pair served everything after the drain
    assert env.prefills[0].records[-1].t > t_drain and env.decodes[0].records[-1].t > t_drain


async def test_drain_errors_and_status(make_env) -> None:
    env = await make_env(admin_key="k")
    auth = {"X-Admin-Key": "k"}
    async with env.session.post(env.url + "/admin/instances/decode@http://nowhere:1/drain", headers=auth) as r:
        assert r.status == 404 and "known:" in (await r.json())["error"]["message"]
    async with env.session.post(env.url + "/admin/instances/x/drain") as r:
        assert r.status == 401
    iid = f"decode@{env.decode_urls[0]}"
    async with env.session.get(f"{env.url}/admin/instances/{iid}/drain?wait=abc", headers=auth) as r:
        assert r.status == 400 and "wait" in (await r.json())["error"]["message"]
    async with env.session.get(f"{env.url}/admin/instances/{iid}/drain", headers=auth) as r:
        assert (await r.json()) == {"id": iid, "draining": False, "active": 0, "in_flight": 0,
                                    "safe_to_stop": False, "draining_for_s": 0.0}
    async with env.session.post(f"{env.url}/admin/instances/{iid}/drain", headers=auth) as r:
        assert (await r.json())["safe_to_stop"]  # idle: safe at once
    # the only decode drained: new requests get 503 naming why; /health says so too
    async with env.session.post(env.url + "/v1/completions", json={"model": "m", "prompt": "x"}) as r:
        assert r.status == 503
    async with env.session.get(env.url + "/health") as r:
        assert r.status == 503
    # a probe that finds it healthy does not bring it back
    await env.server._probe_now(env.server.registry.get(iid))
    async with env.session.post(env.url + "/v1/completions", json={"model": "m", "prompt": "x"}) as r:
        assert r.status == 503
