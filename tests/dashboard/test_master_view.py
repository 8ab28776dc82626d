"""The master page's data, built from a real MasterState/MasterServer that is never bound to a
port (no sockets): segment rows, objects per segment, rates from the window, TE scrapes."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, generate_latest

from mooncake_core.store.master_dashboard import MasterDashboard, _host_of, te_metrics_url
from mooncake_core.store.master_server import MasterServer
from mooncake_core.store.master_state import MasterState


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_segments_objects_rates_and_te_rows() -> None:
    clock = Clock()
    state = MasterState(clock=clock)
    server = MasterServer(state, "127.0.0.1", 0, registry=CollectorRegistry())
    te = CollectorRegistry()
    te_bytes = Counter("mooncake_te_bytes", "b", ["transport", "op"], registry=te)
    te_bytes.labels("tcp", "write").inc(0)
    scrapes: list[str] = []

    def scrape(url: str, timeout: float) -> str:
        scrapes.append(url)
        if url.startswith("http://down"):
            raise OSError("connection refused")
        return generate_latest(te).decode()

    dash = MasterDashboard(server, te_endpoints=["node:9400", "http://down:1/metrics"], clock=clock, scrape=scrape)
    state.mount_segment("c1", "10.0.0.5:12345", 0x1000, 1 << 20)
    d = dash.data()
    assert d["segments"] == [{"name": "10.0.0.5:12345", "owner": "c1", "host": "10.0.0.5", "capacity": 1 << 20,
                              "used": 0, "objects": 0}]
    assert d["summary"]["put_rate"] is None  # one sample: no rate yet, not a made-up zero
    assert scrapes == ["http://node:9400/metrics", "http://down:1/metrics"]
    assert "down:1" in d["te_note"] and "connection refused" in d["te_note"]
    for i in range(4):
        state.put_start("c1", f"k{i}", 1000)
        state.put_end("c1", f"k{i}")
    te_bytes.labels("tcp", "write").inc(8 << 20)
    clock.t += 2.0
    d = dash.data()
    assert d["segments"][0]["objects"] == 4 and d["summary"]["keys"] == 4
    assert d["summary"]["put_rate"] == 2.0  # 4 puts in 2 s
    assert d["clients"][0]["id"] == "c1" and d["clients"][0]["last_heartbeat_s"] == 2.0
    [row] = d["te"]
    idle = MasterDashboard(server, te_endpoints=["node:9400"], clock=clock, scrape=lambda u, t: "")
    assert idle.data()["te_note"] == "no transfer yet on node:9400"  # reachable, nothing moved: said so
    assert (row["endpoint"], row["transport"], row["op"], row["bytes_per_s"]) == ("node:9400", "tcp", "write", 4 << 20)


def test_helpers() -> None:
    assert _host_of("[::1]:5000") == "::1" and _host_of("h:1") == "h" and _host_of("plain") == "plain"
    assert te_metrics_url("h:1") == "http://h:1/metrics" and te_metrics_url("https://x/metrics") == "https://x/metrics"


def test_background_samples_give_rates_on_the_first_poll() -> None:
    """The sampler (``start``) keeps the window filled before any page asks: the first
    ``data()`` of a page already has rates (here 3 puts in the 1.5 s since the last sample)."""
    clock = Clock()
    state = MasterState(clock=clock)
    server = MasterServer(state, "127.0.0.1", 0, registry=CollectorRegistry())
    dash = MasterDashboard(server, clock=clock)
    state.mount_segment("c1", "10.0.0.5:12345", 0x1000, 1 << 20)
    dash.sample()  # what the background thread does once a second
    for i in range(3):
        state.put_start("c1", f"k{i}", 1000)
        state.put_end("c1", f"k{i}")
    clock.t += 1.5
    d = dash.data()  # the first poll
    assert d["summary"]["put_rate"] == 2.0 and d["summary"]["get_rate"] == 0.0
    assert len(d["series"]["put_rate"]) == 1


def test_sampler_thread_samples_until_closed() -> None:
    server = MasterServer(MasterState(), "127.0.0.1", 0, registry=CollectorRegistry())
    dash = MasterDashboard(server).start(interval_s=0.6)
    try:
        deadline = time.monotonic() + 10
        while len(dash.window) < 2:
            assert time.monotonic() < deadline, "the sampler took no second sample"
            time.sleep(0.05)
    finally:
        dash.close()
    n = len(dash.window)
    time.sleep(0.8)
    assert len(dash.window) == n and dash._thread is None
