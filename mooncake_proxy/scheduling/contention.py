"""How much slower an instance runs while other prefill instances are busy (pure, no clock).

Why: where instances share hardware (the live bench: four vLLM CPU prefills and the decode on two
cores) an instance's speed depends on how many others work at the same time. The per-instance
factors of calibration.py learn the speed an instance *had*. Under a burst every instance becomes
busy at once and runs 2-4x slower than at the admitted load just before, so the whole burst was
admitted on the calmer minute's factors (o2 in BENCHMARKS.md: 9 requests estimated at 0.55-1.6 s
answered in 2.8-3.8 s). The censored head (``Scheduler.prefill_slowdown``) sees it only once a head
is late, after the burst's first second has been let in. This model predicts it from how many
prefill instances are busy, before anything is late.

The model, per side (prefill, decode)::

    log(observed / predicted) = the instance's own factor + slope * x

``x`` is the contention a sample ran under: the time-averaged number of *other* busy prefill
instances over its life (a prefill's own instance is not counted; for a decode stream every busy
prefill is). The caller measures it with ``ClusterState.busy_area``. The slope is the
fixed-effects least-squares fit of that model: each instance's samples centred on their own means
(so an instance that is simply slower does not look like contention, and its factor is not taken
for a slope of 0), the within-instance products pooled over the instances, old samples forgotten
by ``forget`` per new sample of the same instance, and ``prior_weight`` added to the pooled sum
of squares to hold the slope at 0 until the samples spread over x. Why not a fit of the residuals
against the current factors: the factors absorb the contention of the first samples, and the
residuals then centre on 0 whatever the slope is (seen on the live bench: slope 0.16 where the
instances ran 3-5x slower in a burst). The slope is clamped to ``[0, max_slope]``: more busy
neighbours never make an instance faster. On dedicated hardware (an accelerator per instance) the
ratio does not grow with ``x``, the slope stays near 0, and no estimate changes.

Why a slope over a count (``--prefill-contention count``): it is learned from every sample (a few
dozen in a warm-up), a pairwise matrix needs many per pair. Its limit, and why the proxy's default
is ``--prefill-contention pairs``: where only some instances share hardware, the count averages the
neighbours that slow an instance with those that do not. On the bench (prefills 0 and 2 on one
core, 1 and 3 and the decode on the other) it learned 0-0.3 while a burst on one core ran each
prefill there at 2-4x its estimate. The pairs mode fits instead an :class:`Interference` of the
other instances (prefills, and decodes while they stream) on each prefill (a coefficient per
pair, prefill pairs symmetric: ``LatencyCalibrator.prefill_interference``), which the TTFT check
counts per busy neighbour and ``Scheduler.pair_harm`` uses to keep a new request from slowing one
queued on a neighbour past the SLO.

Where the operator knows which instances share hardware (``--hardware-group``: instances pinned to
one core, or sharing one GPU), :class:`HardwareGroups` replaces both fits by processor sharing
(``--prefill-contention groups``): the structure is declared, not learned, and the slowdown grows
with the busy mates as on a shared core; only one exponent per group is fitted. Why it was tried:
the fits learn from the admitted load's samples, and a 2x burst's contention is larger than any
they saw (runs o1-o5 in BENCHMARKS.md). Measured on that bench it kept fewer admitted requests in
the SLO than the pairs (runs g1-g5 against p1-p4), so ``pairs`` stays the proxy's default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

__all__ = ["ContentionSlope", "HardwareGroups", "Interference", "RecentBusy", "expected_busy_neighbours"]


@dataclass(slots=True)
class _Sums:
    """Forgetting-weighted sums of one instance's samples (n, x, y, x*x, x*y)."""

    n: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def add(self, x: float, y: float, forget: float) -> None:
        self.n = forget * self.n + 1.0
        self.x = forget * self.x + x
        self.y = forget * self.y + y
        self.xx = forget * self.xx + x * x
        self.xy = forget * self.xy + x * y

    def centred(self) -> tuple[float, float]:
        """(sum of (x - mean x)^2, sum of (x - mean x) * (y - mean y))."""
        return self.xx - self.x * self.x / self.n, self.xy - self.x * self.y / self.n


