"""The master's /dashboard in a real headless Chromium, against a real master and client.

The page must load without console errors, show the client's segment once it mounted, and
show a figure change after puts (keys and used bytes come from the live data endpoint).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from typing import Any, Callable

import pytest

from mooncake_core.utils.net import free_port
from mooncake_lab.store_procs import Master, Worker

pytestmark = pytest.mark.integration


def wait_for(what: str, cond: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def console_errors(browser: Any) -> list[dict]:
    return [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]


def text(browser: Any, css: str) -> str:
    """The rendered text of the first element matching ``css`` ("" if none), read in one script
    call: the page re-renders every second, so a found element may be replaced before a second
    WebDriver call could read it."""
    return browser.execute_script("const e = document.querySelector(arguments[0]);"
                                  "return e ? e.innerText : '';", css)


@pytest.fixture
def te_port() -> int:
    """The writing client's Transfer Engine serves its metrics here (MC_METRICS_PORT)."""
    return free_port()


@pytest.fixture
def master(tmp_path, te_port: int) -> Any:
    m = Master(sys.executable, str(tmp_path), dashboard_te_metrics=f"127.0.0.1:{te_port}").start()
    yield m
    m.stop()


def test_master_page_shows_segment_and_moving_figures(browser: Any, master: Master, te_port: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    base = f"http://127.0.0.1:{master.metrics_port}"
    with urllib.request.urlopen(base + "/dashboard", timeout=5) as r:
        assert r.status == 200 and "default-src 'none'" in r.headers["Content-Security-Policy"]
        assert b"<script src" not in r.read()  # self-contained: nothing fetched from elsewhere
    browser.get(base + "/dashboard")
    wait_for("first render", lambda: text(browser, "[data-metric=keys]"))
    assert "no segment mounted" in text(browser, "#segments")
    worker = Worker(sys.executable, master, 16 << 20)
    writer: Worker | None = None
    try:
        seg = worker.hostname
        row = wait_for("the client's segment row", lambda: text(browser, f'#segments tr[data-key="{seg}"]'))
        assert "16.0 MiB" in row, row
        keys_before = text(browser, "[data-metric=keys]")
        assert keys_before == "0"
        # a second client, without a segment, writes into the first one's: its Transfer
        # Engine exports the bytes per transport on MC_METRICS_PORT, which the master scrapes
        monkeypatch.setenv("MC_METRICS_PORT", str(te_port))
        writer = Worker(sys.executable, master, 0)
        for i in range(5):
            assert writer.cmd(op="put", key=f"dash-{i}", seed=i, size=256 << 10)["rc"] == 0
        wait_for("keys to reach 5", lambda: text(browser, "[data-metric=keys]") == "5")
        # 5 x 256 KiB, plus (single puts in one round trip, put_commit) the writer's reservation
        # of one more object for its next put
        wait_for("used bytes to grow", lambda: text(browser, "[data-metric=used]").startswith(("1.25 MiB", "1.50 MiB")))
        wait_for("the segment's object count", lambda: text(
            browser, f'#segments tr[data-key="{seg}"]').split()[-1] == "5")
        assert text(browser, "#clients"), "client row"
        # a put rate and RPC percentiles come from the window of samples
        wait_for("rpc latency rows", lambda: "put_start" in text(browser, "#rpc"))
        # the worker's Transfer Engine, scraped by the master: bytes/s per transport
        # (same host: cma, else tcp)
        te = wait_for("a Transfer Engine row", lambda: text(browser, "#te") if "B/s" in text(browser, "#te") else "")
        assert "write" in te and ("cma" in te or "tcp" in te), te
        # narrow window (see conftest): the page itself never scrolls sideways, wide tables do inside
        assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        polls = int(browser.execute_script("return document.body.dataset.polls"))
        assert polls >= 3  # live: it kept polling without a reload
    finally:
        if writer is not None:
            writer.close()
        worker.close()
    errs = console_errors(browser)
    assert not errs, f"console errors on the master page: {errs}"


def test_master_data_endpoint_serves_json(master: Master) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{master.metrics_port}/dashboard/data.json", timeout=5) as r:
        d = json.loads(r.read())
    assert d["service"] == "master" and d["ha"] == {"enabled": False, "leader": True, "epoch": d["ha"]["epoch"]}
    assert d["segments"] == [] and d["summary"]["keys"] == 0
    assert d["te"] == [] and "Connection refused" in d["te_note"]  # no engine there yet: said, not hidden


def test_health_route_for_probes(master: Master) -> None:
    """GET /health (Kubernetes probes, deploy/kubernetes/master.yaml) on the metrics port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{master.metrics_port}/health", timeout=5) as r:
        assert r.status == 200
        d = json.loads(r.read())
    assert d == {"status": "ok", "is_leader": True, "rpc_address": master.addr}


def test_first_poll_already_has_rates(master: Master) -> None:
    """The master samples its registry once a second from start-up, so the very first poll of
    data.json (nobody polled before) carries rates, not nulls the page would show as dashes."""
    time.sleep(1.5)
    with urllib.request.urlopen(f"http://127.0.0.1:{master.metrics_port}/dashboard/data.json", timeout=5) as r:
        d = json.loads(r.read())
    s = d["summary"]
    assert s["put_rate"] == 0.0 and s["get_rate"] == 0.0, s
    assert len(d["series"]["put_rate"]) >= 1
