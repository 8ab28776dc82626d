"""Small statistics helpers for the chaos and soak reports (pure, stdlib only)."""

from __future__ import annotations

import math
from typing import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) or None for no values: with few samples
    p99 is the maximum, which is what a reliability report should show."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope dy/dx of ``(x, y)`` points, None with fewer than two distinct x."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def overlap(a0: int, a1: int, spans: Sequence[tuple[int, int]]) -> int:
    """Total length of ``[a0, a1)`` covered by ``spans`` (assumed not to overlap each other)."""
    return sum(max(0, min(a1, s1) - max(a0, s0)) for s0, s1 in spans)


def merge_spans(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Union of ``[a, b)`` spans as sorted, non-overlapping spans."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
