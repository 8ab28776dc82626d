"""The proxy's /dashboard in a real headless Chromium: a real proxy process in front of two
fake engine processes. Both instances show, and the request count grows with requests."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from tests.dashboard.test_master_page import console_errors, text, wait_for
from tests.proxy.conftest import spawn  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


def test_proxy_page_shows_instances_and_growing_requests(browser: Any, spawn: Any) -> None:  # noqa: F811
    _pre, pport = spawn(["-m", "mooncake_proxy.fake_engine", "--name", "P", "--chunks", "4",
                         "--chunk-delay", "0.01"], "fake_engine")
    _dec, dport = spawn(["-m", "mooncake_proxy.fake_engine", "--name", "D", "--chunks", "4",
                         "--chunk-delay", "0.01"], "fake_engine")
    _proxy, port = spawn(["-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", "0",
                          "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", str(pport),
                          "--decoder-hosts", "127.0.0.1", "--decoder-ports", str(dport),
                          "--policy", "cache_aware", "--health-interval", "1"], "mooncake_proxy")
    url = f"http://127.0.0.1:{port}"
    browser.get(url + "/dashboard")
    wait_for("both instances up", lambda: text(browser, "#instances").count(" up") == 2)
    rows = text(browser, "#instances")
    assert "prefill" in rows and "decode" in rows, rows
    assert text(browser, "[data-metric=policy]") == "cache_aware / vllm"
    assert text(browser, "[data-metric=requests]") == "0"
    body = {"model": "m", "prompt": "the same long prefix " * 200, "max_tokens": 4, "stream": True}
    with httpx.Client(timeout=10) as c:
        for _ in range(3):
            assert c.post(url + "/v1/completions", json=body).status_code == 200
        wait_for("3 requests counted", lambda: text(browser, "[data-metric=requests]") == "3")
        for _ in range(4):
            assert c.post(url + "/v1/completions", json=body).status_code == 200
    wait_for("7 requests counted", lambda: text(browser, "[data-metric=requests]") == "7")
    assert text(browser, "[data-metric=ttft]").count("ms") == 3  # p50 / p90 / p99 filled in
    assert text(browser, "[data-metric=tbt]").count("ms") == 3
    # the same prompt again and again: the cache-aware scheduler expects it cached at the prefill
    wait_for("prefix hit ratio", lambda: "%" in text(browser, "#instances"))
    errs = console_errors(browser)
    assert not errs, f"console errors on the proxy page: {errs}"
    d = httpx.get(url + "/dashboard/data.json", timeout=5).json()
    assert d["summary"]["requests_total"] == 7 and {i["role"] for i in d["instances"]} == {"prefill", "decode"}


@pytest.mark.parametrize("module", ["mooncake_core.store.master_main", "mooncake_proxy.cli"])
def test_help_mentions_the_dashboard(module: str) -> None:
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "/dashboard" in out.stdout


def test_page_is_self_contained() -> None:
    from mooncake_core.dashboard.page import page_html

    for svc in ("master", "proxy"):
        html = page_html(svc).decode()
        assert "/*SCRIPT*/" not in html and "/*STYLE*/" not in html and "http" not in html.split("<script>")[0]
        assert f'data-service="{svc}"' in html
    with pytest.raises(ValueError, match="unknown service"):
        page_html("nope")


def test_proxy_first_poll_already_has_rates(spawn: Any) -> None:  # noqa: F811
    """Sampled once a second from start-up: the first poll of data.json has requests/s."""
    _pre, pport = spawn(["-m", "mooncake_proxy.fake_engine", "--name", "P"], "fake_engine")
    _dec, dport = spawn(["-m", "mooncake_proxy.fake_engine", "--name", "D"], "fake_engine")
    _proxy, port = spawn(["-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", "0",
                          "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", str(pport),
                          "--decoder-hosts", "127.0.0.1", "--decoder-ports", str(dport)], "mooncake_proxy")
    time.sleep(1.5)
    d = httpx.get(f"http://127.0.0.1:{port}/dashboard/data.json", timeout=5).json()
    assert d["summary"]["req_rate"] == 0.0, d["summary"]
