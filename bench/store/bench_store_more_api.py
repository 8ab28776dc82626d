#!/usr/bin/env python3
"""Benchmark of the extra store API (tensor into/from, TP, ranged reads, put/get sessions):
this project vs the original Mooncake, in the same run.

For each implementation: a master (embedded HTTP metadata server), a *holder* process that
contributes memory, and a *runner* without memory executing ``ref_mooncake_store_more_api.py``
through the public ``mooncake.store`` API, so every byte crosses processes. Printed per row:
GB/s for ours and the original and the ratio ours / original. Two rows marked ``(ref)`` are
in-run references for the zero-copy claims (``get`` + slicing vs ``get_into_ranges``,
``put_from`` vs a put session).

The original is measured when ``/work/venvs/mooncake-ref`` exists (it imports this
interpreter's torch). One command:

    python3 -m bench.store.bench_store_more_api            # ~1 minute on 2 cores
    python3 -m bench.store.bench_store_more_api --reps 1   # quicker
    python3 -m bench.store.bench_store_more_api --force-tcp  # ours over loopback TCP too (no process_vm_*)

By default same-host peers use our process_vm_readv/writev transport (picked automatically),
while the original is driven with protocol "tcp" over loopback.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from mooncake_lab import REPO
from mooncake_lab.store_bench import finish, measure_ours_and_ref, run_workload

WORKLOAD = os.path.join(REPO, "bench", "reference", "ref_mooncake_store_more_api.py")


def run_impl(impl: str, python: str, master_cmd: list[str], args, logdir: str) -> dict:
    """Start master + holder, run the workload (every wait bounded), return its JSON."""
    import torch

    torch_path = os.path.dirname(os.path.dirname(torch.__file__))
    return run_workload(impl, python, master_cmd, WORKLOAD, logdir=logdir,
                        holder_args=["--segment", str(args.segment)],
                        runner_args=["--reps", str(args.reps), "--torch-path", torch_path],
                        timeout=args.timeout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-venv", default="/work/venvs/mooncake-ref",
                    help="venv with the original Mooncake (skipped when absent)")
    ap.add_argument("--no-ref", action="store_true", help="measure only this project")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per row (the median is reported)")
    ap.add_argument("--segment", type=int, default=2 << 30, help="bytes the holder process contributes")
    ap.add_argument("--timeout", type=float, default=600, help="limit for one implementation's run (s)")
    ap.add_argument("--force-tcp", action="store_true",
                    help="run ours with MC_FORCE_TCP=1 (no same-host process_vm_* shortcut), like the original's tcp")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    logdir = tempfile.mkdtemp(prefix="mc-bench-more-api-")
    ours, ref = measure_ours_and_ref(run_impl, args, logdir)
    print()
    print(f"{'row (GB/s)':36s} {'ours':>8s} {'original':>9s} {'ratio':>7s}")
    print("-" * 64)
    for row, o in ours["results"].items():
        r = (ref or {}).get("results", {}).get(row)
        print(f"{row:36s} {o:8.2f} {f'{r:9.2f}' if r else '':>9s} {f'{o / r:6.2f}x' if r else '   n/a':>7s}")
    return finish(ours, ref, args.json)


if __name__ == "__main__":
    sys.exit(main())
