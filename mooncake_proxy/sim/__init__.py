"""Trace-driven simulator of a P/D-disaggregated cluster (``mooncake_sim``), sharing the
scheduler with the live proxy. See :mod:`.engine` for the model, :mod:`.cache_only` for the
global-LRU hit ratio, :mod:`.cli` for the command line."""

from .cache_only import HitStats, hit_ratio_curve, prefix_hit_ratio
from .engine import RequestOutcome, SimConfig, SimResult, Simulator, simulate
from .metrics import format_summary, summarize
from .trace import TRACE_BLOCK_SIZE, TraceRecord, load_trace

__all__ = ["HitStats", "hit_ratio_curve", "prefix_hit_ratio", "RequestOutcome", "SimConfig", "SimResult",
           "Simulator", "simulate", "format_summary", "summarize", "TRACE_BLOCK_SIZE", "TraceRecord", "load_trace"]
