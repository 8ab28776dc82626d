"""What ``/dashboard/data.json`` of ``mooncake_master`` answers (served on its --metrics_port).

Figures come from two places: the master's own Prometheus registry (counters and RPC latency
histograms, sampled into a ``dashboard.window.Window`` at each poll, so rates and percentiles
are what a Grafana board computes from the same series) and a short look at the state under
the server lock for what no metric has (segment owners, clients' last heartbeat). That look
copies O(segments + clients) fields -- never a walk over the objects -- so a poll a second
does not slow the RPC loop.

Transfer Engine figures: a master moves no bytes itself; with ``--dashboard_te_metrics`` it
scrapes the given engines' /metrics endpoints (bounded by a short timeout each) and shows bytes/s
per transport.

Rates need two samples. ``start()`` samples once a second in the background from the master's
start on (one registry walk and one scrape per TE endpoint a second), so a page's *first* poll
already shows rates over the last seconds instead of dashes; polls add samples too (throttled by
the window), so a master without the sampler still works from its second poll on.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import TYPE_CHECKING, Any, Callable

from mooncake_core.dashboard.samples import sample_from_families, sample_from_text
from mooncake_core.dashboard.window import Window

if TYPE_CHECKING:
    from mooncake_core.store.master_server import MasterServer

#: rates are taken over the last few seconds (live), percentiles and ratios over a minute
RATE_S = 5.0
SPAN_S = 60.0
TE_SCRAPE_TIMEOUT_S = 0.5
#: seconds between two background samples (``MasterDashboard.start``)
SAMPLE_S = 1.0


def _host_of(segment: str) -> str:
    """Mooncake names a segment after its client's local_hostname ("host:port" or "[v6]:port")."""
    if segment.startswith("["):
        return segment[1:].split("]", 1)[0]
    return segment.rsplit(":", 1)[0] if segment.count(":") == 1 else segment


