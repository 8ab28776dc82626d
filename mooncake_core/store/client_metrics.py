"""The Prometheus counters of one store client (its own registry: several clients in one
process do not mix their figures)."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["ClientMetrics"]


class ClientMetrics:
    """Operations by result, payload bytes and latency per operation."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self._ops = Counter("mooncake_store_client_ops", "Store client operations", ["op", "result"],
                            registry=self.registry)
        self._bytes = Counter("mooncake_store_client_bytes", "Payload bytes moved", ["op"], registry=self.registry)
        self._latency = Histogram("mooncake_store_client_latency_seconds", "Operation latency", ["op"],
                                  registry=self.registry)
        self._children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}

    def count(self, op: str, rc: int, nbytes: int = 0, t0: float | None = None) -> None:
        """One operation ``op`` that ended with ``rc`` (< 0: an error code), moved ``nbytes``
        and began at ``t0`` (``time.perf_counter``; None: no latency)."""
        # the labelled children are looked up once per (op, result): ``labels()`` costs a few
        # microseconds (argument checks, a lock, a dict), a share of every single put and get
        result = "ok" if rc >= 0 else str(rc)
        ch = self._children.get((op, result))
        if ch is None:
            ch = self._children[(op, result)] = (self._ops.labels(op, result), self._bytes.labels(op),
                                                  self._latency.labels(op))
        ch[0].inc()
        if nbytes:
            ch[1].inc(nbytes)
        if t0 is not None:
            ch[2].observe(time.perf_counter() - t0)
