#!/usr/bin/env python3
"""Mooncake Store benchmark: this project vs the original Mooncake, in the same run.

For each implementation it starts a master (with its embedded HTTP metadata server), a
*holder* process that contributes memory, and a *runner* process without memory that puts
into / gets from the holder's segment (so every byte crosses processes). Both runners execute
the identical workload script ``bench/reference/ref_mooncake_store.py`` through the public
``mooncake.store`` API (ours via ``mooncake_core.compat``). Printed: GB/s (QPS for is_exist)
per row and the ratio ours / original (>= 1.0 is the target; is_exist >= 20k QPS).

The original is measured when ``/work/venvs/mooncake-ref`` (PyPI
``mooncake-transfer-engine-non-cuda``, with its own ``mooncake_master``) exists; override with
``--ref-venv``. One command:

    python3 -m bench.store.bench_store              # ~1-2 minutes on 2 cores
    python3 -m bench.store.bench_store --quick      # fewer repetitions
    python3 -m bench.store.bench_store --force-tcp  # ours without the same-host (process_vm_*) path

By default same-host peers use our process_vm_readv/writev transport (picked automatically,
as docs/transfer-engine.md describes), while the original is driven with protocol "tcp" over loopback.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from mooncake_lab import REPO
from mooncake_lab.store_bench import finish, measure_ours_and_ref, run_workload

WORKLOAD = os.path.join(REPO, "bench", "reference", "ref_mooncake_store.py")


def run_impl(impl: str, python: str, master_cmd: list[str], args, logdir: str) -> dict:
    """Start master + holder, run the workload, return its JSON."""
    return run_workload(impl, python, master_cmd, WORKLOAD, logdir=logdir,
                        holder_args=["--segment", str(args.segment)],
                        runner_args=["--reps", str(args.reps), "--thread-ops", str(args.thread_ops), "--qps-seconds", str(args.qps_seconds)],
                        timeout=args.timeout)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-venv", default="/work/venvs/mooncake-ref",
                    help="venv with the original Mooncake (skipped when absent)")
    ap.add_argument("--no-ref", action="store_true", help="measure only this project")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per row (op counts scale with it)")
    ap.add_argument("--thread-ops", type=int, default=100, help="ops per thread in the 8-thread rows")
    ap.add_argument("--qps-seconds", type=float, default=2.0, help="duration of the is_exist row")
    ap.add_argument("--segment", type=int, default=2 << 30, help="bytes the holder process contributes")
    ap.add_argument("--timeout", type=float, default=600, help="limit for one implementation's run (s)")
    ap.add_argument("--quick", action="store_true", help="reps=1, 40 ops per thread, 1 s of is_exist")
    ap.add_argument("--force-tcp", action="store_true",
                    help="run ours with MC_FORCE_TCP=1 (no same-host shortcut), like the original's tcp")
    ap.add_argument("--json", help="also write the results to this file")
    return ap


def main() -> int:
    ap = build_parser()
    args = ap.parse_args()
    if args.quick:
        args.reps, args.thread_ops, args.qps_seconds = 1, 40, 1.0
    logdir = tempfile.mkdtemp(prefix="mc-bench-store-")
    ours, ref = measure_ours_and_ref(run_impl, args, logdir)

    rows = list(ours["results"])
    print()
    print(f"{'row':34s} {'ours':>12s} {'original':>12s} {'ratio':>7s}")
    print("-" * 68)
    for row in rows:
        unit = "QPS" if "QPS" in row else "GB/s"
        o = ours["results"][row]
        r = ref["results"].get(row) if ref else None
        fmt = (lambda v: f"{v:12.0f}") if unit == "QPS" else (lambda v: f"{v:7.2f} GB/s")
        ratio = f"{o / r:6.2f}x" if r else "   n/a"
        print(f"{row:34s} {fmt(o):>12s} {fmt(r) if r else '':>12s} {ratio:>7s}")
    rc = finish(ours, ref, args.json)
    shutil.rmtree(logdir, ignore_errors=True) if not (ours.get("errors") or (ref or {}).get("errors")) else None
    return rc


if __name__ == "__main__":
    sys.exit(main())
