"""``mooncake_sim``: trace-driven simulation of a P/D cluster under a scheduling policy.

Examples::

    mooncake_sim --trace conversation_trace.jsonl --cache-only --cache-blocks 10000
    mooncake_sim --trace conversation_trace.jsonl --policy conductor,cache_aware,load_balance,random \\
        --prefill 8 --decode 8 --cache-blocks 10000 --plot out/
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable
from pathlib import Path

from mooncake_core.utils.log import get_logger, setup_logging
from mooncake_core.utils.proc import quiet_ctrl_c
from mooncake_proxy.scheduling import CostModel, SloConfig, policy_names

from .cache_only import hit_ratio_curve, prefix_hit_ratio
from .engine import REJECTION_MODES, SimConfig, Simulator
from .metrics import format_summary, summarize
from .trace import load_trace

log = get_logger("mooncake.sim")

DEFAULT_CURVE = "1000,2000,5000,10000,20000,50000,100000,0"


def _policies(s: str) -> list[str]:
    out = [p.strip() for p in s.split(",") if p.strip()]
    known = policy_names()
    bad = [p for p in out if p not in known]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"unknown policy {', '.join(bad) or s!r}; choose from {', '.join(known)}")
    return out


def _nonneg_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def _pos_int(s: str) -> int:
    v = _nonneg_int(s)
    if v == 0:
        raise argparse.ArgumentTypeError("must be >= 1")
    return v


def _pos_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {s}")
    return v


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Show "(default: X)" only where there is a meaningful default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        h = action.help or ""
        d = action.default
        if d not in (None, False, argparse.SUPPRESS) and "%(default)" not in h and action.option_strings:
            h += f" (default: {','.join(d) if isinstance(d, list) else d})"
        return h


EPILOG = """examples:
  mooncake_sim --trace conversation_trace.jsonl --cache-only --cache-blocks 10000
  mooncake_sim --trace conversation_trace.jsonl --policy conductor,cache_aware,load_balance,random \\
      --prefill 10 --decode 6 --cache-blocks 10000 --compute-scale 2 --speed 0.5 --plot out/
  mooncake_sim --trace synthetic_trace.jsonl --policy conductor --ttft-slo 30 --tbt-slo 0.1 \\
      --prediction-horizon 30 --json
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mooncake_sim",
        description="Trace-driven discrete-event simulation of N prefill + M decode instances (each prefill "
                    "with an LRU KV cache, optional shared store) scheduled by the same code as mooncake_proxy.",
        epilog=EPILOG, formatter_class=_Formatter)
    p.add_argument("--trace", required=True, help="Mooncake trace JSONL (timestamp ms, input_length, output_length, "
                                                   "hash_ids per 512-token block)")
    p.add_argument("--policy", type=_policies, default=["conductor"],
                   help=f"scheduling policy, or a comma-separated list to compare: {', '.join(policy_names())}")
    p.add_argument("--prefill", type=_pos_int, default=8, help="number of prefill instances")
    p.add_argument("--decode", type=_pos_int, default=8, help="number of decode instances")
    p.add_argument("--cache-blocks", type=_nonneg_int, default=10000,
                   help="KV cache capacity per prefill instance in 512-token blocks (LRU), 0 = unlimited; with "
                        "--cache-only, the capacity of the single global LRU")
    p.add_argument("--store-blocks", type=_nonneg_int, default=None,
                   help="add a shared store tier (Mooncake Store) of this many blocks, LRU, 0 = unlimited: every "
                        "finished prefill writes its blocks there and the conductor may fetch them; default: no store")
    p.add_argument("--speed", type=_pos_float, default=1.0,
                   help="replay speed: arrival times are divided by this (2 = twice the request rate)")
    p.add_argument("--limit", type=_nonneg_int, default=None, help="use only the first N requests of the trace")
    p.add_argument("--ttft-slo", type=_pos_float, default=None, help="TTFT SLO in seconds (enables early rejection)")
    p.add_argument("--tbt-slo", type=_pos_float, default=None, help="TBT SLO in seconds (enables early rejection)")
    p.add_argument("--prediction-horizon", type=_pos_float, default=None,
                   help="seconds: enable prediction-based early rejection (project decode load to when the "
                        "request's prefill ends, at most this far ahead)")
    p.add_argument("--rejection", choices=REJECTION_MODES, default="early",
                   help="where SLO-breaking requests are rejected: early = on arrival (the scheduler's "
                        "checks); decode = the paper's baseline (Table 3): no TBT check on arrival, a "
                        "request whose decode instance would break --tbt-slo when its prefill ends is "
                        "rejected there (prefill wasted); early+decode = both (default: early)")
    p.add_argument("--profile", default=None,
                   help="cost profile JSON (prefill/decode/transfer coefficients); default: the shipped "
                        "derived LLaMA2-70B on 8xA800 profile")
    p.add_argument("--compute-scale", type=_pos_float, default=1.0,
                   help="multiply all compute times of the profile (2 = an accelerator half as fast)")
    p.add_argument("--replicate-hot", action="store_true",
                   help="conductor: copy hot prefixes into the store tier (needs --store-blocks)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random policy / tie-breaking")
    p.add_argument("--cache-only", action="store_true",
                   help="only compute the prefix hit ratio of one global LRU of --cache-blocks blocks (fast)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--plot", metavar="DIR", default=None,
                   help="write charts to DIR: TTFT CDF per policy, and hit ratio vs cache capacity (PNG with "
                        "matplotlib, else SVG)")
    p.add_argument("--curve", default=DEFAULT_CURVE,
                   help="capacities (blocks, 0 = unlimited) for the hit-ratio-vs-capacity chart")
    p.add_argument("--requests-out", metavar="FILE", default=None,
                   help="write one JSON line per request and policy (arrival, ttft, tbt, instances, cached "
                        "tokens, rejection reason) for your own analysis")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


