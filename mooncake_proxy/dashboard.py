"""``/dashboard`` of the proxy: the live page and ``/dashboard/data.json`` behind it.

Every figure is derived from the proxy's own Prometheus registry, sampled at each poll into a
``mooncake_core.dashboard.window.Window`` (requests/s over 5 s; TTFT/TBT percentiles, 429s and
prefix-cache hit ratios over the last minute), plus the instances' health and the scheduler's
load read at that moment -- the same series a Grafana board queries.

Rates need two samples: a task on the proxy's event loop samples once a second from start-up
(``SAMPLE_S``), so a page's first poll already has them instead of dashes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from mooncake_core.dashboard.page import DASHBOARD_PATH, DATA_PATH, page_headers, page_html
from mooncake_core.dashboard.samples import sample_from_families
from mooncake_core.dashboard.window import Window

from .metrics import ProxyMetrics
from .registry import Registry
from .scheduling import ClusterState

RATE_S = 5.0
SPAN_S = 60.0
REQ = "mooncake_proxy_requests_total"
TTFT = "mooncake_proxy_ttft_seconds"
TBT = "mooncake_proxy_tbt_seconds"
SAMPLE_S = 1.0  # background sampling period (s)


class ProxyDashboard:
    """Page + data of one proxy; polled by any number of browsers (samples are throttled). Built
    from what it shows: the instances (registry), the scheduler's load (cluster), the metrics
    (and how to refresh their load gauges), and the policy and hand-off names."""

    def __init__(self, registry: Registry, cluster: ClusterState, metrics: ProxyMetrics,
                 refresh_load_gauges: Callable[[], None], policy: str, handoff: str) -> None:
        self._registry = registry
        self._cluster = cluster
        self._metrics = metrics
        self._refresh = refresh_load_gauges
        self.policy = policy
        self.handoff = handoff
        self.window = Window(SPAN_S)
        self._sampler: asyncio.Task[None] | None = None

    def register(self, app: web.Application) -> None:
        app.router.add_get(DASHBOARD_PATH, self._page)
        app.router.add_get(DASHBOARD_PATH + "/", self._page)
        app.router.add_get(DATA_PATH, self._data)
        app.on_startup.append(self._start_sampler)
        app.on_cleanup.append(self._stop_sampler)

    async def _start_sampler(self, app: web.Application) -> None:
        async def loop() -> None:
            while True:
                try:
                    self.sample()
                except Exception:  # noqa: BLE001 - a failed sample must not end the sampling
                    pass
                await asyncio.sleep(SAMPLE_S)
        self._sampler = asyncio.get_running_loop().create_task(loop())

    async def _stop_sampler(self, app: web.Application) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None

    def sample(self) -> None:
        """One sample of the registry (the load gauges refreshed first) into the window."""
        self._refresh()
        self.window.add(sample_from_families(time.monotonic(), self._metrics.registry.collect()))

    async def _page(self, request: web.Request) -> web.Response:
        return web.Response(body=page_html("proxy"), content_type="text/html", charset="utf-8",
                            headers=page_headers())

    async def _data(self, request: web.Request) -> web.Response:
        return web.json_response(self.data(), headers={"Cache-Control": "no-store"})

    def data(self) -> dict[str, Any]:
        self.sample()
        w = self.window
        s = w.latest
        assert s is not None
        by_prefill = w.rates_by("mooncake_proxy_scheduler_decisions_total", "prefill", over_s=RATE_S)
        by_decode = w.rates_by("mooncake_proxy_scheduler_decisions_total", "decode", over_s=RATE_S)
        by_recompute = s.by("mooncake_proxy_decode_recomputes_total", "prefill")
        instances = []
        for inst in self._registry.all():
            iid = inst.instance_id
            row: dict[str, Any] = {"id": iid, "role": inst.role, "url": inst.url, "health": inst.health.state.value,
                                   "in_flight": inst.in_flight, "last_error": inst.last_error or ""}
            if inst.role == "prefill":
                where = {"instance": iid}
                row["queued_tokens"] = self._cluster.prefill_load(iid).queued_tokens
                row["prefix_hit_ratio"] = w.ratio("mooncake_proxy_prefill_cached_blocks_total",
                                                  ["mooncake_proxy_prefill_prompt_blocks_total"], where, SPAN_S)
                row["req_rate"] = by_prefill.get(iid)
                row["recomputes"] = by_recompute.get(iid, 0.0)
            else:
                row["running"] = self._cluster.decode_load(iid).running
                row["req_rate"] = by_decode.get(iid)
            instances.append(row)
        completions = [r for r in s.label_values(REQ, "route") if r != "/v1/models"]
        return {
            "service": "proxy",
            "policy": self.policy,
            "handoff": self.handoff,
            "summary": {
                "requests_total": sum(s.value(REQ, {"route": r}) for r in completions),
                "req_rate": sum(w.rate(REQ, {"route": r}, RATE_S) or 0.0 for r in completions)
                if len(w) > 1 else None,
                "ttft": w.quantiles(TTFT, over_s=SPAN_S), "tbt": w.quantiles(TBT, over_s=SPAN_S),
                "rejected_429": s.value("mooncake_proxy_rejections_total", {"reason": "slo"}),
                "rejected_503": sum(v for k, v in s.by("mooncake_proxy_rejections_total", "reason").items()
                                    if k.startswith("no_healthy")),
                "in_flight": sum(i.in_flight for i in self._registry.all()),
                # hand-offs that carried no KV (the decode recomputed): a silent fallback
                "decode_recomputes": s.value("mooncake_proxy_decode_recomputes_total"),
            },
            "instances": instances,
            "series": {
                "req_rate": _sum_series([w.rate_series(REQ, {"route": r}) for r in completions]),
                "ttft_p90": w.quantile_series(TTFT, 0.9),
                "tbt_p90": w.quantile_series(TBT, 0.9),
                "rejected_rate": w.rate_series("mooncake_proxy_rejections_total", {"reason": "slo"}),
                "in_flight": w.value_series("mooncake_proxy_instance_in_flight"),
            },
        }


def _sum_series(series: list[list[list[float]]]) -> list[list[float]]:
    """Point-wise sum of series taken from the same samples (same timestamps)."""
    if not series:
        return []
    out = [list(p) for p in series[0]]
    for other in series[1:]:
        for p, q in zip(out, other):
            p[1] += q[1]
    return out
