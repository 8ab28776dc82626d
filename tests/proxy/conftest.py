"""Fixtures: fake vLLM/SGLang engines and the proxy, in the test's event loop, on real sockets."""

from __future__ import annotations

import asyncio
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from mooncake_core.utils.proc import spawn_until, stop_process
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

    async def post_ok(self, body: dict, n: int) -> None:
        """Send ``n`` completions through the proxy; each must answer 200."""
        for _ in range(n):
            async with self.session.post(self.url + "/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()
                await r.read()


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
        groups_for = cfg.pop("hardware_groups_for", None)  # (prefill URLs, decode URLs) -> groups of URLs
        if groups_for is not None:  # --hardware-group needs the fake engines' URLs
            cfg["hardware_groups"] = groups_for(purls, durls)
        cfg.setdefault("health_interval", 0)
        cfg.setdefault("request_timeout", 10.0)
        conf = ProxyConfig(prefill_urls=cfg.pop("prefill_urls", purls),
                           decode_urls=cfg.pop("decode_urls", durls), **cfg)
        server, prunner, pport = await start_server(conf, "127.0.0.1", 0)
        runners.append(prunner)
        # As a user would: wait until the proxy has heard from every instance once (a request
        # sent before that also works -- it waits up to 1 s for the probes -- but tests that
        # count probes or read /healthcheck want the settled state).
        for _ in range(200):
            if all(i.health.state.value != "unknown" for i in server.registry.all()):
                break
            await asyncio.sleep(0.01)
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        env = Env(server, f"http://127.0.0.1:{pport}", prefills, decodes, purls, durls, session, runners)
        envs.append(env)
        return env

    yield _make
    for env in envs:
        await env.session.close()
        for r in reversed(env.runners):
            await r.cleanup()


@pytest.fixture
def spawn(python_exe: str) -> Any:
    """``spawn(args, what) -> (proc, port)``: start ``python -u ARGS`` and read its output until
    '<what> listening on http://h:PORT'; every process is stopped after the test."""
    started: list[subprocess.Popen] = []

    def _spawn(args: list[str], what: str, timeout: float = 20) -> tuple[subprocess.Popen, int]:
        proc, m = spawn_until([python_exe, "-u", *args], what + r" listening on http://[^:]+:(\d+)", timeout,
                              env={**os.environ, "MC_LOG_LEVEL": "WARNING"}, what=what)
        started.append(proc)
        return proc, int(m.group(1))

    yield _spawn
    for p in started:
        stop_process(p, 5)
