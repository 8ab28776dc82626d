"""The dashboards' aggregation (rates, ratios, percentiles over a window) -- pure, no sockets."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram as PromHistogram, generate_latest

from mooncake_core.dashboard.samples import metric_names, sample_from_families, sample_from_text
from mooncake_core.dashboard.window import Histogram, Sample, Window, quantile


def _sample(t: float, puts: float, hits: float = 0, misses: float = 0, hist: Histogram | None = None) -> Sample:
    s = Sample(t, counters={"puts_total": {(): puts}, "hits_total": {(): hits}, "misses_total": {(): misses}})
    if hist is not None:
        s.histograms["lat_seconds"] = {(("method", "get"),): hist}
    return s


def test_rate_over_recent_seconds_only() -> None:
    w = Window(60, min_step_s=0)
    for t in range(11):  # 10 puts/s for 10 s...
        w.add(_sample(float(t), 10.0 * t))
    for t in range(11, 16):  # ...then 100/s
        w.add(_sample(float(t), 100.0 + 100.0 * (t - 10)))
    assert w.rate("puts_total", over_s=5) == pytest.approx(100.0)
    assert w.rate("puts_total", over_s=None) == pytest.approx((600.0 - 0.0) / 15)


def test_counter_reset_counts_the_new_value() -> None:
    w = Window(60, min_step_s=0)
    w.add(_sample(0, 1000))
    w.add(_sample(1, 7))  # the service restarted and has done 7 puts since
    assert w.rate("puts_total") == pytest.approx(7.0)
    assert [v for _, v in w.rate_series("puts_total")] == [7.0]


def test_window_drops_old_samples_and_throttles_fast_polls() -> None:
    w = Window(10, min_step_s=0.5)
    assert w.add(_sample(0, 0))
    assert not w.add(_sample(0.2, 5))  # a second browser polling: not a new point
    for t in range(1, 30):
        w.add(_sample(float(t), t))
    assert len(w) <= 12 and w.latest is not None and w.latest.t == 29


def test_ratio_of_window_and_first_sample() -> None:
    w = Window(60, min_step_s=0)
    w.add(_sample(0, 0, hits=3, misses=1))
    assert w.ratio("hits_total", ["hits_total", "misses_total"]) == pytest.approx(0.75)  # totals so far
    w.add(_sample(1, 0, hits=4, misses=4))
    assert w.ratio("hits_total", ["hits_total", "misses_total"]) == pytest.approx(0.25)  # 1 of 4 in the window
    w.add(_sample(2, 0, hits=4, misses=4))
    assert w.ratio("hits_total", ["hits_total", "misses_total"], over_s=0.5) is None  # nothing moved


def test_quantile_interpolates_like_prometheus() -> None:
    h = Histogram((0.1, 0.2, 0.4), (0, 10, 0, 0))  # ten observations in (0.1, 0.2]
    assert quantile(h, 0.5) == pytest.approx(0.15)
    assert quantile(h, 1.0) == pytest.approx(0.2)
    assert quantile(Histogram((1.0,), (0, 3)), 0.5) == 1.0  # only +Inf: the largest finite bound
    assert quantile(Histogram((1.0,), (0, 0)), 0.5) is None
    with pytest.raises(ValueError, match="q must be"):
        quantile(h, 1.5)
    with pytest.raises(ValueError, match="counts"):
        Histogram((1.0,), (1,))


def test_percentiles_cover_only_the_window() -> None:
    w = Window(120, min_step_s=0)
    slow = Histogram((0.001, 0.01, 0.1, 1.0), (0, 0, 0, 100, 0))  # 100 slow calls long ago
    w.add(_sample(0, 0, hist=slow))
    w.add(_sample(1, 0, hist=slow))
    fast = Histogram(slow.bounds, (50, 0, 0, 100, 0))  # then 50 fast ones
    w.add(_sample(100, 0, hist=fast))
    q = w.quantiles("lat_seconds", (0.5, 0.99), over_s=60)
    assert q["p50"] is not None and q["p50"] <= 0.001 and q["p99"] is not None and q["p99"] <= 0.001
    assert w.count("lat_seconds", {"method": "get"}, over_s=60) == 50
    assert w.quantiles("lat_seconds", where={"method": "put"})["p50"] is None
    assert w.quantile_series("lat_seconds", 0.5)[-1][1] <= 0.001


def test_samples_from_a_registry_and_from_scraped_text_agree() -> None:
    reg = CollectorRegistry()
    c = Counter("demo_requests", "r", ["route"], registry=reg)
    h = PromHistogram("demo_ttft_seconds", "t", ["route"], buckets=(0.01, 0.1, 1.0), registry=reg)
    c.labels("/a").inc(3)
    c.labels("/b").inc(2)
    for v in (0.005, 0.05, 0.05, 0.5):
        h.labels("/a").observe(v)
    a = sample_from_families(1.0, reg.collect())
    b = sample_from_text(1.0, generate_latest(reg).decode())
    for s in (a, b):
        assert s.value("demo_requests_total") == 5
        assert s.by("demo_requests_total", "route") == {"/a": 3, "/b": 2}
        hist = s.histogram("demo_ttft_seconds")
        assert hist is not None and hist.total == 4 and hist.counts == (1, 2, 1, 0)
        assert s.value("demo_ttft_seconds_count") == 4
        assert s.label_values("demo_requests_total", "route") == ["/a", "/b"]
    names = metric_names(reg.collect())
    assert {"demo_requests_total", "demo_ttft_seconds_bucket", "demo_ttft_seconds_sum"} <= names
    assert not any(math.isnan(v) for v in a.counters["demo_requests_total"].values())


def test_proxy_tbt_plain_histogram_exports_like_a_prometheus_one() -> None:
    from mooncake_proxy.metrics import ProxyMetrics

    m = ProxyMetrics()
    h = m.tbt.labels("/v1/completions")
    for v in (0.0005, 0.012, 0.012, 9.0):  # on a bound, inside, above the last bound
        h.observe(v)
    s = sample_from_text(0.0, m.render().decode())
    hist = s.histogram("mooncake_proxy_tbt_seconds", {"route": "/v1/completions"})
    assert hist is not None and hist.total == 4
    assert hist.counts[0] == 1 and hist.counts[-1] == 1  # le is inclusive, 9 s lands in +Inf
    assert s.value("mooncake_proxy_tbt_seconds_sum") == pytest.approx(9.0245)
    assert quantile(hist, 0.5) is not None and 0.01 < quantile(hist, 0.5) <= 0.02
