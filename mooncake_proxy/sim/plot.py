"""Charts of simulation results: PNG with matplotlib (Agg backend, no display needed), or the
same chart as SVG (:mod:`mooncake_proxy.svgplot`) where matplotlib is not installed -- the
returned path says which was written."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..svgplot import Panel, cdf_points, render_svg
from .cache_only import HitStats
from .engine import SimResult

__all__ = ["plot_ttft_cdf", "plot_hit_ratio_curve", "ttft_cdf_panel"]


def _plt():
    """pyplot, or None without matplotlib (the caller then writes SVG)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _svg(panel: Panel, path: str | Path) -> Path:
    out = Path(path).with_suffix(".svg")
    out.write_text(render_svg([panel]))
    return out


def ttft_cdf_panel(results: Mapping[str, SimResult], title: str = "") -> Panel:
    """The TTFT CDF per policy as an SVG panel (completed requests), e.g. to draw next to live runs."""
    series = {}
    for name, res in results.items():
        t = [o.ttft for o in res.outcomes if not o.rejected and o.ttft == o.ttft]
        if t:
            series[f"{name} (mean {sum(t) / len(t):.2f}s)"] = cdf_points(t)
    return Panel(title or "TTFT CDF by scheduling policy", series, "TTFT (s, log scale)", "fraction of requests",
                 log_x=True)


def _finish(plt, fig, ax, path: str | Path) -> Path:
    """Shared look (log grid, legend) and save-then-close, so figures never leak memory."""
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_ttft_cdf(results: Mapping[str, SimResult], path: str | Path, title: str = "") -> Path:
    """TTFT CDF, one line per policy (completed requests)."""
    plt = _plt()
    if plt is None:
        return _svg(ttft_cdf_panel(results, title), path)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, res in results.items():
        t = np.sort([o.ttft for o in res.outcomes if not o.rejected and o.ttft == o.ttft])
        if t.size:
            ax.plot(t, np.arange(1, t.size + 1) / t.size, label=f"{name} (mean {t.mean():.2f}s)")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title or "TTFT CDF by scheduling policy")
    return _finish(plt, fig, ax, path)


def plot_hit_ratio_curve(curve: Sequence[HitStats], path: str | Path, title: str = "") -> Path:
    """Prefix hit ratio vs global LRU capacity (unlimited drawn as a dashed line)."""
    plt = _plt()
    if plt is None:
        finite = [s for s in curve if s.cache_blocks > 0]
        return _svg(Panel(title or "Prefix cache hit ratio vs capacity",
                          {"LRU": [(s.cache_blocks, 100 * s.hit_ratio) for s in finite]},
                          "cache capacity (512-token blocks)", "prefix hit ratio (% of prompt tokens)",
                          log_x=True, hlines={f"unlimited ({100 * s.hit_ratio:.1f}%)": 100 * s.hit_ratio
                                              for s in curve if s.cache_blocks == 0}), path)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    finite = [s for s in curve if s.cache_blocks > 0]
    unlimited = [s for s in curve if s.cache_blocks == 0]
    if finite:
        ax.plot([s.cache_blocks for s in finite], [100 * s.hit_ratio for s in finite], marker="o", label="LRU")
        ax.set_xscale("log")
    for s in unlimited:
        ax.axhline(100 * s.hit_ratio, linestyle="--", color="gray", label=f"unlimited ({100 * s.hit_ratio:.1f}%)")
    ax.set_xlabel("cache capacity (512-token blocks)")
    ax.set_ylabel("prefix hit ratio (% of prompt tokens)")
    ax.set_title(title or "Prefix cache hit ratio vs capacity")
    return _finish(plt, fig, ax, path)
