"""Rates, ratios and percentiles over a sliding time window (pure: no I/O, no clock).

The dashboards poll once a second; each poll adds one ``Sample`` (the service's counters and
histograms at that moment, as Prometheus exports them) and asks the window for "puts per
second over the last 5 s" or "TTFT p99 over the last minute". Deriving every figure from the
exported counters -- not from private bookkeeping -- keeps the page and a Grafana board
built on ``rate()`` / ``histogram_quantile()`` telling the same story.

Time is passed in by the caller (monotonic seconds), so tests drive it without sleeping.
A counter that goes *down* between two samples means the process restarted: the later value
is then taken as the increase (what Prometheus' ``rate()`` does with resets).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

#: labels of one series, sorted: (("method", "put_start"),)
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Histogram:
    """One histogram series: upper bounds (finite, increasing) and per-bucket counts, the last
    count being the ``+Inf`` bucket (so ``len(counts) == len(bounds) + 1``)."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.counts) != len(self.bounds) + 1:
            raise ValueError(f"histogram: {len(self.bounds)} bounds need {len(self.bounds) + 1} counts "
                             f"(the last for +Inf), got {len(self.counts)}")

    @classmethod
    def from_cumulative(cls, buckets: Sequence[tuple[float, float]]) -> "Histogram":
        """From Prometheus ``_bucket`` samples: (le, cumulative count), ``le`` may be inf."""
        pts = sorted(buckets)
        bounds: list[float] = []
        counts: list[float] = []
        prev = 0.0
        for le, cum in pts:
            counts.append(max(0.0, cum - prev))
            prev = cum
            if not math.isinf(le):
                bounds.append(le)
        if not pts or not math.isinf(pts[-1][0]):
            counts.append(0.0)  # no +Inf bucket given: nothing above the last bound
        return cls(tuple(bounds), tuple(counts))

    @property
    def total(self) -> float:
        return float(sum(self.counts))

    def minus(self, older: "Histogram | None") -> "Histogram":
        """Observations between ``older`` and this one (a reset or new layout: all of this one)."""
        if older is None or older.bounds != self.bounds:
            return self
        diff = tuple(a - b for a, b in zip(self.counts, older.counts))
        if any(d < 0 for d in diff):
            return self
        return Histogram(self.bounds, diff)

    def plus(self, other: "Histogram") -> "Histogram":
        if other.bounds != self.bounds:
            raise ValueError("histogram: cannot add histograms with different bucket bounds")
        return Histogram(self.bounds, tuple(a + b for a, b in zip(self.counts, other.counts)))