@dataclass(slots=True)
class ContentionSlope:
    """The slope of log(observed/predicted) in the number of busy neighbours ``x`` (module doc)."""

    forget: float = 0.95
    prior_weight: float = 1.0
    max_slope: float = 2.0
    samples: int = 0
    _by: dict[str, _Sums] = field(default_factory=dict)
    _slope: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.forget <= 1:
            raise ValueError(f"ContentionSlope.forget must be in (0, 1], got {self.forget!r}")
        if self.prior_weight <= 0 or self.max_slope < 0:
            raise ValueError(f"ContentionSlope needs prior_weight > 0 and max_slope >= 0, got "
                             f"{self.prior_weight!r}, {self.max_slope!r}")

    @property
    def slope(self) -> float:
        return self._slope

    def observe(self, x: float, log_ratio: float, instance: str = "") -> bool:
        """A sample of ``instance`` ran with ``x`` busy neighbours on average and took
        exp(``log_ratio``) times its profile's estimate. Returns True when the slope moved."""
        if not (math.isfinite(x) and math.isfinite(log_ratio)) or x < 0:
            return False
        self._by.setdefault(instance, _Sums()).add(x, log_ratio, self.forget)
        self.samples += 1
        sxx = sxy = 0.0
        for sums in self._by.values():
            cxx, cxy = sums.centred()
            sxx += cxx
            sxy += cxy
        before = self._slope
        self._slope = min(max(sxy / (sxx + self.prior_weight), 0.0), self.max_slope)
        return self._slope != before

    def forget_instance(self, instance: str) -> None:
        """The instance was removed: its samples no longer count."""
        self._by.pop(instance, None)

    def factor(self, x: float) -> float:
        """The multiplier of an estimate that will run with ``x`` busy neighbours."""
        return math.exp(self._slope * max(0.0, x))


def expected_busy_neighbours(own_s: float, others_busy_s: list[float] | tuple[float, ...]) -> float:
    """The time-averaged number of other instances busy while a request takes ``own_s`` seconds
    from now, each other instance being busy for the next ``others_busy_s[j]`` seconds (its queue):
    sum of min(1, busy_j / own_s). With ``own_s`` <= 0: the count of busy ones."""
    if own_s <= 0:
        return float(sum(1 for b in others_busy_s if b > 0))
    return sum(min(1.0, b / own_s) for b in others_busy_s if b > 0)


@dataclass(slots=True)
class _Fit:
    """One decode instance's ridge regression: column 0 the intercept, then one per prefill."""

    names: list[str] = field(default_factory=list)
    xtx: list[list[float]] = field(default_factory=lambda: [[0.0]])
    xty: list[float] = field(default_factory=lambda: [0.0])
    coef: dict[str, float] = field(default_factory=dict)

    def column(self, name: str) -> int:
        try:
            return self.names.index(name) + 1
        except ValueError:
            self.names.append(name)
            for row in self.xtx:
                row.append(0.0)
            self.xtx.append([0.0] * (len(self.names) + 1))
            self.xty.append(0.0)
            return len(self.names)


