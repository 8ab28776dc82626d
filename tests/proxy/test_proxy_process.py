"""The proxy as a real process (console-script entry point) in front of fake engines in
their own processes: the path users run."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import time

import httpx
import pytest

pytestmark = pytest.mark.integration


def test_proxy_process_main_path(spawn) -> None:
    pre, pport = spawn(["-m", "mooncake_proxy.fake_engine", "--name", "P", "--chunks", "3"], "fake_engine")
    dec, dport = spawn(["-m", "mooncake_proxy.fake_engine", "--name", "D", "--chunks", "7"], "fake_engine")
    proxy, port = spawn(["-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", "0",
                         "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", str(pport),
                         "--decoder-hosts", "127.0.0.1", "--decoder-ports", str(dport),
                         "--policy", "conductor", "--health-interval", "1"], "mooncake_proxy")
    url = f"http://127.0.0.1:{port}"
    prompt = "".join(random.choices("abcdefghij ", k=5000))
    with httpx.Client(timeout=10) as c:
        r = c.post(url + "/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 7,
                                                  "stream": True}, headers={"X-Request-Id": "proc-1"})
        assert r.status_code == 200
        assert r.headers["x-request-id"] == "proc-1"
        events = [e[6:] for e in r.text.split("\n\n") if e.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert [json.loads(e)["seq"] for e in events[:-1]] == list(range(7))
        assert {json.loads(e)["served_by"] for e in events[:-1]} == {"D"}
        pre_recs = c.get(f"http://127.0.0.1:{pport}/_records").json()
        dec_recs = c.get(f"http://127.0.0.1:{dport}/_records").json()
        assert len(pre_recs) == 1 and len(dec_recs) == 1
        assert pre_recs[0]["request_id"] == dec_recs[0]["request_id"] == "proc-1"
        assert pre_recs[0]["body"]["max_tokens"] == 1 and pre_recs[0]["body"]["prompt"] == prompt
        assert dec_recs[0]["body"]["kv_transfer_params"]["remote_engine_id"] == "fake-engine"
        m = c.get(url + "/metrics").text
        assert 'mooncake_proxy_requests_total{route="/v1/completions",status="200"} 1.0' in m
        assert c.get(url + "/healthcheck").json()["decode_instances"] == 1
    # a stopped decode instance is noticed by the health checker -> 503, not a hang
    dec.send_signal(signal.SIGTERM)
    dec.wait(5)
    time.sleep(2.5)
    with httpx.Client(timeout=10) as c:
        r = c.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2})
        assert r.status_code == 503
        assert r.json()["error"]["code"] == 503


def test_proxy_help_explains_every_flag(python_exe) -> None:
    out = subprocess.run([python_exe, "-m", "mooncake_proxy.cli", "--help"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0
    flags = set(re.findall(r"(--[a-z][a-z0-9-]+)", out.stdout))
    for f in ("--host", "--port", "--prefiller-hosts", "--prefiller-ports", "--decoder-hosts",
              "--decoder-ports", "--prefill", "--decode", "--prefill-bootstrap-ports", "--policy",
              "--ttft-slo", "--tbt-slo", "--handoff", "--health-interval", "--request-timeout",
              "--profile", "--kv-events-config", "--tokenizer", "--admin-key"):
        assert f in flags, f
    # every option line carries a help text (argparse prints it after the flag)
    from mooncake_proxy.cli import build_parser

    for action in build_parser()._actions:
        assert action.help, action.option_strings


def test_proxy_port_in_use_clear_error(python_exe) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        out = subprocess.run([python_exe, "-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port",
                              str(port)], capture_output=True, text=True, timeout=30)
    finally:
        s.close()
    assert out.returncode != 0
    assert f"127.0.0.1:{port}" in out.stderr and "--port" in out.stderr
