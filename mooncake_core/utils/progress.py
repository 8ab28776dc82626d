"""Progress of long work as plain lines at a bounded rate: done/total, rate, ETA (pure).

Why not ``tqdm`` (already a dependency, used for the interactive bars of
``transfer_engine_bench``): long runs here usually write to a log file or a CI console -- tqdm
then prints carriage-return redraws (one huge "line") or nothing, and it cannot speak through
the structured logger. This helper emits whole lines, at most one every ``every_s`` seconds,
to any sink: stderr for the bench scripts, ``log.info`` (with the figures as fields) for the
store client's SSD-tier sweeps. The clock is passed in, so tests drive it without sleeping.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Callable

__all__ = ["Progress", "format_eta", "log_sink", "stderr_sink"]

#: receives the line and the same figures as fields (done, total, rate_per_s, eta_s, elapsed_s, ...)
Sink = Callable[[str, dict[str, float | int | str | None]], None]


def format_eta(seconds: float | None) -> str:
    """``'42s'``, ``'3m05s'``, ``'1h02m'``; ``'?'`` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _num(x: float) -> str:
    return f"{x:.1f}" if x < 10 else f"{x:,.0f}"


def stderr_sink(line: str, _fields: dict[str, float | int | str | None]) -> None:
    print(line, file=sys.stderr, flush=True)


def log_sink(log: logging.Logger, level: int = logging.INFO) -> Sink:
    """Report through a structured logger: the line as message, the figures as fields."""
    def sink(line: str, fields: dict[str, float | int | str | None]) -> None:
        log.log(level, line, extra={"progress": fields["what"], **{k: v for k, v in fields.items() if k != "what"}})
    return sink


class Progress:
    """Counts done units of ``what`` (out of ``total`` when known) and reports through ``sink``
    at most once per ``every_s`` seconds; ``finish`` reports once more with the totals.

    Extra per-unit figures (bytes, failures) go in ``add(**extra)``; they are summed and shown
    as ``name=value`` after the rate.
    """

    def __init__(self, what: str, total: int | None = None, *, unit: str = "", every_s: float = 1.0,
                 sink: Sink = stderr_sink, clock: Callable[[], float] = time.monotonic,
                 enabled: bool = True) -> None:
        if every_s <= 0:
            raise ValueError(f"Progress: every_s must be > 0, got {every_s!r}")
        self.what, self.total, self.unit = what, total, unit
        self.every_s, self.sink, self.clock, self.enabled = every_s, sink, clock, enabled
        self.done = 0
        self.reports = 0  # lines sent so far (a caller may report the end only of long work)
        self.extra: dict[str, int] = {}
        self.t0 = clock()
        self._last = self.t0

    def fields(self, now: float | None = None) -> dict[str, float | int | str | None]:
        """The figures of a report at ``now``: done, total, elapsed_s, rate_per_s, eta_s, extras."""
        now = self.clock() if now is None else now
        elapsed = max(now - self.t0, 0.0)
        rate = self.done / elapsed if elapsed > 0 else None
        eta = None
        if self.total is not None and rate:
            eta = max(self.total - self.done, 0) / rate
        out: dict[str, float | int | str | None] = {
            "what": self.what, "done": self.done, "total": self.total, "elapsed_s": round(elapsed, 3),
            "rate_per_s": None if rate is None else round(rate, 3), "eta_s": None if eta is None else round(eta, 1)}
        out.update(self.extra)
        return out

    def line(self, now: float | None = None, final: bool = False) -> str:
        """``'what: 300/1,000 (30%) obj, 150/s, ETA 4s, failures=0'`` (a final line: ``in 2s``)."""
        f = self.fields(now)
        unit = f" {self.unit}" if self.unit else ""
        if self.total:
            head = f"{self.done:,}/{self.total:,} ({100 * self.done / self.total:.0f}%){unit}"
        else:
            head = f"{self.done:,}{unit}"
        rate = f["rate_per_s"]
        parts = [f"{self.what}: {head}", "?/s" if rate is None else f"{_num(float(rate))}/s"]
        if final:
            parts.append(f"in {format_eta(float(f['elapsed_s'] or 0.0))}")
        elif self.total is not None:
            eta = f["eta_s"]
            parts.append(f"ETA {format_eta(None if eta is None else float(eta))}")
        parts += [f"{k}={v:,}" for k, v in self.extra.items()]
        return ", ".join(parts)

    def add(self, n: int = 1, **extra: int) -> bool:
        """Count ``n`` more units (and extra figures); report when ``every_s`` has passed since
        the last report. Returns whether it reported."""
        self.done += n
        for k, v in extra.items():
            self.extra[k] = self.extra.get(k, 0) + v
        now = self.clock()
        if not self.enabled or now - self._last < self.every_s:
            return False
        self._last = now
        self.reports += 1
        self.sink(self.line(now), self.fields(now))
        return True

    def finish(self) -> None:
        """Report the totals once (also when nothing was reported yet)."""
        if self.enabled:
            now = self.clock()
            self.reports += 1
            self.sink(self.line(now, final=True), self.fields(now))
