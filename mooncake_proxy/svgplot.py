"""Line charts as plain SVG text: the plots of the simulator and the live bench without matplotlib.

Why hand-written: the benches run in venvs and on CI machines where matplotlib is often not
installed, and a TTFT CDF or a hit-ratio curve is a few polylines on log or linear axes. The
output is a standalone SVG (no scripts, no external fonts) that browsers and GitHub render.
Several panels side by side share one file (e.g. live and simulated TTFT CDFs). Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence
from xml.sax.saxutils import escape

__all__ = ["Panel", "cdf_points", "render_svg"]

#: Line colours (colour-blind-safe Okabe-Ito order), reused cyclically.
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
_W, _H = 520, 340           # one panel
_ML, _MR, _MT, _MB = 62, 16, 34, 46  # margins: left (y ticks), right, top (title), bottom (x ticks)


@dataclass
class Panel:
    """One chart: named series of (x, y) points, axis labels, log or linear x."""

    title: str
    series: Mapping[str, Sequence[tuple[float, float]]]
    xlabel: str = ""
    ylabel: str = ""
    log_x: bool = False
    hlines: Mapping[str, float] = field(default_factory=dict)  # dashed reference lines


def cdf_points(values: Sequence[float]) -> list[tuple[float, float]]:
    """Empirical CDF of the finite values: (value, fraction <= value), sorted."""
    v = sorted(x for x in values if x == x and math.isfinite(x))
    n = len(v)
    return [(x, (i + 1) / n) for i, x in enumerate(v)]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 100 or a == int(a):
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.1f}"
    return f"{v:.2g}"


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:  # powers of ten; with 1-2-5 between them when the range spans under 3 decades
        decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
        mult = (1, 2, 5) if math.log10(hi / lo) < 3 else (1,)
        out = [m * 10.0 ** e for e in decades for m in mult]
        return [t for t in out if lo <= t <= hi] or [lo, hi]
    span = hi - lo
    step = 10 ** math.floor(math.log10(span)) if span > 0 else 1.0
    for m in (0.1, 0.2, 0.5, 1, 2, 5, 10):
        if span / (step * m) <= 6:
            step *= m
            break
    t = math.ceil(lo / step) * step
    out = []
    while t <= hi + 1e-12:
        out.append(round(t, 12))
        t += step
    return out


def _panel(p: Panel, ox: int) -> list[str]:
    pts = [(x, y) for s in p.series.values() for x, y in s if math.isfinite(x) and math.isfinite(y)]
    if p.log_x:
        pts = [(x, y) for x, y in pts if x > 0]
    out = [f'<text x="{ox + _W / 2}" y="20" text-anchor="middle" font-size="14">{escape(p.title)}</text>']
    if not pts:
        out.append(f'<text x="{ox + _W / 2}" y="{_H / 2}" text-anchor="middle">no data</text>')
        return out
    xs = [x for x, _ in pts]
    ys = [y for _, y in pts] + list(p.hlines.values())
    x0, x1 = min(xs), max(xs)
    if p.log_x:
        x0, x1 = x0 / 1.15, x1 * 1.15
    elif x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    y0, y1 = min(0.0, min(ys)), max(ys) * 1.02 if max(ys) > 0 else 1.0
    pw, ph = _W - _ML - _MR, _H - _MT - _MB

    def sx(x: float) -> float:
        if p.log_x:
            f = (math.log10(x) - math.log10(x0)) / (math.log10(x1) - math.log10(x0))
        else:
            f = (x - x0) / (x1 - x0)
        return ox + _ML + f * pw

    def sy(y: float) -> float:
        return _MT + ph - (y - y0) / (y1 - y0) * ph

    out.append(f'<rect x="{ox + _ML}" y="{_MT}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
    for t in _ticks(x0, x1, p.log_x):
        X = sx(t)
        out.append(f'<line x1="{X:.1f}" y1="{_MT}" x2="{X:.1f}" y2="{_MT + ph}" stroke="#ddd"/>')
        out.append(f'<text x="{X:.1f}" y="{_MT + ph + 16}" text-anchor="middle" font-size="11">{_fmt(t)}</text>')
    for t in _ticks(y0, y1, False):
        Y = sy(t)
        out.append(f'<line x1="{ox + _ML}" y1="{Y:.1f}" x2="{ox + _ML + pw}" y2="{Y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{ox + _ML - 6}" y="{Y + 4:.1f}" text-anchor="end" font-size="11">{_fmt(t)}</text>')
    out.append(f'<text x="{ox + _ML + pw / 2}" y="{_H - 8}" text-anchor="middle" font-size="12">'
               f'{escape(p.xlabel)}</text>')
    out.append(f'<text x="{ox + 14}" y="{_MT + ph / 2}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 {ox + 14} {_MT + ph / 2})">{escape(p.ylabel)}</text>')
    legend_y = _MT + 14
    for i, (name, s) in enumerate(p.series.items()):
        c = COLOURS[i % len(COLOURS)]
        sp = [(x, y) for x, y in s if math.isfinite(x) and math.isfinite(y) and (x > 0 or not p.log_x)]
        if sp:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sp)
            out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="1.8"/>')
        out.append(f'<line x1="{ox + _ML + 8}" y1="{legend_y - 4}" x2="{ox + _ML + 26}" y2="{legend_y - 4}" '
                   f'stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{ox + _ML + 30}" y="{legend_y}" font-size="11">{escape(name)}</text>')
        legend_y += 15
    for name, y in p.hlines.items():
        Y = sy(y)
        out.append(f'<line x1="{ox + _ML}" y1="{Y:.1f}" x2="{ox + _ML + pw}" y2="{Y:.1f}" stroke="#666" '
                   f'stroke-dasharray="5,4"/>')
        out.append(f'<text x="{ox + _ML + pw - 4}" y="{Y - 4:.1f}" text-anchor="end" font-size="11">'
                   f'{escape(name)}</text>')
    return out


def render_svg(panels: Sequence[Panel]) -> str:
    """A standalone SVG document with the panels left to right."""
    if not panels:
        raise ValueError("render_svg needs at least one panel")
    w = _W * len(panels)
    body = [line for i, p in enumerate(panels) for line in _panel(p, i * _W)]
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{_H}" viewBox="0 0 {w} {_H}" '
            f'font-family="sans-serif">\n<rect width="{w}" height="{_H}" fill="white"/>\n'
            + "\n".join(body) + "\n</svg>\n")
