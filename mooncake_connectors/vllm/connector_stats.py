"""Our connectors' figures in vLLM's KV connector stats classes and its Prometheus ``/metrics``.

Targets ``vllm/distributed/kv_transfer/kv_connector/v1/metrics.py`` of vLLM 0.32.0
(``KVConnectorStats``, ``KVConnectorPromMetrics``): the connector returns a
``MooncakeCoreKVConnectorStats`` from ``get_kv_connector_stats`` (worker and scheduler side),
vLLM rebuilds it in the API server with ``build_kv_connector_stats`` and feeds it to the
``KVConnectorPromMetrics`` that ``build_prom_metrics`` returned -- so the series appear on the
vLLM server's own ``/metrics`` (labels ``model_name``, ``engine``) next to vLLM's, and in its
periodic ``KV Transfer metrics:`` log line. Nothing else to scrape. The dict and its arithmetic
are pure (``stats.py``); this module only names the Prometheus series.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (KVConnectorPromMetrics, KVConnectorStats,
                                                                   PromMetric, PromMetricT)
from vllm.v1.metrics.utils import create_metric_per_engine

from mooncake_connectors.vllm import stats as S

if TYPE_CHECKING:
    from vllm.config import VllmConfig

PREFIX = "vllm:mooncake_core_"
#: latency buckets (s): a small read over cross-memory attach is ~0.3 ms, a large tcp one seconds
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
HOLD_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass
class MooncakeCoreKVConnectorStats(KVConnectorStats):
    """``stats.py``'s dict as vLLM's stats object (serializable: vLLM sends ``to_dict()``)."""

    def __post_init__(self) -> None:
        self.data: dict[str, Any] = S.check(self.data) if self.data else S.empty()

    def reset(self) -> None:
        self.data = S.empty()

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        S.merge(self.data, other.data)
        return self

    def reduce(self) -> dict[str, int | float]:
        return S.summarize(self.data)

    def is_empty(self) -> bool:
        return S.is_empty(self.data)


def stats_or_none(rec: S.StatsRecorder) -> MooncakeCoreKVConnectorStats | None:
    """What ``get_kv_connector_stats`` returns: this interval's figures, None when there are none
    (an empty stats object would make vLLM ship a non-empty connector output every step)."""
    data = rec.take()
    return MooncakeCoreKVConnectorStats(data=data) if data is not None else None


#: count name -> (Prometheus counter name without prefix, documentation)
Counters = dict[str, tuple[str, str]]
#: time name -> (histogram name without prefix, documentation, buckets)
Histograms = dict[str, tuple[str, str, tuple[float, ...]]]

P2P_COUNTERS: Counters = {
    S.PULLED_BYTES: ("kv_pulled_bytes", "KV bytes this decode read from prefill instances."),
    S.PULLED_BLOCKS: ("kv_pulled_blocks", "KV blocks this decode read from prefill instances."),
    S.LEASES_EXPIRED: ("kv_leases_expired", "Requests whose KV blocks this prefill freed when the lease "
                                            "expired, without a decode's confirmation."),
    # scheduler side
    S.REMOTE_REQUESTS: ("kv_remote_requests", "Requests this decode's scheduler set to load their KV from a "
                                              "prefill."),
    S.REMOTE_BLOCKS: ("kv_remote_blocks", "KV blocks this decode's scheduler allocated for loads from prefills."),
    S.REMOTE_LOCAL_HITS: ("kv_remote_local_hits", "Requests with a remote prefill that this decode had fully "
                                                  "cached (the prefill was released, nothing read)."),
    S.HANDOFF_REQUESTS: ("kv_handoff_requests", "Finished requests whose KV blocks this prefill's scheduler held "
                                                "for a decode."),
    S.HANDOFF_BLOCKS: ("kv_handoff_blocks", "KV blocks this prefill's scheduler held for decodes."),
}
P2P_HISTOGRAMS: Histograms = {
    S.PULL_SECONDS: ("kv_pull_seconds", "Time to read one request's KV from the prefill (decode side).",
                     SECONDS_BUCKETS),
    S.HOLD_SECONDS: ("kv_hold_seconds", "Time a prefill held a finished request's KV blocks until the decode "
                                        "released them.", HOLD_BUCKETS),
    S.REMOTE_WAIT_SECONDS: ("kv_remote_wait_seconds", "Time a decode request waited for its KV (scheduler view: "
                                                      "blocks allocated until the worker reported them received).",
                            HOLD_BUCKETS),
}
STORE_COUNTERS: Counters = {
    S.LOOKUP_HIT_BLOCKS: ("store_hit_blocks", "KV blocks found in the Mooncake Store (leading prefix) by "
                                              "the scheduler's lookups."),
    S.LOOKUP_MISS_BLOCKS: ("store_miss_blocks", "KV blocks looked up in the Mooncake Store and not found."),
    S.LOADED_BYTES: ("store_loaded_bytes", "KV bytes loaded from the Mooncake Store."),
    S.LOADED_BLOCKS: ("store_loaded_blocks", "KV blocks loaded from the Mooncake Store."),
    S.SAVED_BYTES: ("store_saved_bytes", "KV bytes saved to the Mooncake Store."),
    S.SAVED_BLOCKS: ("store_saved_blocks", "KV blocks saved to the Mooncake Store (already stored ones "
                                           "are skipped, not counted)."),
}
STORE_HISTOGRAMS: Histograms = {
    S.LOAD_SECONDS: ("store_load_seconds", "Time to load one step's KV blocks from the Mooncake Store.",
                     SECONDS_BUCKETS),
    S.SAVE_SECONDS: ("store_save_seconds", "Time to save one request's KV blocks to the Mooncake Store.",
                     SECONDS_BUCKETS),
}


@dataclass(frozen=True)
class PromSpec:
    """One connector's series: counters, histograms and a failure counter labelled ``reason``."""

    counters: Counters
    histograms: Histograms
    failures: tuple[str, ...]
    failures_name: str
    failures_doc: str


