"""Match a caller's regular expression against many keys within a time budget.

Why: ``remove_by_regex`` takes its pattern from any client, and Python's ``re`` backtracks:
``(a+)+$`` against one key of 26 ``a``s and a ``!`` runs for seconds, against 40 for hours. In
the master that froze its only RPC thread -- every client saw -900 (found by tests/fuzz). The
``regex`` package (mrab-regex: the syntax of ``re`` plus a per-call ``timeout``) bounds the
matching, so a hostile or careless pattern is refused with a clear error after ``budget_s``
instead of taking the service down. Linear-time engines (RE2) were not chosen because they drop
syntax ``re`` users rely on (backreferences, lookaround).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import regex


class PatternError(ValueError):
    """The pattern does not compile, or matching it took longer than the budget."""


class Matcher:
    """``matcher(key) -> bool`` (``search`` semantics); all calls together may take at most
    ``budget_s`` seconds from the first one, after which PatternError is raised."""

    def __init__(self, pattern: object, budget_s: float, *, what: str = "pattern",
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(pattern, str):
            raise PatternError(f"{what}: expected a string, got {type(pattern).__name__}")
        try:
            self.rx = regex.compile(pattern)
        except (regex.error, TypeError, ValueError, OverflowError) as e:
            raise PatternError(f"{what}: invalid regular expression {pattern!r:.200}: {e}") from None
        self.pattern, self.budget_s, self.what, self.clock = pattern, budget_s, what, clock
        self.deadline: float | None = None
        self.calls = 0

    def _over(self) -> PatternError:
        return PatternError(f"{self.what} {self.pattern!r:.200} took longer than {self.budget_s * 1000:.0f} ms "
                            f"to match (stopped at key {self.calls}); refused -- simplify it (nested "
                            f"quantifiers such as '(a+)+' backtrack exponentially)")

    def __call__(self, key: str) -> bool:
        now = self.clock()
        if self.deadline is None:
            self.deadline = now + self.budget_s
        self.calls += 1
        left = self.deadline - now
        if left <= 0:
            raise self._over()
        try:
            return self.rx.search(key, timeout=left) is not None
        except TimeoutError:
            raise self._over() from None


def matching(keys: Iterable[str], pattern: object, budget_s: float, *, what: str = "pattern",
             clock: Callable[[], float] = time.monotonic) -> list[str]:
    """The keys in which ``pattern`` is found, or PatternError past ``budget_s`` in total."""
    m = Matcher(pattern, budget_s, what=what, clock=clock)
    return [k for k in keys if m(k)]
