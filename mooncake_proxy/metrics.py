"""Prometheus metrics of the proxy, one registry per server so tests can run several in-process.

``ProxyMetrics`` also keeps the labelled children the request path touches (prometheus'
``.labels()`` costs a lock and a dict lookup per call) and forgets an instance's series when the
instance is removed, so no caller holds a cache of its own.
"""

from __future__ import annotations

import bisect
from collections.abc import Container, Mapping
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily

_TBT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)
_LAT_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class _PlainHistogram:
    """A histogram child kept in plain ints (~0.3 us per ``observe`` instead of ~4-8 us for
    prometheus_client's locked Histogram): TBT is observed once per streamed chunk, i.e. per
    token, on the proxy's hot path. Exported by ``_PlainHistograms`` as a regular histogram."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.sum += v


class _PlainHistograms:
    """One labelled histogram family of ``_PlainHistogram`` children (a registry collector)."""

    def __init__(self, name: str, doc: str, label: str, bounds: tuple[float, ...]) -> None:
        self.name, self.doc, self.label, self.bounds = name, doc, label, bounds
        self.children: dict[str, _PlainHistogram] = {}

    def labels(self, value: str) -> _PlainHistogram:
        h = self.children.get(value)
        if h is None:
            h = self.children[value] = _PlainHistogram(self.bounds)
        return h

    def collect(self) -> Iterator[Any]:
        fam = HistogramMetricFamily(self.name, self.doc, labels=[self.label])
        for value, h in list(self.children.items()):
            cum, buckets = 0, []
            for le, c in zip(self.bounds + (float("inf"),), list(h.counts)):
                cum += c
                buckets.append(("+Inf" if le == float("inf") else repr(float(le)), cum))
            fam.add_metric([value], buckets, h.sum)
        yield fam


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("mooncake_proxy_requests", "Client requests by route and HTTP status",
                                ["route", "status"], registry=r)
        self.ttft = Histogram("mooncake_proxy_ttft_seconds",
                              "Time from request arrival to the first response byte sent to the client",
                              ["route"], buckets=_LAT_BUCKETS, registry=r)
        self.tbt = _PlainHistograms("mooncake_proxy_tbt_seconds",
                                    "Time between two streamed decode chunks (time between tokens for SSE)",
                                    "route", _TBT_BUCKETS)
        r.register(self.tbt)
        self.e2e = Histogram("mooncake_proxy_e2e_seconds", "Request latency until the last byte",
                             ["route"], buckets=_LAT_BUCKETS, registry=r)
        self.rejections = Counter("mooncake_proxy_rejections",
                                  "Requests answered 429 (slo: rejected on arrival; slo_decode: at the decode stage, "
                                  "--rejection decode) or 503 (no instance)",
                                  ["reason"], registry=r)
        self.in_flight = Gauge("mooncake_proxy_instance_in_flight", "Requests in flight per instance",
                               ["instance", "role"], registry=r)
        self.healthy = Gauge("mooncake_proxy_instance_healthy", "1 if the instance passes health checks",
                             ["instance", "role"], registry=r)
        self.first_token = Counter("mooncake_proxy_prefill_first_token",
                                   "--prefill-first-token: requests whose first token the proxy streamed from "
                                   "the prefill (streamed), that the prefill alone answered (prefill_only), "
                                   "that took the normal hand-off (ineligible), or whose prefill answer lacked "
                                   "token ids (fallback)", ["outcome"], registry=r)
        self.peer_prefix = Counter("mooncake_proxy_peer_prefix_exports",
                                   "--peer-prefix: prefixes a peer instance exported for the chosen prefill "
                                   "(exported), exports that failed or timed out (failed: the prefill computes), "
                                   "and planned peer loads without token ids or kv_transfer_params (skipped)",
                                   ["outcome"], registry=r)
        self.decode_recomputes = Counter("mooncake_proxy_decode_recomputes",
                                         "Requests handed to a decode with no KV to load, so the decode "
                                         "recomputes the whole prompt: the prefill answered without "
                                         "kv_transfer_params (no_kv_transfer_params: its connector held no "
                                         "blocks). Alert on any rate: latency doubles without an error.",
                                         ["prefill", "decode", "reason"], registry=r)
        self.decisions = Counter("mooncake_proxy_scheduler_decisions",
                                 "Scheduler decisions by chosen prefill/decode pair",
                                 ["policy", "prefill", "decode"], registry=r)
        self.cached_blocks = Counter("mooncake_proxy_scheduler_cached_blocks",
                                     "Prompt blocks the scheduler expected to be cached at the prefill",
                                     registry=r)
        self.prompt_blocks = Counter("mooncake_proxy_prefill_prompt_blocks",
                                     "Prompt blocks sent to a prefill instance", ["instance"], registry=r)
        self.prompt_cached_blocks = Counter("mooncake_proxy_prefill_cached_blocks",
                                            "Prompt blocks expected cached at the prefill instance chosen "
                                            "(prefix-cache hits)", ["instance"], registry=r)
        self.upstream_errors = Counter("mooncake_proxy_upstream_errors",
                                       "Failed upstream calls by instance and kind",
                                       ["instance", "kind"], registry=r)
        self.prefill_queued_tokens = Gauge("mooncake_proxy_prefill_queued_tokens",
                                           "Prompt tokens queued or running per prefill instance "
                                           "(scheduler's view)", ["instance"], registry=r)
        self.decode_running = Gauge("mooncake_proxy_decode_running",
                                    "Requests decoding per decode instance (scheduler's view)",
                                    ["instance"], registry=r)
        self.cost_factor = Gauge("mooncake_proxy_cost_factor",
                                 "Online calibration (--calibrate): observed / profile-predicted latency, "
                                 "by side (prefill: queue + prefill time; decode: time between tokens)",
                                 ["side"], registry=r)
        self.instance_cost_factor = Gauge("mooncake_proxy_instance_cost_factor",
                                          "Online calibration (--calibrate): the factor of cost_factor kept per "
                                          "instance (its own samples, pulled towards the shared factor until it "
                                          "has 3); the scheduler estimates each instance with its own",
                                          ["instance", "side"], registry=r)
        self.contention_slope = Gauge("mooncake_proxy_contention_slope",
                                      "Online calibration (--calibrate): log-slowdown of a prefill per busy "
                                      "neighbouring prefill instance (0 where instances do not slow each other; "
                                      "scheduling/contention.py)", ["side"], registry=r)
        self.decode_interference = Gauge("mooncake_proxy_decode_interference",
                                         "Online calibration (--calibrate): log-slowdown of a decode instance's "
                                         "steps while a prefill instance computes (0 where they do not share "
                                         "hardware; scheduling/contention.py)", ["decode", "prefill"], registry=r)
        self.hardware_share_exponent = Gauge("mooncake_proxy_hardware_share_exponent",
                                             "Online calibration (--prefill-contention groups): a prefill in a "
                                             "declared --hardware-group runs (1 + its busy mates' shares) ** this "
                                             "times its time alone (1 = ideal processor sharing; "
                                             "scheduling/contention.py)", ["group"], registry=r)
        self.prefill_interference = Gauge("mooncake_proxy_prefill_interference",
                                          "Online calibration (--calibrate --prefill-contention pairs): "
                                          "log-slowdown of a prefill instance's work while another prefill "
                                          "instance computes (0 where they do not share hardware; "
                                          "scheduling/contention.py)", ["prefill", "other"], registry=r)
        self.first_token_delay = Gauge("mooncake_proxy_decode_first_token_seconds",
                                       "Online calibration (--calibrate): moving mean of the delay from a "
                                       "prefill's answer to the decode instance's first token (KV pull, "
                                       "queue, first step; the TTFT SLO check uses the hand-off queue, "
                                       "scheduling/handoff_queue.py)", ["instance"],
                                       registry=r)
        self.kv_events = Counter("mooncake_proxy_kv_events", "vLLM KV cache events applied",
                                 ["instance", "type"], registry=r)

        # cached children of the hot path, and the calibration series shown so far
        self._req_counters: dict[tuple[str, int], Any] = {}
        self._route_hist: dict[tuple[str, str], Any] = {}
        self._decision_ctr: dict[tuple[str, str, str], Any] = {}
        self._inflight_gauge: dict[str, Any] = {}
        self._prefix_ctr: dict[str, tuple[Any, Any]] = {}
        self._factor_gauge: dict[tuple[str, str], Any] = {}  # (side, instance) -> instance_cost_factor child
        self._interference_shown: set[tuple[str, str]] = set()  # (decode, prefill) pairs with a gauge series
        self._pairs_shown: set[tuple[str, str]] = set()  # (prefill, other instance) pairs with a gauge series

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ------------------------------------------------------------------ the request path
    def count_request(self, route: str, status: int) -> None:
        key = (route, status)
        c = self._req_counters.get(key)
        if c is None:
            c = self._req_counters[key] = self.requests.labels(route, str(status))
        c.inc()

    def route_hist(self, which: str, route: str) -> Any:
        """The ``ttft``/``e2e``/``tbt`` histogram child of ``route``."""
        key = (which, route)
        h = self._route_hist.get(key)
        if h is None:
            h = self._route_hist[key] = getattr(self, which).labels(route)
        return h

    def decided(self, policy: str, prefill: str, decode: str) -> None:
        key = (policy, prefill, decode)
        c = self._decision_ctr.get(key)
        if c is None:
            c = self._decision_ctr[key] = self.decisions.labels(*key)
        c.inc()

    def prompt_sent(self, instance: str, blocks: int, cached: int) -> None:
        """A prompt of ``blocks`` full blocks went to prefill ``instance``, ``cached`` of them expected cached."""
        pc = self._prefix_ctr.get(instance)
        if pc is None:
            pc = self._prefix_ctr[instance] = (self.prompt_blocks.labels(instance),
                                               self.prompt_cached_blocks.labels(instance))
        pc[0].inc(blocks)
        if cached:
            pc[1].inc(cached)

    def set_in_flight(self, instance: str, role: str, n: int) -> None:
        g = self._inflight_gauge.get(instance)
        if g is None:
            g = self._inflight_gauge[instance] = self.in_flight.labels(instance, role)
        g.set(n)

    # ------------------------------------------------------------------ instances
    def instance_added(self, instance: str, role: str) -> None:
        self.healthy.labels(instance, role).set(0)
        self.in_flight.labels(instance, role).set(0)

    def forget_instance(self, instance: str, role: str) -> None:
        """Drop every series and cached child of a removed instance."""
        self._inflight_gauge.pop(instance, None)
        self._prefix_ctr.pop(instance, None)
        self._decision_ctr = {k: v for k, v in self._decision_ctr.items() if instance not in k[1:]}
        for side in ("prefill", "decode"):
            self._factor_gauge.pop((side, instance), None)
            _remove(self.instance_cost_factor, instance, side)
        _remove(self.first_token_delay, instance)
        for shown, gauge in ((self._interference_shown, self.decode_interference),
                             (self._pairs_shown, self.prefill_interference)):
            for pair in [pr for pr in shown if instance in pr]:
                shown.discard(pair)
                _remove(gauge, *pair)
        for g in (self.healthy, self.in_flight):
            _remove(g, instance, role)
        for c in (self.prompt_blocks, self.prompt_cached_blocks):
            _remove(c, instance)

    # ------------------------------------------------------------------ online calibration
    def show_calibration(self, side: str, factor: float, slope: float | None, exponents: Mapping[str, float],
                         interference: Mapping[str, Mapping[str, float]],
                         instance_factors: Mapping[tuple[str, str], float], live: Container[str]) -> None:
        """Publish a recalibration of ``side``: its shared factor, and for the prefill side the
        contention slope, the hardware groups' exponents and the prefill pairs, for the decode side
        the decode/prefill pairs (``interference`` is the side's coefficients); every pair shown once
        keeps a series, 0 once its coefficient is gone. Instances not ``live`` get no new series."""
        self.cost_factor.labels(side).set(factor)
        shown, gauge = ((self._pairs_shown, self.prefill_interference) if side == "prefill"
                        else (self._interference_shown, self.decode_interference))
        if side == "prefill":
            self.contention_slope.labels(side).set(slope or 0.0)
            for group, e in exponents.items():
                self.hardware_share_exponent.labels(group).set(e)
        for a, coef in interference.items():
            shown.update((a, b) for b in coef)
        for a, b in shown:
            if a in live and b in live:
                gauge.labels(a, b).set(interference.get(a, {}).get(b, 0.0))
        for key, f in instance_factors.items():
            g = self._factor_gauge.get(key)
            if g is None:
                if key[1] not in live:
                    continue
                g = self._factor_gauge[key] = self.instance_cost_factor.labels(key[1], key[0])
            g.set(f)


def _remove(metric: Any, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass
