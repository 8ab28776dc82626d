#!/usr/bin/env python3
"""Benchmark of pool recovery: how soon after the node's ``mooncake_client`` is restarted an
engine attached with ``setup_dummy`` can put and get again, this project vs the original
Mooncake, in the same run.

For each implementation: its master, its ``mooncake_client`` (``--port`` fixed for the run), and
a dummy process running ``bench/reference/ref_mooncake_dummy.py recover`` through the public
``mooncake.store`` API, which puts and gets a 4 KiB value every 5 ms. Each round the service is
SIGKILLed, left down ``--down`` seconds (an orchestrator's restart delay), and started again on
the same port. Per round, on the host's monotonic clock:

* ``service up``: restart -> the new service accepts connections (its own start-up);
* ``pool back``: restart -> the dummy's first put + get that succeed (bytes compared): what an
  engine waits for;
* ``pool steady``: restart -> the end of the last failure before the next restart (calls that
  fail after the pool was back count here).

Printed: the median over ``--rounds`` of each, ours and the original's, the ratio original /
ours (> 1: ours is back sooner), and the failed calls. A dummy not back ``--settle`` s after a
restart is reported as not back.

    python3 -m bench.store.bench_pool_recovery              # ~1 minute on 2 cores
    python3 -m bench.store.bench_pool_recovery --rounds 5
    python3 -m bench.store.bench_pool_recovery --no-ref     # this project only
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.store.bench_dummy import WORKLOAD, client_cmd
from mooncake_core.utils.net import free_port, wait_for_port
from mooncake_core.utils.proc import readline_timeout
from mooncake_lab.store_bench import finish, measure_ours_and_ref, start_master, stop_all

ROWS = ("service up", "pool back", "pool steady")


def _service(impl: str, python: str, master_cmd: list[str], master: str, meta: str, port: int,
             args: Any, logdir: str) -> subprocess.Popen:
    with open(os.path.join(logdir, f"{impl}-client.log"), "a") as clog:
        return subprocess.Popen(client_cmd(impl, python, master_cmd) + [
            "--host=127.0.0.1", f"--port={port}", f"--master_server_address={master}",
            f"--metadata_server={meta}", f"--global_segment_size={args.segment}", "--protocol=tcp",
        ], stdout=clog, stderr=subprocess.STDOUT)


def score_rounds(restarts: list[tuple[float, float, float]], outages: list[list[float | None]],
                 end: float) -> list[dict[str, float | None]]:
    """Per restart (kill, start, up), from the dummy's outages: ``pool back`` = start -> the end
    of the outage the kill caused; ``pool steady`` = start -> the end of the last outage before
    the next kill (failures after the pool was back count against it); None when never back."""
    rows = []
    for i, (t_kill, t_start, t_up) in enumerate(restarts):
        until = restarts[i + 1][0] if i + 1 < len(restarts) else end
        mine = [o for o in outages if o[0] is not None and t_kill <= o[0] < until]
        first_back = mine[0][1] if mine else None
        last_back = mine[-1][1] if mine else None
        rows.append({"service up": t_up - t_start,
                     "pool back": None if first_back is None else first_back - t_start,
                     "pool steady": None if last_back is None else last_back - t_start,
                     "outages": float(len(mine))})
    return rows


def run_impl(impl: str, python: str, master_cmd: list[str], args: Any, logdir: str) -> dict[str, Any]:
    """Master + mooncake_client + a dummy putting and getting; ``--rounds`` restarts of the
    service, each followed by ``--settle`` seconds of watching (every wait bounded)."""
    procs: list[subprocess.Popen] = []
    restarts: list[tuple[float, float, float]] = []
    errors: list[str] = []
    report: dict[str, Any] = {"outages": [], "calls": 0, "failed": 0}
    try:
        common = start_master(impl, master_cmd, logdir, procs)
        master, meta = common[common.index("--master") + 1], common[common.index("--meta") + 1]
        port = free_port()
        service = _service(impl, python, master_cmd, master, meta, port, args, logdir)
        procs.append(service)
        wait_for_port("127.0.0.1", port, 60, service)
        with open(os.path.join(logdir, f"{impl}-dummy.log"), "w") as dlog:
            dummy = subprocess.Popen([python, WORKLOAD, "recover", *common, "--service", f"127.0.0.1:{port}"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=dlog, text=True)
        procs.append(dummy)
        if "ready" not in readline_timeout(dummy, 60, what=f"{impl} dummy"):
            raise RuntimeError(f"{impl} dummy did not attach (logs in {logdir})")
        time.sleep(0.5)  # the dummy is putting and getting
        for _ in range(args.rounds):
            t_kill = time.monotonic()
            service.send_signal(signal.SIGKILL)
            service.wait(10)
            procs.remove(service)
            time.sleep(args.down)
            t_start = time.monotonic()
            service = _service(impl, python, master_cmd, master, meta, port, args, logdir)
            procs.append(service)
            wait_for_port("127.0.0.1", port, 60, service)
            restarts.append((t_kill, t_start, time.monotonic()))
            time.sleep(args.settle)
        end = time.monotonic()
        assert dummy.stdin is not None
        dummy.stdin.write("stop\n")
        dummy.stdin.flush()
        line = readline_timeout(dummy, 30, what=f"{impl} dummy")
        if line:
            report = json.loads(line)
        else:
            errors.append(f"the dummy exited (code {dummy.poll()}) without a report")
    finally:
        stop_all(procs)
    rounds = score_rounds(restarts, report["outages"], end if restarts else 0.0)
    for i, r in enumerate(rounds):
        if r["pool back"] is None:
            errors.append(f"restart {i + 1}: put + get not back within {args.settle:.0f} s")
    results = {row: statistics.median(v) if (v := [r[row] for r in rounds if r[row] is not None]) else None
               for row in ROWS}
    return {"results": results, "rounds": rounds, "calls": report["calls"], "failed": report["failed"],
            "errors": errors}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-venv", default="/work/venvs/mooncake-ref",
                    help="venv with the original Mooncake and its mooncake_client (skipped when absent)")
    ap.add_argument("--no-ref", action="store_true", help="measure only this project")
    ap.add_argument("--rounds", type=int, default=3, help="service restarts per implementation (median)")
    ap.add_argument("--down", type=float, default=0.5, help="seconds the service stays down each round")
    ap.add_argument("--segment", default="256MB", help="--global_segment_size of the mooncake_client")
    ap.add_argument("--settle", type=float, default=5.0,
                    help="seconds each restart is watched (a dummy not back by then counts as not back)")
    ap.add_argument("--json", help="also write the results to this file")
    return ap


def _calls(res: dict[str, Any]) -> str:
    return f"{res.get('failed', 0)}/{res.get('calls', 0)}"


def _fmt(seconds: float | None) -> str:
    return "not back" if seconds is None else f"{seconds * 1e3:.0f} ms"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.force_tcp = False  # measure_ours_and_ref's switch
    logdir = tempfile.mkdtemp(prefix="mc-bench-recovery-")
    ours, ref = measure_ours_and_ref(run_impl, args, logdir)
    print()
    print(f"{'after a restart (median)':28s} {'ours':>10s} {'original':>10s} {'original/ours':>14s}")
    print("-" * 66)
    r_res = (ref or {}).get("results", {})
    for row in ROWS:
        o, r = ours["results"].get(row), r_res.get(row)
        ratio = f"{r / o:13.2f}x" if o and r else "           n/a"
        print(f"{row:28s} {_fmt(o):>10s} {_fmt(r) if ref else '':>10s} {ratio:>14s}")
    print(f"{'failed / all put+get':28s} {_calls(ours):>10s} {_calls(ref) if ref else '':>10s}")
    return finish(ours, ref, args.json)


if __name__ == "__main__":
    sys.exit(main())
