#!/usr/bin/env python
"""Simulator and scheduler speed, and how close the simulated TTFTs come to the paper's.

One command (≈ 15 s on a quiet core):

    python3 -m bench.scheduling.bench_simulator [--trace PATH] [--quick]

Prints, measured in this run:
1. wall time of a full-trace simulation per policy against the 60 s budget, and against a
   reference measured in the same run: a bare LRU replay of the same trace (``--cache-only``
   work, the floor for anything that touches every block);
2. scheduler decision latency (µs per ``schedule()`` call) per policy at 16 prefill
   instances with warm caches — the proxy pays this per request;
3. mean TTFT per policy in the paper's setting (conversation trace, 16 nodes = 10 prefill +
   6 decode, 10k-block caches, compute ×2, half-speed arrivals: see
   docs/scheduler-and-simulator.md) next to the paper's 3.07 / 3.58 / 5.27 / 19.65 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from mooncake_proxy.scheduling import ClusterState, CostModel, InstanceInfo, RequestInfo, make_scheduler
from mooncake_proxy.sim import SimConfig, load_trace, prefix_hit_ratio, simulate, summarize

PAPER = {"conductor": 3.07, "cache_aware": 3.58, "load_balance": 5.27, "random": 19.65}
ORDER = list(PAPER)


def _default_trace() -> Path:
    for d in (Path(__file__).resolve().parents[2] / "shared" / "traces", Path("/work/shared/traces")):
        if (d / "conversation_trace.jsonl").exists():
            return d / "conversation_trace.jsonl"
    return Path("conversation_trace.jsonl")


def bench_decision_latency(recs, n_calls: int) -> dict[str, float]:
    out = {}
    for pol in ORDER:
        cl = ClusterState(512)
        for i in range(16):
            cl.add_instance(InstanceInfo(f"p{i}", "prefill", cache_capacity_blocks=10_000))
        for i in range(8):
            cl.add_instance(InstanceInfo(f"d{i}", "decode"))
        s = make_scheduler(pol, cl, CostModel.default())
        # Warm: route the first 2000 requests so caches and queues are realistic.
        for n, r in enumerate(recs[:2000]):
            req = RequestInfo(str(n), r.input_length, r.hash_ids, r.output_length)
            d = s.schedule(req, r.timestamp / 1000)
            cl.on_scheduled(d, req, r.timestamp / 1000)
            if n % 4 == 0:
                cl.on_prefill_done(d.prefill_id, req, r.timestamp / 1000)
        probe = [RequestInfo(f"q{n}", r.input_length, r.hash_ids, r.output_length) for n, r in
                 enumerate(recs[2000:2000 + n_calls])]
        t0 = time.perf_counter()
        for req in probe:
            s.schedule(req, 700.0)
        out[pol] = (time.perf_counter() - t0) / len(probe) * 1e6
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=_default_trace(), help="conversation trace JSONL")
    ap.add_argument("--quick", action="store_true", help="first 3000 requests only (smoke run)")
    args = ap.parse_args()
    recs = load_trace(args.trace, 3000 if args.quick else None)
    print(f"trace {args.trace.name}: {len(recs)} requests")

    # 1. Reference: bare LRU replay of the same trace.
    ref = []
    for _ in range(3):
        t0 = time.perf_counter()
        prefix_hit_ratio(recs, 10_000)
        ref.append(time.perf_counter() - t0)
    ref_s = min(ref)
    print(f"\n[1] full-trace simulation wall time (8P/8D, 10k blocks; budget 60 s); "
          f"reference bare LRU replay {ref_s:.3f} s")
    sim_times = {}
    for pol in ORDER:
        res = simulate(recs, SimConfig(policy=pol, prefill=8, decode=8, cache_blocks=10_000))
        sim_times[pol] = res.wall_time
        print(f"    {pol:<13} {res.wall_time:6.2f} s  = {res.wall_time / ref_s:5.1f}x the LRU replay, "
              f"{60 / res.wall_time:6.1f}x under budget")

    # 2. Decision latency.
    lat = bench_decision_latency(recs, 500 if args.quick else 2000)
    print("\n[2] scheduler decision latency, 16 prefill + 8 decode instances, warm caches")
    for pol, us in lat.items():
        print(f"    {pol:<13} {us:8.1f} us/decision")

    # 3. Paper comparison.
    print("\n[3] mean TTFT, conversation trace, 10P+6D (16 nodes), 10k blocks/instance, compute x2, speed x0.5")
    cost = CostModel.default().scaled(2.0)
    ttft = {}
    for pol in ORDER:
        s = summarize(simulate(recs, SimConfig(policy=pol, prefill=10, decode=6, cache_blocks=10_000, speed=0.5),
                               cost))
        ttft[pol] = s["ttft_mean"]
    rnd = [summarize(simulate(recs, SimConfig(policy="random", prefill=10, decode=6, cache_blocks=10_000,
                                              speed=0.5, seed=k), cost))["ttft_mean"] for k in range(1, 4)]
    print(f"    {'policy':<13} {'ours':>8} {'paper':>8} {'ours/cond':>10} {'paper/cond':>11}")
    for pol in ORDER:
        print(f"    {pol:<13} {ttft[pol]:7.2f}s {PAPER[pol]:7.2f}s {ttft[pol] / ttft['conductor']:9.2f}x "
              f"{PAPER[pol] / PAPER['conductor']:10.2f}x")
    print(f"    random over seeds 0-3: {', '.join(f'{x:.2f}' for x in [ttft['random'], *rnd])} s "
          f"(mean {statistics.mean([ttft['random'], *rnd]):.2f} s)")
    print(json.dumps({"requests": len(recs), "lru_replay_s": ref_s, "sim_wall_s": sim_times,
                      "decision_us": lat, "ttft_mean_s": ttft, "paper_ttft_mean_s": PAPER,
                      "random_other_seeds_s": rnd}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
