"""Prometheus metrics of the Transfer Engine (process-wide, labelled by transport and op).

Kept few and readable (Mooncake issue #2318): bytes, requests, errors and batch latency per
transport and direction, plus what this engine served to peers and what it refused.

Why a custom collector instead of prometheus_client Counters on the hot path: a 4 KiB
transfer takes ~20 us end to end and ``Counter.labels().inc()`` plus ``Histogram.observe``
cost ~2-3 us of locking; here the hot path only bumps plain ints in a list (atomic enough
under the GIL for statistics) and the collector turns them into metric families when
``/metrics`` is scraped. Served over HTTP only when asked (MC_METRICS_PORT or
``initialize_ext(..., metrics_port=N)``).
"""

from __future__ import annotations

import bisect
import threading

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.te.metrics")

BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)


class _Stat:
    """Counters and a latency histogram for one (transport, op)."""

    __slots__ = ("bytes", "ok", "errors", "buckets", "sum")

    def __init__(self) -> None:
        self.bytes = 0
        self.ok = 0
        self.errors = 0
        self.buckets = [0] * (len(BUCKETS) + 1)
        self.sum = 0.0


_stats: dict[tuple[str, str], _Stat] = {}
_served: dict[str, int] = {"write": 0, "read": 0}
_refused: dict[str, int] = {}
_lanes: dict[tuple[str, str, str], int] = {}  # (transport, lanes, op) -> bytes
_lock = threading.Lock()


def _stat(transport: str, op: str) -> _Stat:
    s = _stats.get((transport, op))
    if s is None:
        with _lock:
            s = _stats.setdefault((transport, op), _Stat())
    return s


def record(transport: str, op: str, nbytes: int, nreq: int, seconds: float, ok: bool) -> None:
    """Account one finished batch (or single request) on the initiator side."""
    s = _stat(transport, op)
    if ok:
        s.bytes += nbytes
        s.ok += nreq
    else:
        s.errors += nreq
    s.buckets[bisect.bisect_left(BUCKETS, seconds)] += 1
    s.sum += seconds


def served_counters() -> dict[str, int]:
    """The live served-bytes counters by op: the rpc server's hot loop adds to them in place
    (one dict item update per request, no call)."""
    return _served


def served(op: str, nbytes: int) -> None:
    """Bytes this engine's rpc port moved for peers (target side)."""
    _served[op] = _served.get(op, 0) + nbytes


def lane_bytes(transport: str, lanes: str, op: str, nbytes: int) -> None:
    """Bytes a transport moved over a set of lanes (UCX: the endpoint's one-sided lanes, e.g.
    ``rc_mlx5/mlx5_0:1`` or ``tcp/eth0``): which NICs and transports really carried the data."""
    key = (transport, lanes, op)
    _lanes[key] = _lanes.get(key, 0) + nbytes


def lanes_snapshot() -> dict[tuple[str, str, str], int]:
    """(transport, lanes, op) -> bytes so far (for tests, benches and the dashboard)."""
    return dict(_lanes)


def refused(reason: str) -> None:
    """A peer request refused: out_of_bounds, garbage, version, auth, connections."""
    _refused[reason] = _refused.get(reason, 0) + 1


class _Collector:
    def collect(self):
        b = CounterMetricFamily("mooncake_te_bytes", "Payload bytes moved by this process's transfer engines",
                                labels=["transport", "op"])
        o = CounterMetricFamily("mooncake_te_requests", "Transfer requests completed", labels=["transport", "op"])
        e = CounterMetricFamily("mooncake_te_errors", "Transfer requests failed", labels=["transport", "op"])
        h = HistogramMetricFamily("mooncake_te_batch_seconds", "Wall time of one sync/async batch",
                                  labels=["transport", "op"])
        for (t, op), s in sorted(_stats.items()):
            b.add_metric([t, op], s.bytes)
            o.add_metric([t, op], s.ok)
            e.add_metric([t, op], s.errors)
            acc, cum = 0, []
            for bound, n in zip(list(BUCKETS) + [float("inf")], s.buckets):
                acc += n
                cum.append(("+Inf" if bound == float("inf") else repr(bound), acc))
            h.add_metric([t, op], cum, s.sum)
        yield from (b, o, e, h)
        sv = CounterMetricFamily("mooncake_te_served_bytes", "Payload bytes served to peers on the rpc port",
                                 labels=["op"])
        for op, n in sorted(_served.items()):
            sv.add_metric([op], n)
        yield sv
        rf = CounterMetricFamily("mooncake_te_refused",
                                 "Peer requests refused (out_of_bounds, garbage, version, auth, connections)",
                                 labels=["reason"])
        for reason, n in sorted(_refused.items()):
            rf.add_metric([reason], n)
        yield rf
        ln = CounterMetricFamily("mooncake_te_lane_bytes",
                                 "Payload bytes per transport and the lanes (NIC/transport) that carried them",
                                 labels=["transport", "lanes", "op"])
        for (t, lanes, op), n in sorted(_lanes.items()):
            ln.add_metric([t, lanes, op], n)
        yield ln


REGISTRY.register(_Collector())

_started: set[int] = set()


def serve_metrics(port: int, host: str = "127.0.0.1") -> None:
    """Start the /metrics HTTP endpoint once per port in this process."""
    with _lock:
        if port in _started:
            return
        start_http_server(port, addr=host)
        _started.add(port)
        log.info("metrics served", extra={"port": port, "host": host})