P2P_PROM = PromSpec(P2P_COUNTERS, P2P_HISTOGRAMS, S.P2P_FAILURES, "kv_failed_pulls",
                    "Requests whose KV this decode could not read from the prefill, by reason (start: the read "
                    "could not start; read: the transfer failed; lease: the lease expired during the read; "
                    "no_ready / bad_ready / unreachable: concurrent hand-off).")
STORE_PROM = PromSpec(STORE_COUNTERS, STORE_HISTOGRAMS, S.STORE_FAILURES, "store_failed_blocks",
                      "KV blocks the Mooncake Store could not load or save, by reason.")


class MooncakeCorePromMetrics(KVConnectorPromMetrics):
    """Counters and histograms of one connector, one child per engine, created at start (so every
    series is exported, at 0, before the first transfer: Grafana's rates work from the start)."""

    def __init__(self, vllm_config: "VllmConfig", metric_types: dict[type[PromMetric], type[PromMetricT]],
                 labelnames: list[str], per_engine_labelvalues: dict[int, list[object]], spec: PromSpec):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {k: create_metric_per_engine(
            self._counter_cls(name=PREFIX + n, documentation=d, labelnames=labelnames), per_engine_labelvalues)
            for k, (n, d) in spec.counters.items()}
        self._histograms = {k: create_metric_per_engine(
            self._histogram_cls(name=PREFIX + n, documentation=d, buckets=list(b), labelnames=labelnames),
            per_engine_labelvalues) for k, (n, d, b) in spec.histograms.items()}
        failed = self._counter_cls(name=PREFIX + spec.failures_name, documentation=spec.failures_doc,
                                   labelnames=[*labelnames, "reason"])
        self._failures = {S.failure(r): {idx: failed.labels(*lv, r) for idx, lv in per_engine_labelvalues.items()}
                          for r in spec.failures}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        data = S.check(transfer_stats_data)
        for k, v in data[S.COUNTS].items():
            target = self._counters.get(k) or self._failures.get(k)
            if target is not None and v:
                target[engine_idx].inc(v)
        for k, xs in data[S.TIMES].items():
            h = self._histograms.get(k)
            if h is not None:
                for x in xs:
                    h[engine_idx].observe(x)


class StatsHook:
    """vLLM's three stats-hook methods for a connector (listed before ``KVConnectorBase_V1`` in its
    bases): ``stats_recorder`` says where this side records (None: it records nothing), the class
    names its series in ``PROM``."""

    PROM: PromSpec

    def stats_recorder(self) -> S.StatsRecorder | None:
        raise NotImplementedError

    def get_kv_connector_stats(self) -> MooncakeCoreKVConnectorStats | None:
        rec = self.stats_recorder()
        return stats_or_none(rec) if rec is not None else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> MooncakeCoreKVConnectorStats:
        return MooncakeCoreKVConnectorStats(data=data or {})

    @classmethod
    def build_prom_metrics(cls, vllm_config: "VllmConfig", metric_types: dict[type[PromMetric], type[PromMetricT]],
                           labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]
                           ) -> MooncakeCorePromMetrics:
        return MooncakeCorePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues, cls.PROM)
