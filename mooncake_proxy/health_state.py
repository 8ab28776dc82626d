"""When to probe an instance, and what a probe result means (pure: no I/O, injected clock).

Why a state machine and not a boolean: an instance the proxy has never reached is not the same
as one that failed. Engines are typically started together with the proxy and answer
``/health`` a few seconds later; treating "not answering yet" as "down for --health-interval"
refused every request in that window. So an instance starts ``UNKNOWN`` and is probed at once,
then quickly with exponential back-off (``first_delay`` doubling up to ``retry_cap``) until its
first success. An ``UP`` instance is probed every ``interval``. A ``DOWN`` one (a failed probe or
a refused connection on the request path) goes back to the fast back-off, so it returns within
about a second of answering again.

Why a probe that only *timed out* does not take an ``UP`` instance out at once: an engine busy
with a long prefill on a loaded host answers ``/health`` late but is serving. Taking the only
decode instance out on one late answer turned every request in the next second into a 503
(seen in the live scheduling bench at load ~20). A timed-out probe of an ``UP`` instance is
re-probed on the fast back-off, and the instance leaves rotation after ``timeouts_to_down``
consecutive timeouts (Kubernetes' ``failureThreshold``, default 3). A refused connection, an
HTTP error answer, or a timeout of an instance that is not up yet count at once: the engine is
gone or says it cannot serve.

Only ``UP`` instances are scheduled. The I/O side (``health.HealthChecker``) asks
``next_probe_at`` when to probe and reports each result through ``on_probe``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class HealthState(str, enum.Enum):
    UNKNOWN = "unknown"  # never probed successfully since it was added
    UP = "up"
    DOWN = "down"


@dataclass(frozen=True)
class ProbePolicy:
    """Probe timing. ``interval`` 0 turns periodic probing of healthy instances off (instances
    are still probed at start, after a failure, and on demand)."""

    interval: float = 5.0
    first_delay: float = 0.05
    retry_cap: float = 1.0
    timeouts_to_down: int = 3    # consecutive timed-out probes that take an UP instance out

    def __post_init__(self) -> None:
        if self.interval < 0 or self.first_delay <= 0 or self.retry_cap <= 0 or self.timeouts_to_down < 1:
            raise ValueError(f"probe policy: interval >= 0, first_delay > 0, retry_cap > 0 and "
                             f"timeouts_to_down >= 1 expected, got {self}")

    def retry_delay(self, failures: int) -> float:
        """Delay before the next probe of an instance that is not up, after ``failures``
        consecutive failed probes (0 = not probed yet)."""
        if failures <= 0:
            return 0.0
        cap = min(self.retry_cap, self.interval) if self.interval > 0 else self.retry_cap
        return min(cap, self.first_delay * (2 ** min(failures - 1, 30)))


@dataclass
class InstanceHealth:
    """Health of one instance as the proxy sees it."""

    state: HealthState = HealthState.UNKNOWN
    failures: int = 0            # consecutive failed probes / refused connections
    late: int = 0                # consecutive timed-out probes while still UP
    last_error: str = ""         # why it is not up (empty when up)
    since: float = 0.0           # clock value of the last state change
    next_probe_at: float = 0.0   # clock value when the next background probe is due

    @property
    def up(self) -> bool:
        return self.state is HealthState.UP

    def on_probe(self, ok: bool, why: str, now: float, policy: ProbePolicy, timed_out: bool = False) -> bool:
        """Apply one probe (or request-path) result; True when the state changed. ``timed_out``:
        the probe got no answer in time (as opposed to a refusal or an error answer)."""
        old = self.state
        if ok:
            self.state, self.failures, self.late, self.last_error = HealthState.UP, 0, 0, ""
            self.next_probe_at = now + policy.interval if policy.interval > 0 else float("inf")
        elif timed_out and self.state is HealthState.UP and self.late + 1 < policy.timeouts_to_down:
            self.late += 1  # busy, not gone (yet): stay in rotation, look again soon
            self.next_probe_at = now + policy.retry_delay(self.late)
        else:
            self.late = 0
            self.state = HealthState.DOWN
            self.failures += 1
            self.last_error = why or "probe failed"
            self.next_probe_at = now + policy.retry_delay(self.failures)
        if self.state is not old:
            self.since = now
            return True
        return False

    def describe(self) -> str:
        """One line for /health and 503 answers: state and, when not up, why."""
        if self.state is HealthState.UP:
            return f"up ({self.late} late /health answers in a row)" if self.late else "up"
        if self.state is HealthState.UNKNOWN and not self.last_error:
            return "unknown (not answered /health yet)"
        return f"{self.state.value}: {self.last_error}"


def next_due(healths: list[InstanceHealth]) -> float:
    """Earliest ``next_probe_at`` (inf when nothing is due ever)."""
    return min((h.next_probe_at for h in healths), default=float("inf"))
