"""Fixtures: fake vLLM/SGLang engines and the proxy, in the test's event loop, on real sockets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from mooncake_proxy.fake_engine import Behaviour, FakeEngine, start_fake
from mooncake_proxy.server import ProxyConfig, ProxyServer, start_server


@dataclass
class Env:
    server: ProxyServer
    url: str
    prefills: list[FakeEngine]
    decodes: list[FakeEngine]
    prefill_urls: list[str]
    decode_urls: list[str]
    session: aiohttp.ClientSession
    runners: list[Any] = field(default_factory=list)


@pytest.fixture
async def make_env():
    """``await make_env(n_prefill=1, n_decode=1, behaviour=..., **ProxyConfig fields)``."""
    envs: list[Env] = []

    async def _make(n_prefill: int = 1, n_decode: int = 1, prefill_behaviour: Behaviour | None = None,
                    decode_behaviour: Behaviour | None = None, **cfg: Any) -> Env:
        runners = []
        prefills, decodes, purls, durls = [], [], [], []
        for i in range(n_prefill):
            e = FakeEngine(f"prefill{i}", prefill_behaviour or Behaviour())
            r, port = await start_fake(e)
            runners.append(r)
            prefills.append(e)
            purls.append(f"http://127.0.0.1:{port}")
        for i in range(n_decode):
            e = FakeEngine(f"decode{i}", decode_behaviour or Behaviour())
            r, port = await start_fake(e)
            runners.append(r)
            decodes.append(e)
            durls.append(f"http://127.0.0.1:{port}")
        if cfg.pop("bootstrap_self", False):  # fake prefills also serve the bootstrap /query
            cfg["prefill_bootstrap_ports"] = [int(u.rsplit(":", 1)[1]) for u in purls]
        kv_for = cfg.pop("kv_events_for", None)
        if kv_for is not None:  # config that needs the fake engines' URLs
            cfg["kv_events_config"] = kv_for(purls)
        cfg.setdefault("health_interval", 0)
        cfg.setdefault("request_timeout", 10.0)
        conf = ProxyConfig(prefill_urls=cfg.pop("prefill_urls", purls),
                           decode_urls=cfg.pop("decode_urls", durls), **cfg)
        server, prunner, pport = await start_server(conf, "127.0.0.1", 0)
        runners.append(prunner)
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        env = Env(server, f"http://127.0.0.1:{pport}", prefills, decodes, purls, durls, session, runners)
        envs.append(env)
        return env

    yield _make
    for env in envs:
        await env.session.close()
        for r in reversed(env.runners):
            await r.cleanup()
