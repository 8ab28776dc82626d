"""Online correction of the cost model from the latencies the proxy observes (pure, no clock).

Why: a profile is measured once, on an idle instance (``fit_profile``, or the bench's start-up
fit), but the engines then run next to each other and to other work. On the 2-core box of
``bench/bench_live_scheduling.py`` a 0.3 s prefill took seconds under load: a scheduler whose
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

The proxy feeds it (``observe_prefill`` when a prefill answers, ``observe_decode`` when a
decode stream ends) with the *unscaled* prediction (the scheduler's estimate divided by the
factor in force when it was made), and installs :meth:`cost` as the scheduler's model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

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
    """

    base: CostModel
    alpha: float = 0.2
    lo: float = 0.1
    hi: float = 100.0
    min_predicted_s: float = 1e-3
    stale_s: float = 10.0
    half_life_s: float = 10.0
    _sides: dict[str, _Ewma] = field(default_factory=lambda: {"prefill": _Ewma(), "decode": _Ewma()})
    #: decode instance -> EWMA of the first-token delay, in log_factor (seconds, not a log here)
    _first: dict[str, _Ewma] = field(default_factory=dict)
    _cost: CostModel | None = None

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"LatencyCalibrator.alpha must be in (0, 1], got {self.alpha!r}")
        if not 0 < self.lo <= 1 <= self.hi:
            raise ValueError(f"LatencyCalibrator needs 0 < lo <= 1 <= hi, got lo={self.lo!r} hi={self.hi!r}")
        if not (self.stale_s >= 0 and self.half_life_s > 0):
            raise ValueError(f"LatencyCalibrator needs stale_s >= 0 and half_life_s > 0, got "
                             f"{self.stale_s!r}, {self.half_life_s!r}")

    def factor(self, side: str) -> float:
        """Current factor of ``side`` ('prefill' or 'decode'); 1.0 before any sample."""
        return math.exp(self._side(side).log_factor)

    def samples(self, side: str) -> int:
        return self._side(side).samples

    def observe_prefill(self, predicted_s: float, observed_s: float, now: float = 0.0) -> bool:
        """A prefill (queue + compute, as predicted at scheduling time) took ``observed_s``; ``now``
        is the caller's clock. Returns True when the factor changed (then install :meth:`cost`)."""
        return self._observe("prefill", predicted_s, observed_s, now)

    def observe_decode(self, predicted_tbt_s: float, observed_tbt_s: float, now: float = 0.0) -> bool:
        """A decode stream's mean time between tokens was ``observed_tbt_s``."""
        return self._observe("decode", predicted_tbt_s, observed_tbt_s, now)

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

    def forget(self, decode_id: str) -> None:
        """The instance was removed."""
        self._first.pop(decode_id, None)

    def tick(self, now: float) -> bool:
        """Fade factors and first-token delays without a sample for ``stale_s`` (see module doc);
        True when one moved."""
        changed = False
        for s in (*self._sides.values(), *self._first.values()):
            if not s.samples or s.log_factor == 0.0:
                continue
            since = max(s.last_decay, s.last_sample + self.stale_s)
            if now <= since:
                continue
            new = s.log_factor * 0.5 ** ((now - since) / self.half_life_s)
            s.last_decay = now
            if abs(new) < 1e-3:
                new = 0.0
            if abs(new - s.log_factor) >= 1e-3 or new == 0.0:
                s.log_factor = new
                changed = True
        if changed:
            self._cost = None
        return changed

    def cost(self) -> CostModel:
        """``base`` with the prefill coefficients (c*) and decode coefficients (d*) multiplied by
        their factors; transfer times are left as measured (the network is not the contended part)."""
        if self._cost is None:
            fp, fd = self.factor("prefill"), self.factor("decode")
            b = self.base
            self._cost = replace(b, c0=b.c0 * fp, c1=b.c1 * fp, c2=b.c2 * fp,
                                 d0=b.d0 * fd, d1=b.d1 * fd, d2=b.d2 * fd)
        return self._cost

    def _side(self, side: str) -> _Ewma:
        try:
            return self._sides[side]
        except KeyError:
            raise ValueError(f"calibration side must be 'prefill' or 'decode', got {side!r}") from None

    def _observe(self, side: str, predicted: float, observed: float, now: float) -> bool:
        s = self._side(side)
        if not (math.isfinite(predicted) and math.isfinite(observed)) or predicted < self.min_predicted_s \
                or observed <= 0:
            return False
        sample = math.log(observed / predicted)
        new = sample if s.samples == 0 else (1 - self.alpha) * s.log_factor + self.alpha * sample
        new = min(max(new, math.log(self.lo)), math.log(self.hi))
        s.samples += 1
        s.last_sample = s.last_decay = now
        if new == s.log_factor:
            return False
        s.log_factor = new
        self._cost = None
        return True
