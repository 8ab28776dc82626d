#!/usr/bin/env python3
"""The store at scale: small objects, big batches, many clients -- this project vs the original
Mooncake, side by side in one run (issue 18).

For each implementation (ours, then the original from ``--ref-venv`` with its own
``mooncake_master``), the same workload script ``bench/reference/ref_mooncake_store_scale.py`` runs
through the public ``mooncake.store`` API:

* **fill**: one client with a ``--segment`` (1 GiB) segment fills the store with ``--value``
  byte objects by ``put_batch`` of ``--batch`` fresh keys; at every ``--checkpoints`` count it
  times single ``put`` (fresh keys), ``get`` and ``is_exist`` (p50/p99 of ``--probes`` calls)
  and reads the master's RSS from /proc.
* **clients** (``--clients``): a holder with the memory, then N client processes (no memory)
  doing put+get of ``--value`` bytes (or put_batch+get_batch of ``--client-batch`` keys)
  for ``--client-seconds``; aggregate ops/s (one op = one key). The row
  ``8+1 stopped`` adds a 9th client that is SIGSTOPped once connected: a paused client must not
  delay the others.

Printed: one row per measurement, ours, original and ``x`` = how many times better ours is
(original/ours for times, ours/original for rates: > 1 means ours is better). Ratios come from
the same run, so load from other processes on the box mostly cancels; repeat a run when a ratio
looks off. One command (about 2-3 minutes on 2 shared cores):

    python3 -m bench.store.bench_store_scale
    python3 -m bench.store.bench_store_scale --checkpoints 0 100000 1000000 --segment 2147483648
    python3 -m bench.store.bench_store_scale --batch 100 --no-clients     # another batch size
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from mooncake_lab import REPO
from mooncake_lab.store_bench import measure_ours_and_ref, start_master, stop_all

from mooncake_core.utils.proc import readline_timeout
from mooncake_core.utils.progress import Progress

WORKLOAD = os.path.join(REPO, "bench", "reference", "ref_mooncake_store_scale.py")


def _json_line(out: str) -> dict[str, Any]:
    return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])


def run_fill(impl: str, python: str, master_cmd: list[str], args, logdir: str) -> dict[str, Any]:
    procs: list[subprocess.Popen] = []
    try:
        common = start_master(impl, master_cmd, logdir, procs)
        with open(os.path.join(logdir, f"{impl}-fill.log"), "w") as log:
            p = subprocess.Popen([python, WORKLOAD, "fill", *common, "--segment", str(args.segment),
                                  "--value", str(args.value), "--batch", str(args.batch),
                                  "--probes", str(args.probes), "--master-pid", str(procs[0].pid),
                                  "--checkpoints", *map(str, args.checkpoints)],
                                 stdout=subprocess.PIPE, stderr=log, text=True)
            procs.append(p)
            result = _follow_fill(p, impl, args)
            p.wait(timeout=30)
        if p.returncode != 0 or result is None:
            raise RuntimeError(f"{impl} fill failed with {p.returncode} (logs in {logdir})")
        return result
    finally:
        stop_all(procs)


def _follow_fill(p: subprocess.Popen, impl: str, args) -> dict[str, Any] | None:
    """Read the fill worker's ``{"progress": n}`` lines into a progress line on stderr (once a
    second at most) until its result line; None when it ends without one. The whole fill is
    bounded by ``--timeout`` (the worker is killed past it)."""
    total = args.checkpoints[-1] + args.probes  # the worker probes with fresh keys at each checkpoint
    prog = Progress(f"[{impl}] fill", total, unit="objects")
    deadline = time.monotonic() + args.timeout
    while True:
        line = readline_timeout(p, max(deadline - time.monotonic(), 0.1), what=f"{impl} fill")
        if not line:
            return None
        msg = json.loads(line) if line.startswith("{") else {}
        if "progress" in msg:
            prog.add(int(msg["progress"]) - prog.done)
        elif "fill" in msg:
            prog.add(int(msg["fill"]["objects"]) - prog.done)
            prog.finish()
            return msg


def run_clients(impl: str, python: str, master_cmd: list[str], args, logdir: str, n: int,
                stopped: int) -> dict[str, Any]:
    """Aggregate put+get ops/s of ``n`` client processes (plus ``stopped`` SIGSTOPped ones)."""
    procs: list[subprocess.Popen] = []
    go = os.path.join(logdir, f"{impl}-go-{n}-{stopped}")
    paused: list[subprocess.Popen] = []
    try:
        common = start_master(impl, master_cmd, logdir, procs)
        with open(os.path.join(logdir, f"{impl}-holder.log"), "a") as log:
            holder = subprocess.Popen([python, WORKLOAD, "holder", *common, "--segment", str(args.segment)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        procs.append(holder)
        if "ready" not in readline_timeout(holder, 60, what=f"{impl} holder"):
            raise RuntimeError(f"{impl} holder failed (logs in {logdir})")
        workers = []
        with open(os.path.join(logdir, f"{impl}-clients.log"), "a") as log:
            for _ in range(n + stopped):
                w = subprocess.Popen([python, WORKLOAD, "clients", *common, "--value", str(args.value),
                                      "--seconds", str(args.client_seconds), "--go", go,
                                      "--batch", str(args.client_batch)],
                                     stdout=subprocess.PIPE, stderr=log, text=True)
                procs.append(w)
                workers.append(w)
        for w in workers:
            if "ready" not in readline_timeout(w, 60, what=f"{impl} client"):
                raise RuntimeError(f"{impl} client failed (logs in {logdir})")
        for w in workers[n:]:
            w.send_signal(signal.SIGSTOP)
            paused.append(w)
        open(go, "w").close()
        total, errors = 0, 0
        for w in workers[:n]:
            out, _ = w.communicate(timeout=args.client_seconds + 60)
            res = _json_line(out)
            total += res["ops"]
            errors += res["errors"]
        return {"ops_per_s": total / args.client_seconds, "errors": errors}
    finally:
        for w in paused:
            w.send_signal(signal.SIGCONT)
        stop_all(procs)


def measure(impl: str, python: str, master_cmd: list[str], args, logdir: str) -> dict[str, Any]:
    print(f"[{impl}] fill to {args.checkpoints[-1]:,} objects of {args.value} B by put_batch of {args.batch} ...",
          flush=True)
    t0 = time.perf_counter()
    res: dict[str, Any] = {"fill": run_fill(impl, python, master_cmd, args, logdir), "clients": {}}
    print(f"[{impl}] fill done in {time.perf_counter() - t0:.0f} s", flush=True)
    if not args.no_clients:
        for n in args.clients:
            res["clients"][str(n)] = run_clients(impl, python, master_cmd, args, logdir, n, 0)
            print(f"[{impl}] {n} clients: {res['clients'][str(n)]}", flush=True)
        if args.clients:
            n = max(args.clients)
            res["clients"][f"{n}+1 stopped"] = run_clients(impl, python, master_cmd, args, logdir, n, 1)
            print(f"[{impl}] {n}+1 stopped: {res['clients'][f'{n}+1 stopped']}", flush=True)
    return res


def rows(res: dict[str, Any], args) -> list[tuple[str, float, str, bool]]:
    """(row, value, unit, higher_is_better) in print order."""
    out: list[tuple[str, float, str, bool]] = []
    fill = res["fill"]
    out.append((f"fill {fill['fill']['objects']:,} x {args.value} B, put_batch of {args.batch}",
                fill["fill"]["seconds"], "s", False))
    out.append(("fill rate", fill["fill"]["objects_per_s"], "obj/s", True))
    out.append(("fill: client CPU per object", fill["fill"]["client_cpu_us"], "us", False))
    out.append(("fill: master CPU per object", fill["fill"]["master_cpu_us"], "us", False))
    for at, c in fill["checkpoints"].items():
        n = f"{int(at):,}"
        for op, key in (("put", "put"), ("get", "get"), ("is_exist", "exist")):
            out.append((f"{op} p50 at {n} objects", c[f"{key}_p50_us"], "us", False))
            out.append((f"{op} p99 at {n} objects", c[f"{key}_p99_us"], "us", False))
        if c.get("master_rss"):
            out.append((f"master RSS at {n} objects", c["master_rss"] / 1e6, "MB", False))
    last = list(fill["checkpoints"].items())[-1]
    first = list(fill["checkpoints"].items())[0]
    out.append((f"put p50 growth {int(first[0]):,} -> {int(last[0]):,}",
                last[1]["put_p50_us"] / first[1]["put_p50_us"], "x", False))
    if last[1].get("master_rss") and int(last[0]) > int(first[0]):
        per = (last[1]["master_rss"] - first[1]["master_rss"]) / (int(last[0]) - int(first[0]))
        out.append(("master RSS per object", per, "B", False))
    how = f"put_batch+get_batch of {args.client_batch}" if args.client_batch > 1 else "put+get"
    for n, c in res.get("clients", {}).items():
        out.append((f"{n} clients {how} aggregate", c["ops_per_s"], "ops/s", True))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-venv", default="/work/venvs/mooncake-ref",
                    help="venv with the original Mooncake (skipped when absent)")
    ap.add_argument("--no-ref", action="store_true", help="measure only this project")
    ap.add_argument("--segment", type=int, default=1 << 30, help="bytes of the filling client's segment")
    ap.add_argument("--value", type=int, default=1024, help="object size in bytes")
    ap.add_argument("--batch", type=int, default=1000, help="keys per put_batch while filling (1 = put)")
    ap.add_argument("--checkpoints", type=int, nargs="+", default=[0, 100_000, 300_000],
                    help="object counts at which put/get/is_exist latencies and RSS are taken")
    ap.add_argument("--probes", type=int, default=300, help="timed calls per op and checkpoint")
    ap.add_argument("--clients", type=int, nargs="*", default=[1, 4, 8],
                    help="client process counts of the aggregate rows (the largest also with one stopped)")
    ap.add_argument("--client-seconds", type=float, default=3.0, help="duration of each aggregate row")
    ap.add_argument("--client-batch", type=int, default=1,
                    help="keys per put_batch + get_batch of each client process in the aggregate rows "
                         "(1 = single put + get; an op is one key either way)")
    ap.add_argument("--no-clients", action="store_true", help="skip the many-clients rows")
    ap.add_argument("--timeout", type=float, default=900, help="limit of one fill run (s)")
    ap.add_argument("--force-tcp", action="store_true", help="run ours with MC_FORCE_TCP=1 (no same-host shortcut)")
    ap.add_argument("--json", help="also write the raw results to this file")
    args = ap.parse_args()
    args.checkpoints = sorted(set(args.checkpoints))
    logdir = tempfile.mkdtemp(prefix="mc-bench-scale-")
    print(f"logs in {logdir}", flush=True)
    ours, ref = measure_ours_and_ref(measure, args, logdir)

    ref_rows = {r[0]: r[1] for r in rows(ref, args)} if ref else {}
    print()
    print(f"{'row':52s} {'ours':>14s} {'original':>14s} {'x':>7s}")
    print("-" * 90)
    for name, val, unit, higher in rows(ours, args):
        r = ref_rows.get(name)
        ratio = "" if not r or not val else f"{(val / r if higher else r / val):6.2f}x"
        rs = f"{r:,.1f} {unit}" if r is not None else ""
        print(f"{name:52s} {f'{val:,.1f} {unit}':>14s} {rs:>14s} {ratio:>7s}")
    errs = {k: v for k, v in (("ours", ours), ("original", ref)) if v and v["fill"].get("errors")}
    for k, v in errs.items():
        print(f"{k} reported errors: {v['fill']['errors']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ours": ours, "original": ref}, f, indent=2)
    return 1 if "ours" in errs else 0


if __name__ == "__main__":
    sys.exit(main())
