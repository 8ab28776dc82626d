"""Admission feedback from the TTFT SLO attainment the admitted requests actually got (pure, no clock).

Why: the TTFT check admits a request when its predicted first token (plus the pair's error margin,
ttft_error.py) is within the SLO. On ``bench/bench_live_scheduling.py``'s box four vLLM prefills share
one core, and their bursts are not predictable from the model's inputs: four to six requests on one
instance answered 2-3 s late together, or every instance late at once. Every model added for them
(pair interference, processor-sharing groups, the batched step, a higher margin quantile) left the
attainment of the admitted requests at 62-97 % from run to run. The model cannot say when it is
wrong; the outcomes can. So this is model-free feedback on the quantity the operator asked for:

* every admitted request is an outcome: met (first token within the SLO) or missed. A request still
  waiting for its first token counts as missed as soon as it is past the SLO -- that is known then,
  seconds before a late first token arrives, while more of a burst would be admitted;
* ``attainment(now)`` is the share met among the outcomes of the last ``window_s`` seconds, ranked with
  ``prior`` pseudo-outcomes that met (one early miss is not 0 %, as the margin's prior zeros);
* while that is below ``goal`` (``target`` plus ``headroom``: the feedback has to act before the target
  is lost, not after), the TTFT check admits only what is predicted within ``budget(now)`` times the
  SLO: ``1 - gain * (goal - attainment)``, never below ``floor``. The prediction is never relaxed
  (the budget is at most 1): good attainment does not admit what the model predicts late.

Misses age out of the window, so the check reopens by itself when the burst is over (a refused request
brings no outcome, so nothing else would). Only TTFT outcomes count: the TBT check has no such burst
on the bench (its decode has a core of its own), and a TBT outcome is known only when the request ends.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

__all__ = ["AttainmentFeedback"]


@dataclass(slots=True)
class AttainmentFeedback:
    """Recent TTFT SLO outcomes of the admitted requests and the budget they leave (see module doc)."""

    #: the TTFT SLO in seconds the outcomes are judged against
    slo_s: float
    #: the attainment of the admitted requests the operator asks for
    target: float = 0.9
    #: how far above ``target`` the feedback starts to tighten
    headroom: float = 0.05
    #: budget lost per unit of attainment below the goal
    gain: float = 3.0
    #: the smallest budget, as a fraction of the SLO
    floor: float = 0.5
    #: seconds an outcome counts
    window_s: float = 30.0
    #: pseudo-outcomes that met, ranked with the real ones
    prior: int = 4
    #: (time known, met), oldest first
    _done: deque[tuple[float, bool]] = field(default_factory=deque)
    #: request -> time admitted, for those still waiting for their first token
    _waiting: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.slo_s) and self.slo_s > 0):
            raise ValueError(f"AttainmentFeedback.slo_s must be a TTFT SLO > 0 s, got {self.slo_s!r}")
        if not 0 < self.target < 1:
            raise ValueError(f"AttainmentFeedback.target must be in (0, 1), got {self.target!r}")
        if not (0 <= self.headroom and self.target + self.headroom <= 1):
            raise ValueError(f"AttainmentFeedback.headroom must be >= 0 with target + headroom <= 1, got "
                             f"{self.headroom!r} (target {self.target!r})")
        if not (self.gain > 0 and 0 < self.floor <= 1 and self.window_s > 0 and self.prior >= 0):
            raise ValueError(f"AttainmentFeedback needs gain > 0, 0 < floor <= 1, window_s > 0 and prior >= 0, "
                             f"got {self.gain!r}, {self.floor!r}, {self.window_s!r}, {self.prior!r}")

    @property
    def goal(self) -> float:
        return self.target + self.headroom

    def admitted(self, request_id: str, now: float) -> None:
        """``request_id`` was admitted at ``now``; its outcome is pending."""
        self._waiting[request_id] = now

    def first_token(self, request_id: str, ttft_s: float, now: float) -> bool | None:
        """The request's first token came ``ttft_s`` after its arrival; returns whether it met the SLO
        (None: not admitted here, or already forgotten)."""
        if self._waiting.pop(request_id, None) is None or not math.isfinite(ttft_s):
            return None
        met = ttft_s <= self.slo_s
        self._done.append((now, met))
        return met

    def dropped(self, request_id: str, now: float) -> None:
        """The request ended without a first token (an upstream error, a client gone): a miss if it was
        already past the SLO, else no outcome (its wait says nothing about the SLO)."""
        t = self._waiting.pop(request_id, None)
        if t is not None and now - t > self.slo_s:
            self._done.append((now, False))

    def attainment(self, now: float) -> float:
        """Share met among the last ``window_s`` seconds' outcomes, the waiting requests already past
        the SLO as misses, and ``prior`` met pseudo-outcomes (1.0 with nothing to go by)."""
        done = self._done
        while done and now - done[0][0] > self.window_s:
            done.popleft()
        late = sum(1 for t in self._waiting.values() if now - t > self.slo_s)
        met = sum(1 for _, m in done if m)
        n = len(done) + late + self.prior
        return (met + self.prior) / n if n else 1.0

    def budget(self, now: float) -> float:
        """Fraction of the SLO a request's predicted first token may take to be admitted now."""
        short = self.goal - self.attainment(now)
        return 1.0 if short <= 1e-9 else max(self.floor, 1.0 - self.gain * short)

    def waiting(self) -> int:
        return len(self._waiting)