def quantile(h: Histogram, q: float) -> float | None:
    """The ``q`` quantile (0..1) by linear interpolation inside the bucket holding it, as
    Prometheus' ``histogram_quantile``: None without observations; a quantile that falls in the
    ``+Inf`` bucket is reported as the largest finite bound (the most the buckets can say)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile: q must be in [0, 1], got {q!r}")
    total = h.total
    if total <= 0:
        return None
    rank = q * total
    cum = 0.0
    for i, c in enumerate(h.counts):
        if c > 0 and cum + c >= rank:
            if i >= len(h.bounds):
                return h.bounds[-1] if h.bounds else None
            lo = h.bounds[i - 1] if i > 0 else 0.0
            hi = h.bounds[i]
            return lo + (hi - lo) * max(0.0, rank - cum) / c
        cum += c
    return h.bounds[-1] if h.bounds else None


@dataclass
class Sample:
    """What a service exports at one moment: counters (and gauges) and histograms, each
    metric name mapping its label sets to a value."""

    t: float
    counters: dict[str, dict[Labels, float]] = field(default_factory=dict)
    histograms: dict[str, dict[Labels, Histogram]] = field(default_factory=dict)

    def value(self, name: str, where: Mapping[str, str] | None = None) -> float:
        """Sum of the series of ``name`` whose labels include ``where`` (0 when none)."""
        return sum(v for lb, v in self.counters.get(name, {}).items() if _matches(lb, where))

    def by(self, name: str, label: str, where: Mapping[str, str] | None = None) -> dict[str, float]:
        """``name`` summed per value of ``label``."""
        out: dict[str, float] = {}
        for lb, v in self.counters.get(name, {}).items():
            if _matches(lb, where):
                key = dict(lb).get(label, "")
                out[key] = out.get(key, 0.0) + v
        return out

    def histogram(self, name: str, where: Mapping[str, str] | None = None) -> Histogram | None:
        """The series of ``name`` matching ``where``, added up (None when there is none)."""
        acc: Histogram | None = None
        for lb, h in self.histograms.get(name, {}).items():
            if _matches(lb, where):
                acc = h if acc is None else acc.plus(h)
        return acc

    def label_values(self, name: str, label: str) -> list[str]:
        seen = {dict(lb).get(label, "") for lb in self.counters.get(name, {})}
        seen |= {dict(lb).get(label, "") for lb in self.histograms.get(name, {})}
        return sorted(seen)


def _matches(labels: Labels, where: Mapping[str, str] | None) -> bool:
    if not where:
        return True
    d = dict(labels)
    return all(d.get(k) == v for k, v in where.items())


def _increase(new: float, old: float) -> float:
    return new if new < old else new - old


class Window:
    """The last ``span_s`` seconds of samples (oldest dropped), answering questions about them.

    ``add`` ignores a sample less than ``min_step_s`` after the previous one, so several
    browsers polling the same service do not shrink the window's time resolution.
    """

    def __init__(self, span_s: float = 60.0, min_step_s: float = 0.5) -> None:
        if span_s <= 0:
            raise ValueError(f"Window: span_s must be > 0, got {span_s!r}")
        self.span_s = span_s
        self.min_step_s = min_step_s
        self._samples: deque[Sample] = deque()

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def latest(self) -> Sample | None:
        return self._samples[-1] if self._samples else None

    def add(self, s: Sample) -> bool:
        """Keep ``s`` (True) unless it comes too soon after the last one or goes back in time."""
        if self._samples and s.t - self._samples[-1].t < self.min_step_s:
            return False
        self._samples.append(s)
        while len(self._samples) > 2 and self._samples[0].t < s.t - self.span_s:
            self._samples.popleft()
        return True

    def _pair(self, over_s: float | None) -> tuple[Sample, Sample] | None:
        """(oldest sample within ``over_s`` of the newest, newest); None with fewer than two."""
        if len(self._samples) < 2:
            return None
        new = self._samples[-1]
        if over_s is None:
            return self._samples[0], new
        ts = [x.t for x in self._samples]
        i = bisect.bisect_left(ts, new.t - over_s)
        i = min(i, len(ts) - 2)
        return self._samples[i], new

    def rate(self, name: str, where: Mapping[str, str] | None = None, over_s: float | None = 5.0) -> float | None:
        """Per-second increase of counter ``name`` (summed over matching series)."""
        pair = self._pair(over_s)
        if pair is None:
            return None
        old, new = pair
        dt = new.t - old.t
        if dt <= 0:
            return None
        return _increase(new.value(name, where), old.value(name, where)) / dt

    def rates_by(self, name: str, label: str, where: Mapping[str, str] | None = None,
                 over_s: float | None = 5.0) -> dict[str, float]:
        """Per-second increase of ``name`` per value of ``label``."""
        pair = self._pair(over_s)
        if pair is None:
            return {}
        old, new = pair
        dt = new.t - old.t
        if dt <= 0:
            return {}
        before = old.by(name, label, where)
        return {k: _increase(v, before.get(k, 0.0)) / dt for k, v in new.by(name, label, where).items()}

    def ratio(self, num: str, den: Iterable[str], where: Mapping[str, str] | None = None,
              over_s: float | None = None) -> float | None:
        """increase(num) / sum(increase(den...)) over the window, e.g. hits / (hits + misses);
        None when the denominator did not move. With one sample: the totals so far."""
        dens = list(den)
        if len(self._samples) == 1:
            s = self._samples[0]
            d = sum(s.value(n, where) for n in dens)
            return s.value(num, where) / d if d > 0 else None
        pair = self._pair(over_s)
        if pair is None:
            return None
        old, new = pair
        d = sum(_increase(new.value(n, where), old.value(n, where)) for n in dens)
        if d <= 0:
            return None
        return _increase(new.value(num, where), old.value(num, where)) / d

    def quantiles(self, name: str, qs: Sequence[float] = (0.5, 0.9, 0.99),
                  where: Mapping[str, str] | None = None, over_s: float | None = 60.0) -> dict[str, float | None]:
        """Percentiles of histogram ``name`` for the observations made within the window,
        keyed "p50", "p90", "p99"; None where nothing was observed."""
        pair = self._pair(over_s)
        keys = [f"p{q * 100:g}" for q in qs]
        if pair is None:
            return dict.fromkeys(keys)
        old, new = pair
        hn = new.histogram(name, where)
        if hn is None:
            return dict.fromkeys(keys)
        h = hn.minus(old.histogram(name, where))
        return {k: quantile(h, q) for k, q in zip(keys, qs)}

    def count(self, name: str, where: Mapping[str, str] | None = None, over_s: float | None = 60.0) -> float:
        """Observations of histogram ``name`` within the window."""
        pair = self._pair(over_s)
        if pair is None:
            return 0.0
        old, new = pair
        hn = new.histogram(name, where)
        return 0.0 if hn is None else hn.minus(old.histogram(name, where)).total

    def rate_series(self, names: str | Sequence[str], where: Mapping[str, str] | None = None) -> list[list[float]]:
        """[[t, per-second increase since the previous sample], ...] for a sparkline; several
        names are added up (gets = hits + misses)."""
        group = [names] if isinstance(names, str) else list(names)
        out: list[list[float]] = []
        prev: Sample | None = None
        for s in self._samples:
            if prev is not None and s.t > prev.t:
                inc = sum(_increase(s.value(n, where), prev.value(n, where)) for n in group)
                out.append([round(s.t, 3), inc / (s.t - prev.t)])
            prev = s
        return out

    def quantile_series(self, name: str, q: float, where: Mapping[str, str] | None = None) -> list[list[float]]:
        """[[t, quantile of the observations since the previous sample], ...]; steps without
        observations are left out (a gap, not a zero)."""
        out: list[list[float]] = []
        prev: Sample | None = None
        for s in self._samples:
            if prev is not None:
                hn = s.histogram(name, where)
                if hn is not None:
                    v = quantile(hn.minus(prev.histogram(name, where)), q)
                    if v is not None:
                        out.append([round(s.t, 3), v])
            prev = s
        return out

    def value_series(self, name: str, where: Mapping[str, str] | None = None) -> list[list[float]]:
        """[[t, value], ...] of a gauge (summed over matching series)."""
        return [[round(s.t, 3), s.value(name, where)] for s in self._samples]