class Interference:
    """How much each prefill instance's work slows each decode instance's steps (pure).

    Why a coefficient per (decode, prefill) pair and not the busy count of :class:`ContentionSlope`:
    on the live bench the decode shares a core with some prefills and not others. While a prefill
    on its core computes, its requests' gaps between tokens grow 5-20x (40 ms -> 400-800 ms); a
    prefill on the other core leaves them alone. One slope over "busy prefills" averages the two,
    so the TBT check saw 2.6x where it was 10x -- and the conductor, ranking by first token, kept
    sending prefills to the co-located instance (k5 in BENCHMARKS.md: 9 of the admitted missed
    the TBT SLO there).

    Per decode instance, a ridge regression with forgetting of the decode sample's log ratio
    (observed / predicted step) on the fraction of the stream's time each prefill instance was
    busy, with an intercept (the decode's own speed)::

        log(observed / predicted) = a + sum_p b_p * busy_p

    ``ridge`` pulls each b_p to 0 until the samples show it; a negative b_p is read as 0 (another
    prefill's work never speeds a decode up). On dedicated hardware every b_p stays near 0.

    The same fit, keyed by a *prefill* instance and fed its samples (queue + compute) with the
    other prefills' busy shares and the decodes' streaming shares, learns which instances slow
    which prefill (``LatencyCalibrator.prefill_interference``, ``Scheduler.prefill_interference``):
    on the bench prefills 0 and 2 share one core, 1 and 3 the other with the decode; a burst on
    one core's pair ran each at half speed and less (run m2 in BENCHMARKS.md), and the busy count
    above (which counts all three neighbours alike) learned a slope of 0.
    """

    def __init__(self, forget: float = 0.95, ridge: float = 0.3, max_coef: float = 4.0) -> None:
        if not 0 < forget <= 1 or ridge <= 0 or max_coef < 0:
            raise ValueError(f"Interference needs 0 < forget <= 1, ridge > 0, max_coef >= 0; got {forget!r}, "
                             f"{ridge!r}, {max_coef!r}")
        self.forget = forget
        self.ridge = ridge
        self.max_coef = max_coef
        self._fits: dict[str, _Fit] = {}

    def observe(self, decode_id: str, busy: dict[str, float], log_ratio: float) -> bool:
        """A stream on ``decode_id`` (or a prefill, for the prefill-on-prefill fit) took exp(``log_ratio``)
        times its prediction while each prefill of ``busy`` was busy for that fraction of it. True
        when a coefficient moved."""
        if not math.isfinite(log_ratio) or any(not math.isfinite(v) or v < 0 for v in busy.values()):
            return False
        fit = self._fits.setdefault(decode_id, _Fit())
        x = [0.0] * (len(fit.names) + 1)
        x[0] = 1.0
        for name, v in busy.items():
            i = fit.column(name)
            if i >= len(x):
                x.extend([0.0] * (i + 1 - len(x)))
            x[i] = min(1.0, v)
        n = len(x)
        for i in range(n):
            row = fit.xtx[i]
            for j in range(n):
                row[j] = self.forget * row[j] + x[i] * x[j]
            fit.xty[i] = self.forget * fit.xty[i] + x[i] * log_ratio
        before = fit.coef
        fit.coef = self._solve(fit)
        return fit.coef != before

    def _solve(self, fit: _Fit) -> dict[str, float]:
        n = len(fit.xty)
        a = [[fit.xtx[i][j] + ((self.ridge if i else 1e-9) if i == j else 0.0) for j in range(n)] + [fit.xty[i]]
             for i in range(n)]
        for c in range(n):  # Gaussian elimination, partial pivoting (n is the prefill count + 1)
            p = max(range(c, n), key=lambda r: abs(a[r][c]))
            if abs(a[p][c]) < 1e-12:
                continue
            a[c], a[p] = a[p], a[c]
            for r in range(n):
                if r != c and a[r][c]:
                    k = a[r][c] / a[c][c]
                    a[r] = [vr - k * vc for vr, vc in zip(a[r], a[c])]
        theta = [a[i][n] / a[i][i] if abs(a[i][i]) >= 1e-12 else 0.0 for i in range(n)]
        return {name: min(max(theta[i + 1], 0.0), self.max_coef) for i, name in enumerate(fit.names)
                if theta[i + 1] > 0}

    def coefs(self, decode_id: str) -> dict[str, float]:
        """prefill -> its coefficient on ``decode_id`` (the positive ones; empty before samples)."""
        fit = self._fits.get(decode_id)
        return dict(fit.coef) if fit is not None else {}

    def all_coefs(self) -> dict[str, dict[str, float]]:
        return {d: dict(f.coef) for d, f in self._fits.items()}

    def forget_instance(self, instance_id: str) -> None:
        """A removed decode loses its fit; a removed prefill its coefficients (its column stays, unused)."""
        self._fits.pop(instance_id, None)
        for fit in self._fits.values():
            fit.coef.pop(instance_id, None)


