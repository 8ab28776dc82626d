"""The decode instance's hand-off stage as a queue the proxy sees (pure, no clock).

Why: the client's TTFT in a P/D pair ends at the decode's first token, after the prefill *and*
the hand-off (the decode's KV pull, its wait for a batch slot, its first step). On the 2-core box
of ``bench/scheduling/bench_live_scheduling.py`` the hand-off was most of the TTFT, and a latency-only
estimate of it (a moving mean of past first-token delays) arrived too late: at 2x load the whole
window was admitted before the first slow hand-off reported back. What the proxy *does* know at
admission time, without waiting for anyone's answer, is how many requests are queued ahead at
that stage and how long the oldest has been waiting there. So the stage is modelled as a FIFO
server:

* ``service_s`` -- the per-request service time, measured the way a FIFO queue's is: a request's
  first token time minus the later of its hand-off and the previous first token (the queueing
  ahead of it is subtracted, so a long queue does not inflate the estimate); the mean of the last
  ``window`` samples, i.e. the inverse of the stage's throughput while busy. A mean, not a median:
  vLLM finishes several pulls in one step, so most samples of a clump are 0 and the first carries
  the whole clump's time;
* the requests handed off and still waiting for their first token (``pending``), plus the
  requests still in prefill headed there (the caller passes their count as ``ahead``);
* the head's lateness: how far past ``service_s`` the oldest pending request already is. A
  stalled pull (seen on this box: 5-40 s) makes it grow every second, and with it the estimate
  of everyone behind -- the one signal that needs no completed request.

A request whose prefill will be done in ``ready_in`` seconds gets its first token in
``max(ready_in, lateness + (pending + ahead) * service) + service`` (:meth:`first_token_in`).

The service time also depends on where the KV comes from: on that box the decode shares a core
with one prefill, whose engine spins for a second after answering, and hand-offs from it took 1-2 s
where the other prefill's took 0.03-0.09 s. So each sample is also kept per source (the prefill
instance, ``handed_off(..., source=)``), and a request's own service time is its source's mean
when that source has samples (the queue ahead of it still drains at the stage's overall mean):
the fast pair is no longer predicted slow because of the other's samples, and the slow pair is
predicted slow. A source's samples fade on their own once it has sent none for ``stale_s``.

Without samples no service time is assumed: the estimate is ``max(ready_in, age of the oldest
pending request)``. When the stage is idle, samples older than ``stale_s`` fade (halving every
``half_life_s``): a service time learned in a slow burst must not reject every later request
forever, since a rejected request brings no new sample.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass, field

__all__ = ["HandoffQueue"]


@dataclass(slots=True)
class HandoffQueue:
    """One decode instance's hand-off stage (see module doc). Times are the caller's clock (s)."""

    window: int = 16
    stale_s: float = 10.0
    half_life_s: float = 10.0
    _pending: OrderedDict[str, tuple[float, str | None]] = field(default_factory=OrderedDict)
    _samples: deque[float] = field(default_factory=deque)
    #: source (prefill instance) -> its recent samples, and when it last gave one
    _by_source: dict[str, tuple[deque[float], float]] = field(default_factory=dict)
    _last_first: float = float("-inf")
    _last_sample: float = 0.0

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"HandoffQueue.window must be >= 1 sample, got {self.window!r}")
        if not (self.stale_s >= 0 and self.half_life_s > 0):
            raise ValueError(f"HandoffQueue needs stale_s >= 0 and half_life_s > 0, got "
                             f"{self.stale_s!r}, {self.half_life_s!r}")

    @property
    def pending(self) -> int:
        """Requests handed off whose first token has not come back."""
        return len(self._pending)

    @property
    def samples(self) -> int:
        return len(self._samples)

    def handed_off(self, request_id: str, now: float, source: str | None = None) -> None:
        """The request's prefill (on instance ``source``, if known) answered and its decode
        request was sent (idempotent)."""
        self._pending.setdefault(request_id, (now, source))

    def first_token(self, request_id: str, now: float) -> float | None:
        """Its first token came back: record its service time (returned; None if unknown)."""
        entry = self._pending.pop(request_id, None)
        if entry is None:
            return None
        sent, source = entry
        sample = max(0.0, now - max(sent, self._last_first))
        self._last_first = max(self._last_first, now)
        self._samples.append(sample)
        if len(self._samples) > self.window:
            self._samples.popleft()
        self._last_sample = now
        if source is not None:
            mine = self._by_source.get(source)
            d = mine[0] if mine is not None else deque(maxlen=self.window)
            d.append(sample)
            self._by_source[source] = (d, now)
        return sample

    def dropped(self, request_id: str) -> None:
        """The request left the stage without a first token (error, cancel): no sample."""
        self._pending.pop(request_id, None)

    def service_s(self, now: float, source: str | None = None) -> float:
        """Mean recent service time; fades once the stage is idle and unconfirmed for ``stale_s``.
        With ``source``: that source's own mean when it has samples (fading once it has sent none
        for ``stale_s``), else the stage's."""
        mine = self._by_source.get(source) if source is not None else None
        if mine is not None:
            d, last = mine
            s = statistics.fmean(d)
            idle = now - last - self.stale_s
            return s * 0.5 ** (idle / self.half_life_s) if idle > 0 else s
        if not self._samples:
            return 0.0
        s = statistics.fmean(self._samples)
        idle = now - self._last_sample - self.stale_s
        if not self._pending and idle > 0:
            s *= 0.5 ** (idle / self.half_life_s)
        return s

    def lateness_s(self, now: float) -> float:
        """How far past one service time the oldest pending request is (0 when none is late)."""
        if not self._pending:
            return 0.0
        head = next(iter(self._pending.values()))[0]
        return max(0.0, now - max(head, self._last_first) - self.service_s(now))

    def first_token_in(self, now: float, ready_in: float, ahead: int = 0, source: str | None = None) -> float:
        """Seconds from ``now`` to the first token of a request whose prefill is done in
        ``ready_in`` s, with ``ahead`` more requests (still in prefill) handed off before it;
        ``source``: its prefill instance (its own service time, see module doc)."""
        s = self.service_s(now)
        busy_until = self.lateness_s(now) + (len(self._pending) + max(0, ahead)) * s
        return max(ready_in, busy_until) + self.service_s(now, source)

    def forget(self, source: str) -> None:
        """The prefill instance ``source`` was removed: drop its own samples."""
        self._by_source.pop(source, None)
