"""Turn Prometheus metric families into a ``window.Sample`` (no I/O: the caller collects them).

Both a service's own ``CollectorRegistry.collect()`` and the families parsed from another
process's ``/metrics`` text (``prometheus_client.parser``) have the same shape, so the master's
page reads its own registry and a Transfer Engine's scrape with the same code.

Counters are keyed by their exported sample name (``mooncake_master_puts_total``), gauges by
their name, histograms by the family name (``mooncake_proxy_ttft_seconds``) -- the names a
Grafana query uses, so the page and the board cannot drift apart.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from mooncake_core.dashboard.window import Histogram, Labels, Sample


def _labels(d: dict[str, str], drop: str = "") -> Labels:
    return tuple(sorted((k, v) for k, v in d.items() if k != drop))


def sample_from_families(t: float, families: Iterable[Any]) -> Sample:
    """A Sample at time ``t`` of every counter, gauge and histogram in ``families``."""
    s = Sample(t)
    for fam in families:
        if fam.type == "histogram":
            buckets: dict[Labels, list[tuple[float, float]]] = {}
            for x in fam.samples:
                if x.name.endswith("_bucket"):
                    le = float(x.labels.get("le", "inf"))
                    buckets.setdefault(_labels(x.labels, "le"), []).append((le, float(x.value)))
                elif x.name.endswith(("_count", "_sum")):
                    s.counters.setdefault(x.name, {})[_labels(x.labels)] = float(x.value)
            s.histograms[fam.name] = {lb: Histogram.from_cumulative(b) for lb, b in buckets.items()}
        elif fam.type in ("counter", "gauge", "untyped"):
            for x in fam.samples:
                if x.name.endswith("_created") or (isinstance(x.value, float) and math.isnan(x.value)):
                    continue
                s.counters.setdefault(x.name, {})[_labels(x.labels)] = float(x.value)
    return s


def sample_from_text(t: float, text: str) -> Sample:
    """A Sample from Prometheus text exposition (a scraped ``/metrics`` body)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sample_from_families(t, text_string_to_metric_families(text))


def metric_names(families: Iterable[Any]) -> set[str]:
    """Every queryable series name the families export (``_total``, ``_bucket``, ... included),
    for checking that a dashboard only asks for what exists."""
    out: set[str] = set()
    for fam in families:
        out.add(fam.name)
        # a labelled family without children yet exports only its HELP/TYPE lines: still a
        # metric of this service (its series appear with the first event)
        out.update(fam.name + sfx for sfx in _SUFFIXES.get(fam.type, ()))
        for x in fam.samples:
            out.add(x.name)
    return out


_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