@quiet_ctrl_c("mooncake_sim")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    try:
        records = load_trace(args.trace, args.limit)
        cost = CostModel.from_file(args.profile) if args.profile else CostModel.default()
    except (OSError, ValueError) as e:
        print(f"mooncake_sim: error: {e}", file=sys.stderr)
        return 2
    if not records:
        print(f"mooncake_sim: error: trace {args.trace} has no requests", file=sys.stderr)
        return 2
    if args.compute_scale != 1.0:
        cost = cost.scaled(args.compute_scale)
    plot_dir = Path(args.plot) if args.plot else None
    if plot_dir:
        plot_dir.mkdir(parents=True, exist_ok=True)

    if args.cache_only:
        st = prefix_hit_ratio(records, args.cache_blocks)
        out = {"mode": "cache-only", "trace": args.trace, **st.to_dict()}
        if plot_dir:
            curve = hit_ratio_curve(records, _capacities(args.curve))
            from .plot import plot_hit_ratio_curve
            out["plots"] = [str(plot_hit_ratio_curve(curve, plot_dir / "hit_ratio_vs_capacity.png"))]
        if args.json:
            print(json.dumps(out))
        else:
            cap = args.cache_blocks or "unlimited"
            print(f"{len(records)} requests, global LRU of {cap} blocks: prefix hit ratio "
                  f"{100 * st.hit_ratio:.2f}% ({st.hit_tokens}/{st.total_tokens} tokens)")
        return 0

    slo = SloConfig(ttft_s=args.ttft_slo, tbt_s=args.tbt_slo, prediction_horizon_s=args.prediction_horizon)
    results = {}
    summaries = {}
    show = not args.no_progress and len(records) * len(args.policy) >= 2000
    for pol in args.policy:
        cfg = SimConfig(policy=pol, prefill=args.prefill, decode=args.decode, cache_blocks=args.cache_blocks,
                        store_blocks=args.store_blocks, speed=args.speed, slo=slo, seed=args.seed,
                        replicate_hot=args.replicate_hot and pol == "conductor",
                        rejection=args.rejection)
        sim = Simulator(cfg, cost)
        bar = None
        progress: Callable[[int], None] | None = None
        if show:
            from tqdm import tqdm
            bar = tqdm(total=len(records), desc=pol, unit="req", file=sys.stderr, leave=False)

            def show_progress(n: int, bar: Any = bar) -> None:
                bar.update(n - bar.n)
            progress = show_progress
        res = sim.run(records, progress)
        if bar is not None:
            bar.close()
        results[pol] = res
        summaries[pol] = summarize(res)
        log.debug("simulated", extra={"policy": pol, "requests": len(records), "wall_s": round(res.wall_time, 3)})
    if args.requests_out:
        _write_requests(args.requests_out, results)
    plots = []
    if plot_dir:
        from .plot import plot_hit_ratio_curve, plot_ttft_cdf
        plots.append(str(plot_ttft_cdf(results, plot_dir / "ttft_cdf.png",
                                       f"TTFT CDF — {Path(args.trace).name}, {args.prefill}P/{args.decode}D")))
        plots.append(str(plot_hit_ratio_curve(hit_ratio_curve(records, _capacities(args.curve)),
                                              plot_dir / "hit_ratio_vs_capacity.png")))
    if args.json:
        if len(summaries) == 1:
            out = next(iter(summaries.values()))
        else:
            out = {"policies": summaries}
        out = {**out, "trace": args.trace}
        if plots:
            out["plots"] = plots
        print(json.dumps(out))
    else:
        for s in summaries.values():
            print(format_summary(s))
        if len(summaries) > 1:
            base = summaries[args.policy[0]]["ttft_mean"]
            if base:
                print("mean TTFT relative to " + args.policy[0] + ": " + ", ".join(
                    f"{p} {s['ttft_mean'] / base:.2f}x" for p, s in summaries.items() if s["ttft_mean"] is not None))
        for pl in plots:
            print(f"wrote {pl}")
    return 0


def _write_requests(path: str, results: dict) -> None:
    import dataclasses
    import math

    with open(path, "w") as f:
        for pol, res in results.items():
            for o in res.outcomes:
                d = {"policy": pol, **dataclasses.asdict(o)}
                f.write(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v)
                                    for k, v in d.items()}) + "\n")


def _capacities(s: str) -> list[int]:
    try:
        caps = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"mooncake_sim: error: --curve must be comma-separated integers, got {s!r}") from None
    if any(c < 0 for c in caps):
        raise SystemExit("mooncake_sim: error: --curve capacities must be >= 0")
    return caps


if __name__ == "__main__":
    sys.exit(main())
