"""Summary statistics of a simulation: hit ratio, TTFT/TBT percentiles, SLO attainment, goodput."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .engine import SimResult

__all__ = ["summarize", "format_summary"]


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else math.nan


def summarize(res: SimResult) -> dict[str, Any]:
    """One flat dict (JSON-ready; NaN → None).

    ``hit_ratio``: token-weighted reused-prefix tokens / prompt tokens over admitted requests.
    ``slo_attainment``: fraction of ALL requests (rejected ones count as misses) that completed
    within both SLOs (when no SLO is set, the fraction completed); ``slo_violations``: admitted
    requests that completed but missed an SLO (work early rejection should have saved).
    ``goodput_rps``: requests within SLO per simulated second.
    """
    cfg = res.config
    outs = res.outcomes
    done = [o for o in outs if not o.rejected and not math.isnan(o.finish)]
    ttft = np.array([o.ttft for o in done], dtype=float)
    tbt = np.array([o.tbt for o in done if not math.isnan(o.tbt)], dtype=float)
    admitted = [o for o in outs if not o.rejected]
    in_tok = sum(o.input_length for o in admitted)
    hit_tok = sum(o.cached_tokens for o in admitted)
    ttft_slo, tbt_slo = cfg.slo.ttft_s, cfg.slo.tbt_s

    def ok(o) -> bool:
        if ttft_slo is not None and o.ttft > ttft_slo:
            return False
        if tbt_slo is not None and not math.isnan(o.tbt) and o.tbt > tbt_slo:
            return False
        return True

    good = [o for o in done if ok(o)]
    span = (outs[-1].arrival - outs[0].arrival) if len(outs) > 1 else 0.0
    span = max(span, res.sim_time - (outs[0].arrival if outs else 0.0), 1e-9)
    d: dict[str, Any] = {
        "policy": cfg.policy, "prefill": cfg.prefill, "decode": cfg.decode, "cache_blocks": cfg.cache_blocks,
        "speed": cfg.speed, "requests": len(outs), "completed": len(done),
        "rejected": sum(1 for o in outs if o.rejected),
        "hit_ratio": hit_tok / in_tok if in_tok else 0.0,
        "remote_fetches": sum(1 for o in admitted if o.remote_blocks),
        "ttft_mean": float(ttft.mean()) if ttft.size else math.nan,
        "ttft_p50": _pct(ttft, 50), "ttft_p90": _pct(ttft, 90), "ttft_p99": _pct(ttft, 99),
        "tbt_mean": float(tbt.mean()) if tbt.size else math.nan,
        "tbt_p50": _pct(tbt, 50), "tbt_p90": _pct(tbt, 90), "tbt_p99": _pct(tbt, 99),
        "slo_attainment": len(good) / len(outs) if outs else 0.0,
        "slo_violations": len(done) - len(good),
        "goodput_rps": len(good) / span,
        "goodput_tokens_per_s": sum(o.output_length for o in good) / span,
        "sim_time_s": res.sim_time, "wall_time_s": res.wall_time,
        "ttft_slo": ttft_slo, "tbt_slo": tbt_slo,
    }
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def format_summary(s: dict[str, Any]) -> str:
    def f(v, unit="s", scale=1.0):
        return "n/a" if v is None else f"{v * scale:.3f}{unit}"

    lines = [
        f"policy {s['policy']}: {s['prefill']}P/{s['decode']}D, "
        f"cache {s['cache_blocks'] or 'unlimited'} blocks/instance, speed x{s['speed']:g}",
        f"  requests {s['requests']}  completed {s['completed']}  rejected {s['rejected']}  "
        f"hit ratio {100 * s['hit_ratio']:.2f}%  remote fetches {s['remote_fetches']}",
        f"  TTFT mean {f(s['ttft_mean'])}  p50 {f(s['ttft_p50'])}  p90 {f(s['ttft_p90'])}  p99 {f(s['ttft_p99'])}",
        f"  TBT  mean {f(s['tbt_mean'], 'ms', 1e3)}  p50 {f(s['tbt_p50'], 'ms', 1e3)}  "
        f"p90 {f(s['tbt_p90'], 'ms', 1e3)}  p99 {f(s['tbt_p99'], 'ms', 1e3)}",
        f"  SLO attainment {100 * s['slo_attainment']:.2f}% (admitted but missed: {s['slo_violations']})  "
        f"goodput {s['goodput_rps']:.3f} req/s ({s['goodput_tokens_per_s']:.1f} output tok/s)",
        f"  simulated {s['sim_time_s']:.1f}s in {s['wall_time_s']:.2f}s wall",
    ]
    return "\n".join(lines)
