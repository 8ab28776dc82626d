"""Online correction of the cost model from the latencies the proxy observes (pure, no clock).

Why: a profile is measured once, on an idle instance (``fit_profile``, or the bench's start-up
fit), but the engines then run next to each other and to other work. On the 2-core box of
``bench/scheduling/bench_live_scheduling.py`` a 0.3 s prefill took seconds under load: a scheduler whose
TTFT estimates are 10x too low admits everything, so SLO-based early rejection never fires.
The calibrator keeps one multiplicative factor per side (prefill, decode): an exponentially
weighted mean of log(observed / predicted-by-the-profile), so one outlier moves it by at most
``alpha`` of its log-ratio, and the factor is clamped to ``[lo, hi]``.

A third, additive estimate: per decode instance, the delay from a prefill's end to that
instance's first token (``observe_first_token``: the KV pull, the decode's queue, its first step).
The profile has no term for it, yet on a contended box it can be most of the client's TTFT; the
proxy stores it in ``DecodeLoad.first_token_s`` (and its gauge). A moving mean of past delays
comes too late under a burst (everything is admitted before the first slow hand-off reports), so
the live proxy's TTFT check uses the hand-off queue instead (``handoff_queue.py``,
``DecodeLoad.handoff``); the flat value is what the check adds where no queue is installed.
What neither models (per pair: ``ttft_error.py``) the check adds as a margin from its own errors.

A factor nobody confirms fades: once a side has had no sample for ``stale_s`` seconds,
:meth:`tick` halves its log-factor every ``half_life_s`` -- otherwise a factor learned in a burst,
high enough that every request is rejected, would never see the admitted request that corrects it.

Per instance, too: a sample that names its ``instance`` also moves that instance's own factor,
and the scheduler estimates each instance with :meth:`cost_for` (its own factors). Why: on the live
bench one prefill's vLLM process froze for 35 s; with one factor per side its samples raised the
prefill factor of *every* instance to 17x and every request got a 429, although the other prefill
served in the SLO. Now those samples slow down only the frozen instance's estimates, and the
scheduler sends the load to the healthy one. An instance's factor rests on its own samples only
once it has ``prior_samples`` of them; before that it is pulled towards the side's prior, in
proportion: ``log f = prior + min(1, n / prior_samples) * (own - prior)``. The fade brings an
unconfirmed instance factor back to the prior (same ``stale_s`` / ``half_life_s``), so an
instance that was avoided after a freeze is tried again.

The prior is the lowest of the shared factor (the per-side one above, from every instance's
samples) and the factors of the instances confirmed by ``prior_samples`` of their own. Why not the
shared factor alone: after a freeze it holds the frozen instance's samples (10-20x on the live
bench) for tens of seconds, and a new instance, or the frozen one faded back, borrowed that
inflation -- estimated 10x slow, it got no traffic and so no sample to correct it. Optimism is the
cheaper error: an instance estimated as fast as the best healthy one gets a request and learns its
own factor from it within ``prior_samples`` answers.

Contention, too (contention.py): a prefill sample that says how many other prefill instances were
busy during it (``contention``) goes into the :class:`ContentionSlope` (a fixed-effects fit over
the instances' samples), and a decode sample that says how long each prefill was busy during it
(``prefill_busy``) into the :class:`Interference` fit of its decode; a prefill sample that says
instead how long each *other* instance (prefill, or decode while streaming) was busy during it
(``busy``) goes into a second :class:`Interference` fit, of those instances on that prefill
(:meth:`prefill_interference`: which instances share hardware with which). The factors learn from
the sample with that contention taken out -- as do samples of instances declared to share hardware
(``groups``, contention.HardwareGroups: processor sharing, one exponent per group) -- so an instance's factor
is its speed with nobody else busy, and the scheduler multiplies its estimates by what it predicts
(:meth:`contention_factor`, :meth:`interference`). Without them a sample moves the factors as before
and nothing is learned.

The proxy feeds it (``observe_prefill`` when a prefill answers, ``observe_decode`` when a
decode stream ends) with the *unscaled* prediction (the scheduler's estimate divided by the
factor in force when it was made, :meth:`factor` of that instance), and installs :meth:`cost`
as the scheduler's model and :meth:`costs` as its per-instance models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .contention import ContentionSlope, HardwareGroups, Interference
from .cost import CostModel

__all__ = ["LatencyCalibrator"]


@dataclass(slots=True)
class _Ewma:
    log_factor: float = 0.0
    samples: int = 0
    last_sample: float = 0.0
    last_decay: float = 0.0


@dataclass(slots=True)
class LatencyCalibrator:
    """Per-side factors observed/predicted; ``cost()`` is ``base`` with them applied.

    ``alpha``: weight of a new sample (0 < alpha <= 1). ``lo``/``hi``: bounds of a factor.
    ``min_predicted_s``: samples predicted shorter than this are ignored (their ratio is noise).
    ``prior_samples``: samples an instance needs before its factor is its own (see module doc).
    """

    base: CostModel
    alpha: float = 0.2
    lo: float = 0.1
    hi: float = 100.0
    min_predicted_s: float = 1e-3
    stale_s: float = 10.0
    half_life_s: float = 10.0
    prior_samples: int = 3
    _sides: dict[str, _Ewma] = field(default_factory=lambda: {"prefill": _Ewma(), "decode": _Ewma()})
    #: (side, instance) -> that instance's own EWMA of the log ratio
    _inst: dict[tuple[str, str], _Ewma] = field(default_factory=dict)
    #: decode instance -> EWMA of the first-token delay, in log_factor (seconds, not a log here)
    _first: dict[str, _Ewma] = field(default_factory=dict)
    #: the prefill side's slope of its log ratio in the busy neighbours (contention.py)
    _slope: ContentionSlope = field(default_factory=ContentionSlope)
    #: how much each prefill's work slows each decode's steps (contention.py)
    _interference: Interference = field(default_factory=Interference)
    #: how much each prefill's work slows each other prefill (contention.py; samples with ``busy``)
    _pairs: Interference = field(default_factory=Interference)
    #: instances the operator declared to share hardware (``--hardware-group``): their prefill samples
    #: have the processor sharing of their busy mates divided out instead of going into ``_pairs``
    groups: HardwareGroups = field(default_factory=HardwareGroups)
    _cost: CostModel | None = None
    #: instance -> its cost model (cached; dropped whenever a factor moves)
    _costs: dict[str, CostModel] | None = None

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"LatencyCalibrator.alpha must be in (0, 1], got {self.alpha!r}")
        if not 0 < self.lo <= 1 <= self.hi:
            raise ValueError(f"LatencyCalibrator needs 0 < lo <= 1 <= hi, got lo={self.lo!r} hi={self.hi!r}")
        if not (self.stale_s >= 0 and self.half_life_s > 0):
            raise ValueError(f"LatencyCalibrator needs stale_s >= 0 and half_life_s > 0, got "
                             f"{self.stale_s!r}, {self.half_life_s!r}")
        if self.prior_samples < 1:
            raise ValueError(f"LatencyCalibrator.prior_samples must be >= 1, got {self.prior_samples!r}")

    def factor(self, side: str, instance: str | None = None) -> float:
        """Current shared factor of ``side`` ('prefill' or 'decode'); 1.0 before any sample. With
        ``instance``: that instance's factor (the side's :meth:`prior` until it has samples of its own)."""
        return math.exp(self._log_factor(side, instance))

    def samples(self, side: str, instance: str | None = None) -> int:
        if instance is None:
            return self._side(side).samples
        self._side(side)
        s = self._inst.get((side, instance))
        return s.samples if s is not None else 0

    def instance_factors(self) -> dict[tuple[str, str], float]:
        """(side, instance) -> factor, for every instance with a sample of its own (the gauges)."""
        return {k: self.factor(*k) for k in self._inst}

    def observe_prefill(self, predicted_s: float, observed_s: float, now: float = 0.0,
                        instance: str | None = None, contention: float | None = None,
                        busy: dict[str, float] | None = None) -> bool:
        """A prefill (queue + compute, as predicted at scheduling time) took ``observed_s`` on
        ``instance``; ``now`` is the caller's clock; ``contention``: the mean number of other busy
        prefill instances meanwhile, or ``busy``: the share of that time each prefill instance was
        busy (``instance``'s own share is ignored) -- pass one of the two (module doc). Returns True
        when a factor, the slope or a pair coefficient changed (then install :meth:`cost`,
        :meth:`costs`, :meth:`slope` and :meth:`prefill_interference`)."""
        if busy is not None and instance is not None:
            busy = {p: v for p, v in busy.items() if p != instance}
        return self._observe("prefill", predicted_s, observed_s, now, instance, contention, busy)

    def observe_decode(self, predicted_tbt_s: float, observed_tbt_s: float, now: float = 0.0,
                       instance: str | None = None, prefill_busy: dict[str, float] | None = None) -> bool:
        """A decode stream's time between tokens on ``instance`` was ``observed_tbt_s``;
        ``prefill_busy``: the share of the stream's time each prefill instance was busy (what
        slowed it: :meth:`interference`)."""
        return self._observe("decode", predicted_tbt_s, observed_tbt_s, now, instance, busy=prefill_busy)

    def slope(self, side: str) -> float:
        """The learned log-slowdown per busy neighbour of ``side`` (0.0 until contention samples
        show one; contention.py). The decode side has none: it has :meth:`interference`."""
        self._side(side)
        return self._slope.slope if side == "prefill" else 0.0

    def contention_factor(self, side: str, busy_neighbours: float) -> float:
        """The multiplier of ``side``'s estimates for a request that runs with ``busy_neighbours``."""
        self._side(side)
        return self._slope.factor(busy_neighbours) if side == "prefill" else 1.0

    def interference(self) -> dict[str, dict[str, float]]:
        """decode instance -> {prefill instance: log slowdown of its steps while that prefill is busy}."""
        return self._interference.all_coefs()

    def prefill_interference(self) -> dict[str, dict[str, float]]:
        """prefill instance -> {other prefill instance: log slowdown of its work while that one is busy},
        symmetric: the larger of the pair's two fits. Why: sharing hardware is mutual, but a fit can
        only see it where the instance also ran without its mate -- one that the policy always ran
        beside it (on the bench the conductor, ranking by first token, did) reads the mate's share
        as its own slowness, its factor takes it, and its coefficient stays 0."""
        fits = self._pairs.all_coefs()
        out: dict[str, dict[str, float]] = {}
        for a, coefs in fits.items():
            for b, c in coefs.items():
                c = max(c, fits.get(b, {}).get(a, 0.0))
                out.setdefault(a, {})[b] = c
                if b in fits:  # a prefill (a decode column has no fit of its own: it is not mirrored)
                    out.setdefault(b, {})[a] = c
        return out

    def observe_first_token(self, decode_id: str, seconds: float, now: float = 0.0) -> bool:
        """Decode ``decode_id`` gave its first token ``seconds`` after the prefill answered."""
        if not math.isfinite(seconds) or seconds < 0:
            return False
        s = self._first.setdefault(decode_id, _Ewma())
        s.log_factor = seconds if s.samples == 0 else (1 - self.alpha) * s.log_factor + self.alpha * seconds
        s.samples += 1
        s.last_sample = s.last_decay = now
        return True

    def first_token(self, decode_id: str) -> float:
        """Current first-token delay estimate of ``decode_id`` (0.0 before any sample)."""
        s = self._first.get(decode_id)
        return s.log_factor if s is not None else 0.0

    def first_token_all(self) -> dict[str, float]:
        return {k: s.log_factor for k, s in self._first.items()}

    def forget(self, instance: str) -> None:
        """The instance was removed: drop its factors and its first-token delay."""
        self._first.pop(instance, None)
        self._slope.forget_instance(instance)
        self._interference.forget_instance(instance)
        self._pairs.forget_instance(instance)
        for side in self._sides:
            if self._inst.pop((side, instance), None) is not None:
                self._costs = None

    def tick(self, now: float) -> bool:
        """Fade factors and first-token delays without a sample for ``stale_s`` (see module doc):
        the shared factors and first-token delays towards 1.0 / 0 s, instance factors towards the
        prior of their side. True when one moved."""
        changed = False
        for s in (*self._sides.values(), *self._first.values()):
            changed |= self._fade(s, 0.0, now)
        priors = {side: self._prior(side) for side in self._sides}
        for (side, _), s in self._inst.items():
            changed |= self._fade(s, priors[side], now)
        if changed:
            self._cost = None
            self._costs = None
        return changed

    def cost(self) -> CostModel:
        """``base`` with the prefill coefficients (c*) and decode coefficients (d*) multiplied by
        their sides' priors (module doc): the model of an instance without samples of its own.
        Transfer times are left as measured (the network is not the contended part)."""
        if self._cost is None:
            self._cost = self._scaled(math.exp(self._prior("prefill")), math.exp(self._prior("decode")))
        return self._cost

    def cost_for(self, instance: str) -> CostModel:
        """:meth:`cost` with ``instance``'s own factors (the shared model for an unknown instance)."""
        return self.costs().get(instance) or self.cost()

    def costs(self) -> dict[str, CostModel]:
        """instance -> its cost model, for every instance with samples of its own (the scheduler's
        ``instance_costs``; the others use :meth:`cost`)."""
        if self._costs is None:
            names = {iid for _, iid in self._inst}
            self._costs = {iid: self._scaled(self.factor("prefill", iid), self.factor("decode", iid))
                           for iid in sorted(names)}
        return self._costs

    def _scaled(self, fp: float, fd: float) -> CostModel:
        b = self.base
        return replace(b, c0=b.c0 * fp, c1=b.c1 * fp, c2=b.c2 * fp, d0=b.d0 * fd, d1=b.d1 * fd, d2=b.d2 * fd)

    def _side(self, side: str) -> _Ewma:
        try:
            return self._sides[side]
        except KeyError:
            raise ValueError(f"calibration side must be 'prefill' or 'decode', got {side!r}") from None

    def prior(self, side: str) -> float:
        """The factor of an instance of ``side`` without samples of its own (module doc)."""
        return math.exp(self._prior(side))

    def _prior(self, side: str) -> float:
        shared = self._side(side).log_factor
        return min([shared, *(s.log_factor for (sd, _), s in self._inst.items()
                              if sd == side and s.samples >= self.prior_samples)])

    def _log_factor(self, side: str, instance: str | None) -> float:
        if instance is None:
            return self._side(side).log_factor
        s = self._inst.get((side, instance))
        if s is not None and s.samples >= self.prior_samples:
            return s.log_factor  # its own alone: the other instances' later moves do not reach it
        prior = self._prior(side)
        if s is None or not s.samples:
            return prior
        return prior + s.samples / self.prior_samples * (s.log_factor - prior)

    def _fade(self, s: _Ewma, target: float, now: float) -> bool:
        """Halve ``s``'s distance to ``target`` every ``half_life_s`` once it is ``stale_s`` old."""
        if not s.samples or s.log_factor == target:
            return False
        since = max(s.last_decay, s.last_sample + self.stale_s)
        if now <= since:
            return False
        gap = (s.log_factor - target) * 0.5 ** ((now - since) / self.half_life_s)
        s.last_decay = now
        if abs(gap) < 1e-3:
            gap = 0.0
        if abs(target + gap - s.log_factor) >= 1e-3 or gap == 0.0:
            s.log_factor = target + gap
            return True
        return False

    def _update(self, s: _Ewma, sample: float, now: float) -> bool:
        new = sample if s.samples == 0 else (1 - self.alpha) * s.log_factor + self.alpha * sample
        new = min(max(new, math.log(self.lo)), math.log(self.hi))
        s.samples += 1
        s.last_sample = s.last_decay = now
        if new == s.log_factor:
            return False
        s.log_factor = new
        return True

    def _observe(self, side: str, predicted: float, observed: float, now: float, instance: str | None,
                 contention: float | None = None, busy: dict[str, float] | None = None) -> bool:
        s = self._side(side)
        if not (math.isfinite(predicted) and math.isfinite(observed)) or predicted < self.min_predicted_s \
                or observed <= 0:
            return False
        sample = math.log(observed / predicted)
        moved = False
        if contention is not None and math.isfinite(contention) and contention >= 0:
            # the slope is fitted on the samples themselves (contention.py); the factors then
            # learn from the sample with its contention taken out
            moved = self._slope.observe(contention, sample, instance or "")
            sample -= self._slope.slope * contention
        if busy is not None and instance is not None and side == "prefill" and instance in self.groups:
            # declared: processor sharing with its busy mates, its cost per mate learned per group
            # against the instance's factor now (contention.HardwareGroups)
            moved = self.groups.observe(instance, busy, math.exp(sample - self._log_factor(side, instance))) or moved
            sample -= math.log(self.groups.slowdown(instance, busy))
        elif busy is not None and instance is not None:  # which prefills slowed it (decode, or another prefill)
            fit = self._interference if side == "decode" else self._pairs
            moved = fit.observe(instance, busy, sample) or moved
            coef = fit.coefs(instance)
            sample -= sum(c * min(1.0, busy.get(p, 0.0)) for p, c in coef.items())
        changed = self._update(s, sample, now) or moved
        if instance is not None:
            own = self._inst.get((side, instance))
            if own is None:
                own = self._inst[(side, instance)] = _Ewma()
            changed = self._update(own, sample, now) or changed or own.samples == 1
        if changed:
            self._cost = None
            self._costs = None
        return changed
