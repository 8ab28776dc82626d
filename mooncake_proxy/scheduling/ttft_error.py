"""A safety margin for the TTFT check, from the quantile of its own recent errors (pure, no clock).

Why: with a binding SLO (1 s on ``bench/scheduling/bench_live_scheduling.py``'s 2-core box) the TTFT
prediction's error is as large as the SLO's margin, and it is not symmetric noise: it depends on
the (prefill, decode) pair. There the decode shares a core with one of the two prefills, and
vLLM CPU's engine spins for a second after each answer, so that prefill's hand-offs took 1-2 s
more than predicted while the other's were within 0.1 s -- and a 35 s freeze of one prefill
process hit only the requests routed there. An admission that compares the bare prediction with
the SLO admits requests that then miss by the error it does not model.

So the check compares ``prediction + margin(pair)`` with the SLO, the margin being the
``quantile`` (default 0.9) of that pair's recent residuals ``observed - predicted`` TTFT: it
is what the prediction missed for the last requests on that pair, whatever the cause (queueing
the model does not see, a slow hand-off, tokenization, a stalled engine). A pair whose requests
keep missing gets a high margin and is avoided (the scheduler tries the other prefills before
answering 429); a pair without samples has margin 0 (nothing learned, nothing held against it).

One residual is not a quantile: the pair's residuals are ranked together with ``prior`` pseudo-residuals
of 0 (the prediction taken at its word), so with the default 9 a margin needs at least two late requests
on the pair. Without them, one early clash (on the bench two requests in flight together, both 1.5 s
late) blocked *every* pair at once; then nothing is admitted, no sample corrects the margins, and only
the fade reopens them (a run with 35 x 429 in 40).

A residual fades with its age: once older than ``stale_s`` it is halved every ``half_life_s``
(a pair rejected because of one bad burst brings no new sample, so without fading it would be
avoided forever). Negative residuals (the prediction was too high) count in the quantile, but
the margin is never below 0: the bare prediction is never relaxed.

Requests admitted behind others are a class of their own (``queued_class``): their residuals are also
kept in one window pooled over all pairs, and a request that would queue gets the larger of its pair's
margin and that class's. Why: on the live bench (four prefills on one core) the admitted requests
that missed were those queued behind others -- vLLM answers them at the end of a batched step the
model does not see, 0.03-0.4 s past the SLO -- while the unqueued ones came early (residual p50
-0.45 s). Within one pair's window the two kinds mix, and the early ones hide the late ones from
the quantile; a pair sees too few queued requests to learn them alone, and the batched step is
the engine's, not the pair's.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

__all__ = ["TtftErrorQuantile"]

#: the key of the pooled window of requests admitted behind others (instance ids are never empty)
QUEUED: tuple[str, str] = ("", "queued")


@dataclass(slots=True)
class TtftErrorQuantile:
    """Per (prefill, decode) pair: recent TTFT residuals and their faded ``quantile`` (see module doc)."""

    quantile: float = 0.9
    window: int = 16
    prior: int = 9
    stale_s: float = 10.0
    half_life_s: float = 10.0
    #: also learn the requests admitted behind others as one class, pooled over pairs (module doc)
    queued_class: bool = True
    #: pair -> (time observed, residual s), oldest first
    _res: dict[tuple[str, str], deque[tuple[float, float]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.quantile <= 1:
            raise ValueError(f"TtftErrorQuantile.quantile must be in (0, 1], got {self.quantile!r}")
        if self.window < 1:
            raise ValueError(f"TtftErrorQuantile.window must be >= 1 sample, got {self.window!r}")
        if self.prior < 0:
            raise ValueError(f"TtftErrorQuantile.prior must be >= 0 pseudo-samples, got {self.prior!r}")
        if not (self.stale_s >= 0 and self.half_life_s > 0):
            raise ValueError(f"TtftErrorQuantile needs stale_s >= 0 and half_life_s > 0, got "
                             f"{self.stale_s!r}, {self.half_life_s!r}")

    def observe(self, prefill_id: str, decode_id: str, predicted_s: float, observed_s: float,
                now: float, *, queued: bool = False) -> float | None:
        """A request admitted on the pair with predicted TTFT ``predicted_s`` got its first token
        after ``observed_s``; ``queued``: it was admitted behind others on its prefill. Returns the
        residual recorded (None: not finite, ignored)."""
        if not (math.isfinite(predicted_s) and math.isfinite(observed_s)) or predicted_s < 0 or observed_s < 0:
            return None
        r = observed_s - predicted_s
        self._append((prefill_id, decode_id), now, r)
        if queued and self.queued_class:
            self._append(QUEUED, now, r)
        return r

    def samples(self, prefill_id: str, decode_id: str) -> int:
        d = self._res.get((prefill_id, decode_id))
        return len(d) if d is not None else 0

    def queued_samples(self) -> int:
        """Residuals in the pooled window of requests admitted behind others."""
        return self.samples(*QUEUED)

    def margin(self, prefill_id: str, decode_id: str, now: float, *, fade: bool = True,
               queued: bool = False) -> float:
        """Seconds to add to the pair's predicted TTFT: the nearest-rank ``quantile`` of its faded
        residuals and ``prior`` zeros, at least 0 (0 without samples). ``fade=False``: the same
        quantile of the residuals as observed -- what the pair is known to cost, for ranking pairs
        (the fade is for the admission check: it reopens an avoided pair, it is not new evidence).
        ``queued``: the request would wait behind others, so at least the queued class's margin."""
        own = self._quantile((prefill_id, decode_id), now, fade)
        if queued and self.queued_class:
            return max(own, self._quantile(QUEUED, now, fade))
        return own

    def _append(self, key: tuple[str, str], now: float, r: float) -> None:
        d = self._res.get(key)
        if d is None:
            d = self._res[key] = deque(maxlen=self.window)
        d.append((now, r))

    def _quantile(self, key: tuple[str, str], now: float, fade: bool) -> float:
        d = self._res.get(key)
        if not d:
            return 0.0
        faded = sorted([r * (self._weight(now - t) if fade else 1.0) for t, r in d] + [0.0] * self.prior)
        k = max(0, math.ceil(self.quantile * len(faded)) - 1)
        return max(0.0, faded[k])

    def forget(self, instance_id: str) -> None:
        """The instance was removed: drop every pair it is part of."""
        for key in [k for k in self._res if k != QUEUED and instance_id in k]:
            del self._res[key]

    def _weight(self, age: float) -> float:
        over = age - self.stale_s
        return 1.0 if over <= 0 else 0.5 ** (over / self.half_life_s)
