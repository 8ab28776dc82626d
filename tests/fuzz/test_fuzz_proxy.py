"""Fuzz the PD proxy's HTTP surface (OpenAI routes, /generate, admin API) as real processes:
fake engines behind a real ``mooncake_proxy``. No input may get a 500 (an internal error), none
may hang, and a valid completion and an authorised admin call still work afterwards."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest

from fuzz.conftest import fuzz
from mooncake_lab.fuzz.surfaces import HttpFuzzer, json_body, proxy_health_503, proxy_routes
from mooncake_core.utils.proc import spawn_until, stop_process

pytestmark = pytest.mark.integration

KEY = "fuzz-admin-key"


@pytest.fixture
def proxy_url(python_exe):
    procs: list[subprocess.Popen] = []

    def spawn(args: list[str], what: str) -> int:
        proc, m = spawn_until([python_exe, "-u", *args], what + r" listening on http://[^:]+:(\d+)", 30,
                              env={**os.environ, "MC_LOG_LEVEL": "ERROR"}, what=what)
        procs.append(proc)
        return int(m.group(1))

    try:
        ports = [spawn(["-m", "mooncake_proxy.fake_engine", "--name", n, "--chunks", "2", "--no-record"],
                       "fake_engine") for n in ("P", "D")]
        port = spawn(["-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", "0",
                      "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", str(ports[0]),
                      "--decoder-hosts", "127.0.0.1", "--decoder-ports", str(ports[1]),
                      "--admin-key", KEY, "--policy", "conductor"], "mooncake_proxy")
        yield f"http://127.0.0.1:{port}", procs
    finally:
        for p in procs:
            stop_process(p, 5)


def _live(url: str, procs, n: int) -> None:
    assert all(p.poll() is None for p in procs), f"a process died after {n} fuzz inputs"
    with httpx.Client(timeout=10) as c:
        r = c.post(url + "/v1/completions", json={"model": "m", "prompt": "hi " * 30, "max_tokens": 2})
        assert r.status_code == 200, (n, r.status_code, r.text[:300])
        r = c.get(url + "/admin/instances", headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200 and len(r.json()["instances"]) == 2, r.text[:300]


def test_proxy_http_survives_fuzzing(proxy_url) -> None:
    url, procs = proxy_url
    port = int(url.rsplit(":", 1)[1])
    fz = HttpFuzzer("127.0.0.1", port, proxy_routes(), json_body, documented_5xx=proxy_health_503)
    fuzz(fz.one, lambda n: _live(url, procs, n))
    assert fz.statuses, "no HTTP answer was ever parsed"
    assert any(200 <= s < 300 for s in fz.statuses) and any(400 <= s < 500 for s in fz.statuses)


def test_health_503_is_the_documented_answer_only_when_it_says_why(python_exe) -> None:
    """The fuzz oracle's one allowed 5xx: a real proxy whose engines do not answer says 503 on
    /health with can_serve false and its reasons; the same status without that body is not."""
    import socket

    with socket.socket() as s1, socket.socket() as s2:  # two ports nobody listens on
        s1.bind(("127.0.0.1", 0))
        s2.bind(("127.0.0.1", 0))
        dead = [str(s1.getsockname()[1]), str(s2.getsockname()[1])]
    proc, m = spawn_until([python_exe, "-u", "-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", "0",
                           "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", dead[0],
                           "--decoder-hosts", "127.0.0.1", "--decoder-ports", dead[1]],
                          r"mooncake_proxy listening on http://[^:]+:(\d+)", 30,
                          env={**os.environ, "MC_LOG_LEVEL": "ERROR"}, what="mooncake_proxy")
    try:
        req = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        with socket.create_connection(("127.0.0.1", int(m.group(1))), timeout=10) as s:
            s.sendall(req)
            resp = b""
            while chunk := s.recv(65536):
                resp += chunk
        assert resp.startswith(b"HTTP/1.1 503"), resp[:200]
        assert proxy_health_503(req, resp)
        head = resp.split(b"\r\n\r\n", 1)[0]
        assert not proxy_health_503(req, head + b"\r\n\r\n{}")  # 503 without the why
        assert not proxy_health_503(b"POST /v1/completions HTTP/1.1\r\n\r\n", resp)  # another route
    finally:
        stop_process(proc, 5)
