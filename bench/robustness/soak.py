#!/usr/bin/env python3
"""Soak: steady store and Transfer Engine load, no faults; RSS and open fds of every
process sampled over time, to show they stay flat (or say exactly what grows).

Store: a ``mooncake_master`` and ``--clients`` store clients, each contributing a segment
and running ``--threads`` load threads at ``--rate`` ops/s each (the chaos worker: checked
put/upsert/get/remove, every read classified). Transfer Engine: one target process and
``--te-initiators`` initiators writing a pattern into the target and reading it back at
``--te-rate`` rounds/s each (the first over tcp, the others with the engine's automatic
choice: shared memory between local processes). Both through the public APIs only.

    python3 -m bench.robustness.soak --duration 600            # 10 minutes, ours
    python3 -m bench.robustness.soak --duration 600 --impl ref # the original 0.3.13 under the same load
    python3 -m bench.robustness.soak --duration 60 --json soak.json

Slopes are least squares over the samples after ``--skip`` seconds (allocators and
connection pools warm up first). A process is called flat when its RSS grew by less than
``--flat-mb`` MB (and 3 %) and its fd count by at most ``--flat-fds`` between the first
and the last steady sample. Exit code 1 when any process is not flat, or a read was foreign
or a TE read-back differed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

from mooncake_lab.chaos import checker
from mooncake_lab.chaos.cluster import Cluster, ClusterConfig, Impl, Slot
from mooncake_lab.chaos.oplog import read_records
from mooncake_lab.chaos.report import series_summary
from mooncake_lab.chaos.stallwatch import StallWatch
from mooncake_core.utils.log import setup_logging

S = 1_000_000_000
TE_WORKER = ["-m", "mooncake_lab.chaos.te_worker"]  # the cluster env puts the checkout on PYTHONPATH


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["ours", "ref"], default="ours", help="this project or the original 0.3.13")
    p.add_argument("--ref-venv", default="/work/venvs/mooncake-ref", help="venv of the original (with --impl ref)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--clients", type=int, default=3, help="store client processes")
    p.add_argument("--threads", type=int, default=2, help="load threads per store client")
    p.add_argument("--rate", type=float, default=50.0, help="store ops/s per load thread")
    p.add_argument("--keys", type=int, default=500, help="store key space")
    p.add_argument("--max-value", type=int, default=256 << 10, help="largest store value, bytes")
    p.add_argument("--segment", type=int, default=32 << 20, help="bytes each store client contributes")
    p.add_argument("--te-initiators", type=int, default=2, help="Transfer Engine initiator processes")
    p.add_argument("--te-rate", type=float, default=50.0, help="TE write+read-back rounds/s per initiator")
    p.add_argument("--te-region", type=int, default=64 << 20, help="bytes the TE target registers")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between RSS/fd samples")
    p.add_argument("--skip", type=float, default=60.0, help="warm-up seconds left out of slopes and start values")
    p.add_argument("--flat-mb", type=float, default=5.0, help="RSS growth (MB) still called flat")
    p.add_argument("--flat-fds", type=int, default=2, help="fd growth still called flat")
    p.add_argument("--json", default="", help="write the full report here")
    p.add_argument("--workdir", default="", help="keep logs here (default: a temp dir, removed when clean)")
    p.add_argument("--progress-every", type=float, default=30.0, help="seconds between progress lines")
    return p


def start_te(cluster: Cluster, impl: Impl, args: argparse.Namespace) -> None:
    env = cluster._env({"PYTHONUNBUFFERED": "1"})
    tgt = Slot("te-target", "te", 0, lambda inc: [impl.python, *TE_WORKER, "target", "--impl", impl.name,
                                                  "--region", str(args.te_region)],
               env, cluster.log_dir, piped=True)
    cluster.extra.append(tgt)
    tgt.start()
    if not tgt.ready.wait(60):
        raise RuntimeError(f"TE target did not start (log {cluster.log_dir}/te-target-i0.log)")
    info = tgt.info
    for i in range(args.te_initiators):
        ienv = dict(env, MC_FORCE_TCP="1") if i == 0 else env
        cmd = [impl.python, *TE_WORKER, "initiator", "--impl", impl.name, "--segment", info["ready"],
               "--addr", str(info["addr"]), "--region", str(args.te_region), "--initiators", str(args.te_initiators),
               "--index", str(i), "--rate", str(args.te_rate)]
        s = Slot(f"te-init{i}{'-tcp' if i == 0 else ''}", "te", i, lambda inc, c=cmd: c, ienv, cluster.log_dir,
                 piped=True)
        cluster.extra.append(s)
        s.start()
    deadline = time.monotonic() + 60
    for s in cluster.extra[1:]:
        while not s.ready.wait(0.5):
            if not s.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{s.name} did not start (log {cluster.log_dir}/{s.name}-i0.log)")


def verdict(row: dict[str, Any], args: argparse.Namespace) -> str:
    grew = row["rss_mb_end"] - row["rss_mb_start"]
    fds = row["fds_end"] - row["fds_start"]
    flat = (grew < args.flat_mb or grew < 0.03 * row["rss_mb_start"]) and fds <= args.flat_fds
    return "flat" if flat else "GROWS"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(os.environ.get("MC_LOG_LEVEL", "WARNING"))
    try:
        impl = Impl.ours() if args.impl == "ours" else Impl.ref(args.ref_venv)
    except FileNotFoundError as e:
        print(f"soak: {e}", file=sys.stderr)
        return 2
    workdir = args.workdir or tempfile.mkdtemp(prefix="mc-soak-")
    ccfg = ClusterConfig(clients=args.clients, threads=args.threads, keys=args.keys, max_value=args.max_value,
                         segment=args.segment, rate=args.rate, force_tcp=True, client_ttl_s=10)
    cluster = Cluster(impl, ccfg, workdir, sample_every=args.sample_every)
    print(f"== soak {impl.name}: {args.duration:.0f}s; store {args.clients} clients x {args.threads} threads "
          f"x {args.rate:g} ops/s; TE {args.te_initiators} initiators x {args.te_rate:g} rounds/s "
          f"(logs in {workdir})", flush=True)
    stop = threading.Event()
    stalls = StallWatch().start()
    try:
        cluster.start()
        start_te(cluster, impl, args)
        t0 = time.monotonic_ns()

        def progress() -> None:
            while not stop.wait(args.progress_every):
                el = (time.monotonic_ns() - t0) / S
                store = sum(c.progress.get("p", 0) for c in cluster.clients)
                te = sum(s.progress.get("p", 0) for s in cluster.extra)
                rss = {x[1]: x[3] for x in cluster.samples[-len(cluster.extra + cluster.clients + cluster.masters):]}
                print(f"[soak {el:5.0f}/{args.duration:.0f}s] store ops {store}, TE rounds {te}, "
                      f"RSS MB {', '.join(f'{k} {v / 1024:.0f}' for k, v in sorted(rss.items()))}", flush=True)

        threading.Thread(target=progress, daemon=True).start()
        time.sleep(args.duration)
        cluster.sample()
        t_end_load = time.monotonic_ns()
        stop.set()
        te_stats = {s.name: dict(s.progress) for s in cluster.extra if s.name != "te-target"}
        cluster.stop_clients()
        t_end = time.monotonic_ns()
    finally:
        stop.set()
        stalls.stop()
        cluster.stop()
    samples = [s for s in cluster.samples if s[0] <= t_end_load]
    series = series_summary(samples, skip_s=args.skip)
    exits = [e for e in cluster.events]
    ops = checker.load_ops(read_records(cluster.oplog_dir))
    deaths = {(c.index, life.incarnation): life.t_end or t_end for c in cluster.clients for life in c.lives}
    check = checker.check(ops, checker.Timeline(t_start=t0, t_end=t_end, deaths=deaths, stalls=stalls.spans))
    te_total = {k: sum(v.get(k, 0) for v in te_stats.values()) for k in ("p", "e", "bytes", "bad")}
    print()
    print(f"{'process':<16}{'RSS MB start':>13}{'end':>8}{'MB/min':>9}{'fds start':>11}{'end':>6}"
          f"{'fds/min':>9}  verdict")
    bad = False
    for name, row in series.items():
        v = verdict(row, args)
        bad |= v != "flat"
        row["verdict"] = v
        print(f"{name:<16}{row['rss_mb_start']:>13.1f}{row['rss_mb_end']:>8.1f}{row['rss_mb_per_min'] or 0:>9.3f}"
              f"{row['fds_start']:>11}{row['fds_end']:>6}{row['fds_per_min'] or 0:>9.3f}  {v}")
    print(f"\nstore: {check['ops_total']} ops, reads {check['reads']}, foreign {check['foreign_bytes']}, "
          f"hangs {check['hangs']}; TE: {te_total['p']} rounds, {te_total['bytes'] / 1e9:.2f} GB moved, "
          f"{te_total['e']} errors, {te_total['bad']} bad read-backs; unexpected exits: {len(exits)}; "
          f"machine stalls {stalls.summary()}; load average {open('/proc/loadavg').read().split()[:3]}")
    bad |= bool(check["foreign_bytes"] or check["hangs"] or te_total["bad"] or exits)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"impl": impl.name, "duration_s": args.duration, "skip_s": args.skip,
                       "series": series, "store": check, "te": te_stats, "exits": exits,
                       "machine_stalls": stalls.summary(),
                       "load_average": open("/proc/loadavg").read().split()[:3],
                       "argv": sys.argv[1:] if argv is None else argv}, f, indent=1)
        print(f"report written to {args.json}")
    if not bad and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
