"""The progress lines of long work (mooncake_core/utils/progress.py): bounded rate, figures."""

from __future__ import annotations

import pytest

from mooncake_core.utils.progress import Progress, format_eta


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(total: int | None = 1000, every: float = 1.0, **kw):
    clock, lines = Clock(), []
    p = Progress("fill", total, unit="obj", every_s=every, clock=clock,
                 sink=lambda line, fields: lines.append((line, fields)), **kw)
    return p, clock, lines


def test_reports_at_most_once_per_interval():
    p, clock, lines = make()
    for _ in range(50):  # 50 updates within 0.5 s: no line
        clock.t += 0.01
        p.add(2)
    assert lines == []
    clock.t += 0.6
    assert p.add(2)
    clock.t += 0.1
    assert not p.add(2)
    assert len(lines) == 1


def test_line_has_done_total_rate_eta_and_extras():
    p, clock, lines = make()
    clock.t += 2.0
    p.add(300, failures=0, bytes=4096)
    line, fields = lines[-1]
    assert line == "fill: 300/1,000 (30%) obj, 150/s, ETA 5s, failures=0, bytes=4,096"
    assert fields["done"] == 300 and fields["total"] == 1000 and fields["rate_per_s"] == 150.0
    assert fields["eta_s"] == pytest.approx(4.7, abs=0.1) and fields["bytes"] == 4096


def test_unknown_total_and_final_line():
    p, clock, lines = make(total=None)
    clock.t += 4.0
    p.add(10)
    assert lines[-1][0] == "fill: 10 obj, 2.5/s"
    p.finish()
    assert lines[-1][0] == "fill: 10 obj, 2.5/s, in 4s"


def test_finish_reports_even_without_a_line_before_and_disabled_is_silent():
    p, clock, lines = make()
    p.add(1)
    p.finish()
    assert len(lines) == 1 and lines[0][0].startswith("fill: 1/1,000 (0%) obj, ?/s")
    q, clock, quiet = make(enabled=False)
    clock.t += 5
    q.add(5)
    q.finish()
    assert quiet == []


def test_format_eta_and_bad_interval():
    assert [format_eta(x) for x in (None, -1, 4.4, 65, 3725)] == ["?", "?", "4s", "1m05s", "1h02m"]
    with pytest.raises(ValueError, match="every_s"):
        Progress("x", every_s=0)