def _scrape(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (operator-given URL)
        return r.read().decode("utf-8", "replace")


def te_metrics_url(endpoint: str) -> str:
    """``host:port`` or a URL -> the /metrics URL to scrape."""
    e = endpoint.strip()
    if not e.startswith(("http://", "https://")):
        e = "http://" + e
    return e if e.rstrip("/").endswith("/metrics") else e.rstrip("/") + "/metrics"


class MasterDashboard:
    """Builds the master page's data; one instance per server, polled by any number of pages."""

    def __init__(self, server: "MasterServer", *, ha_enabled: bool = False, te_endpoints: list[str] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 scrape: Callable[[str, float], str] = _scrape) -> None:
        self.server = server
        self.ha_enabled = ha_enabled
        self.clock = clock
        self.window = Window(SPAN_S)
        self.te_endpoints = [e for e in (te_endpoints or []) if e.strip()]
        self.te_windows = {e: Window(SPAN_S) for e in self.te_endpoints}
        self.te_errors: dict[str, str] = {}
        self._scrape = scrape
        self._lock = threading.Lock()  # pages poll from several HTTP threads
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, interval_s: float = SAMPLE_S) -> "MasterDashboard":
        """Sample every ``interval_s`` in a daemon thread until ``close`` (see the module text)."""
        def loop() -> None:
            while True:
                try:
                    self.sample()
                except Exception:  # noqa: BLE001 - a failed sample must not end the sampling
                    pass
                if self._stop.wait(interval_s):
                    return
        self._thread = threading.Thread(target=loop, name="mooncake-dashboard-sampler", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def sample(self) -> None:
        """One sample of the registry and of each TE endpoint into their windows."""
        with self._lock:
            self._sample(self.clock())

    def _sample(self, now: float) -> None:
        reg = self.server.registry
        if reg is not None:
            self.window.add(sample_from_families(now, reg.collect()))
        for ep in self.te_endpoints:
            w = self.te_windows[ep]
            if w.latest is not None and now - w.latest.t < w.min_step_s:
                continue  # sampled just now: no second scrape
            try:
                text = self._scrape(te_metrics_url(ep), TE_SCRAPE_TIMEOUT_S)
                w.add(sample_from_text(now, text))
                self.te_errors.pop(ep, None)
            except (OSError, ValueError) as e:
                self.te_errors[ep] = f"{type(e).__name__}: {e}"

    def data(self) -> dict[str, Any]:
        with self._lock:
            return self._data()

    def _data(self) -> dict[str, Any]:
        srv, st = self.server, self.server.state
        now = self.clock()
        self._sample(now)
        with srv.lock:
            mono = st.clock()
            resv = st.reservations_by_segment()
            segments = [{"name": s.key, "owner": s.client_id, "host": _host_of(s.name), "capacity": s.size,
                         "used": s.alloc.used, "objects": s.alloc.num_allocations - resv.get(s.key, 0)}
                        for s in st.segments.values()]
            clients = [{"id": c.client_id, "segments": sorted(c.segments),
                        "last_heartbeat_s": round(max(0.0, mono - c.last_seen), 2)} for c in st.clients.values()]
            keys, inflight = len(st.objects), st.puts_in_flight
            disk_used, offloading = st.tier.disk_used, len(st.tier.offloading)
            cfg, epoch = st.cfg, st.epoch
            hits, misses, evictions = st.stats.hits, st.stats.misses, st.stats.evictions
            lease_refusals, no_space = st.stats.lease_refusals, st.stats.no_space
        w = self.window
        get_names = ("mooncake_master_hits_total", "mooncake_master_misses_total")
        put_rate = w.rate("mooncake_master_puts_total", over_s=RATE_S)
        hr = w.rate(get_names[0], over_s=RATE_S)
        mr = w.rate(get_names[1], over_s=RATE_S)
        rpc: list[dict[str, Any]] = []
        latest = w.latest
        for method in (latest.label_values("mooncake_master_rpc_seconds", "method") if latest else []):
            where = {"method": method}
            if w.count("mooncake_master_rpc_seconds", where, SPAN_S) <= 0:
                continue
            rpc.append({"method": method, "rate": w.rate("mooncake_master_rpc_seconds_count", where, RATE_S),
                        **w.quantiles("mooncake_master_rpc_seconds", where=where, over_s=SPAN_S)})
        rpc.sort(key=lambda r: -float(r["rate"] or 0.0))
        return {
            "service": "master",
            "address": srv.address,
            "summary": {
                "keys": keys, "puts_in_flight": inflight,
                "used_bytes": sum(s["used"] for s in segments), "capacity_bytes": sum(s["capacity"] for s in segments),
                "segments": len(segments), "clients": len(clients),
                "hits": hits, "misses": misses, "evictions": evictions, "lease_refusals": lease_refusals,
                "no_space": no_space,
                "hit_ratio": w.ratio(get_names[0], get_names),
                "put_rate": put_rate, "get_rate": None if hr is None or mr is None else hr + mr,
                "offload_enabled": cfg.enable_offload, "disk_used_bytes": disk_used,
                "disk_quota_bytes": cfg.disk_quota_bytes, "offloads_in_flight": offloading,
            },
            "ha": {"enabled": self.ha_enabled, "leader": srv.is_leader, "epoch": str(epoch)},
            "segments": sorted(segments, key=lambda s: s["name"]),
            "clients": sorted(clients, key=lambda c: c["id"]),
            "rpc": rpc,
            "series": {
                "put_rate": w.rate_series("mooncake_master_puts_total"),
                "get_rate": w.rate_series(get_names),
                "evictions": w.rate_series("mooncake_master_evictions_total"),
                "keys": w.value_series("mooncake_master_keys"),
                "used_bytes": w.value_series("mooncake_master_used_bytes"),
            },
            **self._te(),
        }

    def _te(self) -> dict[str, Any]:
        rows: list[dict[str, Any]] = []
        for ep in self.te_endpoints:
            w = self.te_windows[ep]
            latest = w.latest
            if latest is None:
                continue
            keys = sorted({(dict(lb).get("transport", ""), dict(lb).get("op", ""))
                           for lb in latest.counters.get("mooncake_te_bytes_total", {})})
            for transport, op in keys:
                where = {"transport": transport, "op": op}
                rows.append({"endpoint": ep, "transport": transport, "op": op,
                             "bytes_per_s": w.rate("mooncake_te_bytes_total", where, RATE_S),
                             "errors_per_s": w.rate("mooncake_te_errors_total", where, RATE_S)})
        note = "; ".join(f"{ep}: {err}" for ep, err in self.te_errors.items()) if self.te_errors else None
        if not self.te_endpoints:
            note = "no Transfer Engine endpoint given (mooncake_master --dashboard_te_metrics=host:port,...)"
        elif not rows and note is None:
            note = f"no transfer yet on {', '.join(self.te_endpoints)}"
        return {"te": rows, "te_note": note}


def routes(dash: MasterDashboard) -> dict[str, Callable[[dict[str, Any]], tuple[int, dict[str, str], bytes]]]:
    """The WSGI routes of the page and its data (for ``utils.metrics.start_metrics_server``)."""
    import json

    from mooncake_core.dashboard.page import DASHBOARD_PATH, DATA_PATH, page_headers, page_html

    def page(_environ: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        return 200, {"Content-Type": "text/html; charset=utf-8", **page_headers()}, page_html("master")

    def data(_environ: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        return 200, {"Content-Type": "application/json", "Cache-Control": "no-store"}, \
            json.dumps(dash.data(), separators=(",", ":")).encode()

    def health(_environ: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        # 200 while the process serves: liveness and readiness probes (Kubernetes) of a leader and
        # of an HA follower alike -- clients find the leader through etcd/Redis, not through a Service
        srv = dash.server
        body = {"status": "ok", "is_leader": bool(srv.is_leader), "rpc_address": srv.advertise_address}
        return 200, {"Content-Type": "application/json", "Cache-Control": "no-store"}, \
            json.dumps(body, separators=(",", ":")).encode()

    return {DASHBOARD_PATH: page, DATA_PATH: data, "/health": health}