@dataclass(slots=True)
class RecentBusy:
    """Each prefill's share of the recent past it was busy: an exponential moving average with time
    constant ``tau_s`` of the busy times ``ClusterState.busy_times`` reports (pure: the caller gives
    the clock and the readings).

    Why: a decode stream lasts ``max_tokens`` steps after its prefill, and the prefills that slow it
    are those busy *then*. The TBT check used to count the ones busy at admission; under a burst the
    prefills that slow the decode (those sharing its cores) went idle for a moment, the check admitted
    a batch of streams, and the same prefills were busy through all of them (the live bench's overload
    runs: 12 of 16 admitted requests missed the TBT SLO). A prefill busy most of the last seconds is
    expected busy during the stream too.
    """

    tau_s: float = 2.0
    _t: float | None = None
    _last: dict[str, float] = field(default_factory=dict)
    _share: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.tau_s > 0:
            raise ValueError(f"RecentBusy.tau_s must be > 0 seconds, got {self.tau_s!r}")

    def update(self, now: float, busy_times: dict[str, float]) -> dict[str, float]:
        """Advance to ``now`` with the cumulative busy times read then; returns prefill -> share
        in [0, 1]. Idempotent at the same ``now``; a prefill seen for the first time starts at 0."""
        if self._t is not None and now > self._t:
            dt = now - self._t
            keep = math.exp(-dt / self.tau_s)
            for iid, total in busy_times.items():
                frac = min(1.0, max(0.0, (total - self._last.get(iid, total)) / dt))
                self._share[iid] = keep * self._share.get(iid, 0.0) + (1.0 - keep) * frac
        if self._t is None or now >= self._t:
            self._t = now
            self._last = dict(busy_times)
        for gone in [i for i in self._share if i not in busy_times]:
            del self._share[gone]
        return self._share

    def share(self, instance_id: str) -> float:
        """The prefill's recent busy share as of the last :meth:`update` (0.0 if never seen)."""
        return self._share.get(instance_id, 0.0)


