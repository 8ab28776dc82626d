"""When to stop asking an unreachable store master, and when to try again (pure, no I/O).

Why: every master RPC of the store client retries until its timeout (``MC_STORE_RPC_TIMEOUT``,
default 5 s) when the master is down. The connector's prefix lookup runs inside vLLM's
scheduler step, so with the master gone each new request would stall the whole engine --
every running request's decode -- for that long, and each save would hold its request's KV
blocks as long. After a failure the connector skips the store (lookups find nothing, saves are
dropped) for a back-off that doubles on each failed retry, up to ``max_s``; the first answer
from the master ends it.
"""

from __future__ import annotations

import time
from typing import Callable


class MasterBackoff:
    """Open after a failure: ``allow()`` is False until the back-off has passed."""

    def __init__(self, min_s: float = 1.0, max_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < min_s <= max_s:
            raise ValueError(f"MasterBackoff: need 0 < min_s <= max_s, got {min_s!r}, {max_s!r}")
        self.min_s, self.max_s, self._clock = min_s, max_s, clock
        self._wait = 0.0  # 0: the master answered last time
        self._until = 0.0

    @property
    def healthy(self) -> bool:
        """True when the last call reached the master."""
        return self._wait == 0.0

    def allow(self) -> bool:
        """Whether to ask the master now (always while healthy; once per back-off otherwise)."""
        return self._wait == 0.0 or self._clock() >= self._until

    def failed(self) -> float:
        """Record a failed call; returns the seconds the store is now skipped for."""
        self._wait = self.min_s if self._wait == 0.0 else min(self.max_s, 2 * self._wait)
        self._until = self._clock() + self._wait
        return self._wait

    def ok(self) -> bool:
        """Record an answered call; returns True when this ends a back-off (the master is back)."""
        was_down = self._wait != 0.0
        self._wait = 0.0
        return was_down
