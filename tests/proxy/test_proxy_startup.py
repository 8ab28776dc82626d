"""Proxy availability with real processes: engines that boot after the proxy, engines that die.

This is the deployment the README shows (engines and proxy started together): the proxy must
serve the first request as soon as the engines answer, not one --health-interval later.
"""

from __future__ import annotations

import signal
import subprocess
import time

import httpx
import pytest

from mooncake_core.utils.net import free_port

pytestmark = pytest.mark.integration

BODY = {"model": "m", "prompt": "hello there " * 50, "max_tokens": 3}


def _engine(spawn, name: str, port: int = 0) -> tuple[subprocess.Popen, int]:
    return spawn(["-m", "mooncake_proxy.fake_engine", "--name", name, "--chunks", "2", "--port", str(port)],
                 "fake_engine")


def _proxy(spawn, prefill: list[int], decode: list[int], *extra: str) -> str:
    _, port = spawn(["-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", "0",
                     "--prefiller-hosts", *["127.0.0.1"] * len(prefill), "--prefiller-ports", *map(str, prefill),
                     "--decoder-hosts", *["127.0.0.1"] * len(decode), "--decoder-ports", *map(str, decode),
                     *extra], "mooncake_proxy")
    return f"http://127.0.0.1:{port}"


def _wait_health(url: str, timeout: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"{url}/health not 200 within {timeout}s")


def test_engines_that_boot_after_the_proxy_serve_the_first_request(spawn) -> None:
    pport, dport = free_port(), free_port()
    url = _proxy(spawn, [pport], [dport])  # default --health-interval 5
    with httpx.Client(timeout=10) as c:
        r = c.get(url + "/health")
        assert r.status_code == 503 and r.json()["can_serve"] is False
        assert "no healthy prefill instance" in r.json()["reasons"][0]
        r = c.post(url + "/v1/completions", json=BODY)
        assert r.status_code == 503 and f"127.0.0.1:{pport}" in r.json()["error"]["message"]
    time.sleep(1.5)  # the engines "boot" well after the proxy has probed them and failed
    for name, port in (("P", pport), ("D", dport)):
        _engine(spawn, name, port)
    for port in (pport, dport):
        _wait_health(f"http://127.0.0.1:{port}", 10)
    # what the user does next: the very first completion succeeds (no 5 s wait)
    t = time.monotonic()
    with httpx.Client(timeout=10) as c:
        r = c.post(url + "/v1/completions", json=BODY)
        assert r.status_code == 200, r.text
        assert time.monotonic() - t < 2.0
        h = c.get(url + "/health").json()
    assert h["can_serve"] and {i["state"] for i in h["instances"]} == {"up"}


def test_dead_engine_requests_move_to_the_other_within_one_request(spawn) -> None:
    engines = {name: _engine(spawn, name) for name in ("P0", "P1", "D0", "D1")}
    url = _proxy(spawn, [engines["P0"][1], engines["P1"][1]], [engines["D0"][1], engines["D1"][1]],
                 "--policy", "round_robin", "--health-interval", "30")
    _wait_health(url, 10)
    with httpx.Client(timeout=10) as c:
        for _ in range(4):
            assert c.post(url + "/v1/completions", json=BODY).status_code == 200
        for victim in ("P0", "D1"):
            engines[victim][0].send_signal(signal.SIGKILL)
            engines[victim][0].wait(5)
            # every request from the first one after the kill is served by the survivors
            for _ in range(4):
                r = c.post(url + "/v1/completions", json=BODY)
                assert r.status_code == 200, (victim, r.text)
        h = c.get(url + "/health").json()
    state = {i["id"]: i["state"] for i in h["instances"]}
    assert state[f"prefill@http://127.0.0.1:{engines['P0'][1]}"] == "down"
    assert state[f"decode@http://127.0.0.1:{engines['D1'][1]}"] == "down"
    assert h["can_serve"] is True


def _idle_conns_to(port: int) -> int:
    """Established TCP connections on this host whose remote end is ``port`` (the proxy's
    connections to that engine; the engine's own sockets have it as their local end)."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "01" and int(f[2].rsplit(":", 1)[1], 16) == port:
                n += 1
    return n


@pytest.mark.parametrize("keepalive,kept", [(0.5, False), (30.0, True)])
def test_idle_upstream_connections_are_closed_after_upstream_keepalive(spawn, keepalive, kept) -> None:
    """aiohttp keeps idle connections 15 s by default, uvicorn (vLLM, SGLang) closes them after
    5 s: a request written into one the engine is closing fails (a 502 'connection reset', seen
    in bench_live_scheduling). --upstream-keepalive (default 4 s) closes them first."""
    _, p = _engine(spawn, "P")
    _, d = _engine(spawn, "D")
    url = _proxy(spawn, [p], [d], "--upstream-keepalive", str(keepalive), "--health-interval", "0")
    _wait_health(url, 20)
    r = httpx.post(url + "/v1/completions", json=BODY, timeout=30)
    assert r.status_code == 200, r.text
    assert _idle_conns_to(d) >= 1, "the decode connection was not kept for reuse at all"
    time.sleep(keepalive + 1.5 if not kept else 2.0)
    left = _idle_conns_to(d)
    assert (left >= 1) if kept else (left == 0), f"{left} idle connection(s) to the decode after the wait"
    r = httpx.post(url + "/v1/completions", json=BODY, timeout=30)  # and the next request still works
    assert r.status_code == 200, r.text


def test_a_taken_port_is_one_clear_line(python_exe) -> None:
    """A user mistake (the port is in use): one line naming it and the fix, exit 1, and no
    asyncio noise about the HTTP session the health checks had opened."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([python_exe, "-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", str(port),
                            "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2"],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "choose another --port" in r.stderr, r.stderr
    assert "Unclosed" not in r.stderr and "Traceback" not in r.stderr, r.stderr