class HardwareGroups:
    """Instances that share hardware, as the operator declared them (pure): each group's members
    split it by processor sharing while they are busy.

    Under processor sharing, a job of ``x`` seconds of work (alone) that starts beside jobs of
    ``w_j`` seconds each finishes after ``x + sum_j min(w_j, x)`` seconds (every job runs at
    ``1/n`` of the hardware while ``n`` are busy; exact when nothing else arrives), so its estimate
    is multiplied by ``1 + sum_j min(1, w_j / x)`` (:func:`expected_busy_neighbours`). Measured the
    other way round, a sample that ran while each mate was busy for the share ``b_j`` of its time
    took about ``1 + sum_j b_j`` times its work alone (:meth:`slowdown`): the calibrator divides that
    out, so an instance's factor is its speed alone. Both with the exponent below.

    An instance in no group runs on hardware of its own (multiplier 1); one named in two groups, or
    twice in one, is an error (an instance runs on one piece of hardware).

    Sharing costs more than the ideal: the multiplier is ``(1 + sum of the busy mates' shares) **
    exponent``, the exponent 1 (ideal sharing) until learned per group from the samples
    (:meth:`observe`). Why: on the live bench four vLLM CPU instances on one core ran up to 6x their
    estimates with three mates busy, where ideal sharing says 4x (runs g1-g4 in BENCHMARKS.md): each
    instance's engine core and API server also want the core between steps, and a switch costs caches,
    more so the more instances take turns. The structure (which instances share, growing with the busy
    mates) is declared; one exponent per group is fitted -- not a coefficient per pair.
    """

    def __init__(self, groups: Iterable[Iterable[str]] = (), alpha: float = 0.2, max_exponent: float = 4.0,
                 min_share: float = 0.25) -> None:
        if not 0 < alpha <= 1 or max_exponent < 1 or not 0 < min_share <= 1:
            raise ValueError(f"HardwareGroups needs 0 < alpha <= 1, max_exponent >= 1, 0 < min_share <= 1; got "
                             f"{alpha!r}, {max_exponent!r}, {min_share!r}")
        self.alpha = alpha
        self.max_exponent = max_exponent
        self.min_share = min_share
        #: instance -> its group's key (the sorted members); group key -> its learned exponent
        self._key: dict[str, tuple[str, ...]] = {}
        self._exp: dict[tuple[str, ...], float] = {}
        self._mates: dict[str, frozenset[str]] = {}
        for k, group in enumerate(groups):
            members = list(group)
            if len(members) < 2:
                raise ValueError(f"hardware group {k + 1} ({members!r}) must name at least 2 instances: "
                                 f"an instance alone on its hardware needs no group")
            if len(set(members)) != len(members):
                raise ValueError(f"hardware group {k + 1} names an instance twice: {members!r}")
            for m in members:
                if m in self._mates:
                    raise ValueError(f"instance {m!r} is in two hardware groups (an instance runs on one "
                                     f"piece of hardware)")
                self._mates[m] = frozenset(members) - {m}
                self._key[m] = tuple(sorted(members))

    def __bool__(self) -> bool:
        return bool(self._mates)

    def __contains__(self, instance_id: object) -> bool:
        return instance_id in self._mates

    def mates(self, instance_id: str) -> frozenset[str]:
        """The other instances on ``instance_id``'s hardware (empty: it has its own)."""
        return self._mates.get(instance_id, frozenset())

    def groups(self) -> list[list[str]]:
        """Each group's members, sorted (for logs and the admin API)."""
        seen: set[str] = set()
        out = []
        for m in sorted(self._mates):
            if m not in seen:
                g = sorted(self._mates[m] | {m})
                seen.update(g)
                out.append(g)
        return out

    def exponent(self, instance_id: str) -> float:
        """The exponent of ``instance_id``'s group (1.0: ideal sharing, or nothing learned yet)."""
        key = self._key.get(instance_id)
        return self._exp.get(key, 1.0) if key is not None else 1.0

    def exponents(self) -> dict[str, float]:
        """Each group (its members joined by ',') -> its learned exponent (for the gauges)."""
        return {",".join(k): v for k, v in self._exp.items()}

    def multiplier(self, instance_id: str, mate_share: float) -> float:
        """The multiplier of ``instance_id``'s time alone while its mates are busy for the sum of
        shares ``mate_share``: (1 + mate_share) ** its group's exponent."""
        return float((1.0 + max(0.0, mate_share)) ** self.exponent(instance_id))

    def mate_share(self, instance_id: str, busy: dict[str, float]) -> float:
        """The sum of the busy shares of ``instance_id``'s mates (each in [0, 1]; others do not count)."""
        mates = self.mates(instance_id)
        return sum(min(1.0, max(0.0, v)) for k, v in busy.items() if k in mates and math.isfinite(v))

    def slowdown(self, instance_id: str, busy: dict[str, float]) -> float:
        """How many times its work alone a sample of ``instance_id`` took when each instance of
        ``busy`` was busy for that share of its time (its mates count; the others and the instance
        itself do not): :meth:`multiplier` of its mates' shares."""
        return self.multiplier(instance_id, self.mate_share(instance_id, busy))

    def observe(self, instance_id: str, busy: dict[str, float], ratio_alone: float) -> bool:
        """A sample of ``instance_id`` took ``ratio_alone`` times its estimate alone (its instance factor
        applied) while its mates were busy for the shares ``busy``: moves its group's exponent towards
        log(ratio_alone) / log(1 + their sum), by ``alpha``, where that sum is at least ``min_share`` (a
        sample that ran nearly alone says nothing about sharing). True when the exponent moved."""
        key = self._key.get(instance_id)
        x = self.mate_share(instance_id, busy)
        if key is None or x < self.min_share or not math.isfinite(ratio_alone) or ratio_alone <= 0:
            return False
        sample = min(max(math.log(ratio_alone) / math.log1p(x), 0.0), self.max_exponent)
        before = self._exp.get(key, 1.0)
        self._exp[key] = (1 - self.alpha) * before + self.alpha * sample
        return self._exp[key] != before

    def forget(self, instance_id: str) -> None:
        """The instance was removed: it no longer shares anyone's hardware."""
        if self._mates.pop(instance_id, None) is not None:
            self._key.pop(instance_id, None)
            for k in list(self._mates):
                self._mates[k] = self._mates[k] - {instance_id}
                if not self._mates[k]:
                    del self._mates[k]
