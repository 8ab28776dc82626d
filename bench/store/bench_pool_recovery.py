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

With ``--kill dummy`` the service stays up and the *engine* dies instead. Per round a dummy
(``ref_mooncake_dummy.py fill``) puts ``--large`` 1 MiB objects (``put_from`` from
``alloc_from_mem_pool`` memory) interleaved with ``--small`` 4 KiB ones (``put``), and is
SIGKILLed once ``--kill-after`` puts have returned, while its put loop runs (past that it goes on
putting, keeping its newest ``--ring`` objects); a new dummy (``verify``) is started at once. Measured per round:

* ``start -> first get``: the new dummy's process start -> its first get answering the bytes of
  an object the killed one stored (interpreter start and ``setup_dummy`` included, as for an
  engine restarted by its supervisor), split into the interpreter start + ``import`` of the
  store module and ``setup_dummy``; ``setup_dummy -> first get`` leaves the import out;
* readable: of the killed dummy's puts that returned 0 (and that it did not remove itself), how
  many the new one reads byte-exact (must be all), and any object read with wrong bytes (must be
  none);
* reclaim: the shared memory (memfd) the service held for the killed dummy -- read from the
  service's ``/proc/<pid>/maps`` and ``/proc/<pid>/fd`` while the dummy lives -- is it released,
  and how long after the kill (watched ``--reclaim-wait`` s).

    python3 -m bench.store.bench_pool_recovery              # ~1 minute on 2 cores
    python3 -m bench.store.bench_pool_recovery --rounds 5
    python3 -m bench.store.bench_pool_recovery --no-ref     # this project only
    python3 -m bench.store.bench_pool_recovery --kill dummy # an engine SIGKILLed mid-put
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
import threading
import time
from typing import Any

from bench.store.bench_dummy import WORKLOAD, client_cmd
from mooncake_core.utils.net import free_port, wait_for_port
from mooncake_core.utils.proc import readline_timeout
from mooncake_lab.store_bench import finish, measure_ours_and_ref, start_master, stop_all

ROWS = ("service up", "pool back", "pool steady")
DUMMY_ROWS = ("start -> first get", "  of which import", "  of which setup_dummy", "setup_dummy -> first get",
              "shm reclaimed after kill")


def _service(impl: str, python: str, master_cmd: list[str], common: list[str], port: int,
             args: Any, logdir: str) -> subprocess.Popen:
    """The implementation's ``mooncake_client`` on ``port``, for the master named in ``common``
    (the workload's arguments from ``start_master``)."""
    master, meta = common[common.index("--master") + 1], common[common.index("--meta") + 1]
    with open(os.path.join(logdir, f"{impl}-client.log"), "a") as clog:
        return subprocess.Popen(client_cmd(impl, python, master_cmd) + [
            "--host=127.0.0.1", f"--port={port}", f"--master_server_address={master}",
            f"--metadata_server={meta}", f"--global_segment_size={args.segment}", "--protocol=tcp",
        ], stdout=clog, stderr=subprocess.STDOUT)


def _start_pool(impl: str, python: str, master_cmd: list[str], args: Any, logdir: str,
                procs: list[subprocess.Popen]) -> tuple[list[str], int, subprocess.Popen]:
    """The implementation's master and its ``mooncake_client`` on a free port (both appended to
    ``procs``); returns the workload's common arguments, the port and the service."""
    common = start_master(impl, master_cmd, logdir, procs)
    port = free_port()
    service = _service(impl, python, master_cmd, common, port, args, logdir)
    procs.append(service)
    wait_for_port("127.0.0.1", port, 60, service)
    return common, port, service


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


def memfd_held(pid: int) -> dict[int, int]:
    """The memfd files process ``pid`` holds (mapped or open): inode -> bytes (the largest of its
    mappings' lengths and the file's size). Shared memory stays allocated while any is held."""
    held: dict[int, int] = {}
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/memfd:"):
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    ino = int(parts[4])
                    held[ino] = max(held.get(ino, 0), hi - lo)
        for fd in os.listdir(f"/proc/{pid}/fd"):
            path = f"/proc/{pid}/fd/{fd}"
            try:
                if os.readlink(path).startswith("/memfd:"):
                    st = os.stat(path)
                    held[st.st_ino] = max(held.get(st.st_ino, 0), st.st_size)
            except OSError:
                continue  # closed meanwhile
    except OSError:
        pass  # the process is gone: it holds nothing
    return held


def _watch_reclaim(pid: int, inodes: set[int], t_kill: float, until: float, out: dict[str, Any]) -> None:
    """Poll the service until none of ``inodes`` is held (``reclaim`` = seconds after the kill)
    or ``until``; ``leaked`` = the bytes still held then."""
    while True:
        held = memfd_held(pid)
        left = {i: n for i, n in held.items() if i in inodes}
        now = time.monotonic()
        if not left:
            out["reclaim"] = now - t_kill
            out["leaked"] = 0
            return
        if now >= until:
            out["reclaim"] = None
            out["leaked"] = sum(left.values())
            return
        time.sleep(0.01)


def _read_acks(proc: subprocess.Popen, timeout: float) -> list[dict[str, Any]]:
    lines = []
    while True:
        line = readline_timeout(proc, timeout, what="killed dummy's output")
        if not line:
            return lines
        lines.append(json.loads(line))


def dummy_round(impl: str, python: str, common: list[str], service_pid: int, port: int, tag: str,
                args: Any, logdir: str, procs: list[subprocess.Popen]) -> dict[str, Any]:
    """One round of ``--kill dummy``: fill, SIGKILL mid-put, verify from a new dummy, watch the
    service release the killed one's shared memory."""
    fill_args = ["--tag", tag, "--large-every", "2", "--keep", str(args.kill_after), "--ring", str(args.ring)]
    base = set(memfd_held(service_pid))
    with open(os.path.join(logdir, f"{impl}-fill.log"), "a") as log:
        filler = subprocess.Popen([python, WORKLOAD, "fill", *common, "--service", f"127.0.0.1:{port}", *fill_args],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
    procs.append(filler)
    if "ready" not in readline_timeout(filler, 60, what=f"{impl} filling dummy"):
        raise RuntimeError(f"{impl} filling dummy did not attach (logs in {logdir})")
    dummy_shm = {i: n for i, n in memfd_held(service_pid).items() if i not in base}
    assert filler.stdin is not None
    filler.stdin.write("go\n")
    filler.stdin.flush()
    acks: list[dict[str, Any]] = []
    while len(acks) < args.kill_after:
        line = readline_timeout(filler, 30, what=f"{impl} filling dummy")
        if not line:
            raise RuntimeError(f"{impl} filling dummy stopped after {len(acks)} puts (logs in {logdir})")
        acks.append(json.loads(line))
    filler.send_signal(signal.SIGKILL)  # its put loop is running: the next put is under way
    t_kill = time.monotonic()
    filler.wait(10)
    acks += _read_acks(filler, 5)  # what it printed before it died
    procs.remove(filler)
    reclaim: dict[str, Any] = {}
    watcher = threading.Thread(target=_watch_reclaim, daemon=True,
                               args=(service_pid, set(dummy_shm), t_kill, t_kill + args.reclaim_wait, reclaim))
    watcher.start()
    last = max((a["i"] for a in acks if "i" in a), default=-1)
    # the filler removes object i - ring before putting i (i >= kill_after + ring): at its death,
    # within put i = last + 1, the objects up to last + 1 - ring may be gone; the rest that
    # returned 0 must be there
    acked = [a["i"] for a in acks if "i" in a and a["rc"] == 0
             and (a["i"] < args.kill_after or a["i"] > last + 1 - args.ring)]
    mid_stream = not any("done" in a for a in acks)
    t_start = time.monotonic()
    with open(os.path.join(logdir, f"{impl}-verify.log"), "a") as log:
        verifier = subprocess.Popen([python, WORKLOAD, "verify", *common, "--service", f"127.0.0.1:{port}",
                                     "--tag", tag, "--large-every", "2", "--count", str(last + 2),
                                     "--acked", ",".join(map(str, acked)), "--settle", str(args.settle)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
    procs.append(verifier)
    line = readline_timeout(verifier, 60 + args.settle, what=f"{impl} new dummy")
    if not line:
        raise RuntimeError(f"{impl} new dummy exited ({verifier.poll()}) without a report (logs in {logdir})")
    rep = json.loads(line)
    watcher.join(args.reclaim_wait + 5)
    assert verifier.stdin is not None
    verifier.stdin.write("stop\n")
    verifier.stdin.flush()
    try:
        verifier.wait(30)
    except subprocess.TimeoutExpired:
        verifier.kill()
        verifier.wait(10)
    procs.remove(verifier)
    return {"start -> first get": None if rep["first_get"] is None else rep["first_get"] - t_start,
            "import": rep["imported"] - t_start, "attach": rep["attached"] - rep["imported"],
            "setup_dummy -> first get": None if rep["first_get"] is None else rep["first_get"] - rep["imported"],
            "mid-stream": mid_stream, "puts": len([a for a in acks if "i" in a]),
            "acked": len(acked), "readable": rep["readable"], "missing": len(rep["missing"]),
            "wrong": len(rep["wrong"]), "unacked_readable": rep["unacked_readable"],
            "dummy shm": sum(dummy_shm.values()), "shm reclaimed after kill": reclaim.get("reclaim"),
            "leaked": reclaim.get("leaked")}


def run_dummy_kill(impl: str, python: str, master_cmd: list[str], args: Any, logdir: str) -> dict[str, Any]:
    """Master + mooncake_client; ``--rounds`` rounds of ``dummy_round`` (every wait bounded)."""
    procs: list[subprocess.Popen] = []
    rounds: list[dict[str, Any]] = []
    errors: list[str] = []
    try:
        common, port, service = _start_pool(impl, python, master_cmd, args, logdir, procs)
        for r in range(args.rounds):
            rounds.append(dummy_round(impl, python, common, service.pid, port, f"dk{r}", args, logdir, procs))
    finally:
        stop_all(procs)
    for i, r in enumerate(rounds):
        if not r["mid-stream"]:
            errors.append(f"round {i + 1}: the dummy had stopped putting when the kill landed")
        if r["missing"] or r["wrong"]:
            errors.append(f"round {i + 1}: {r['missing']} of the killed dummy's {r['acked']} stored objects "
                          f"missing, {r['wrong']} read with wrong bytes")
        if r["start -> first get"] is None:
            errors.append(f"round {i + 1}: the new dummy never read the killed one's first object")
        if r["leaked"]:
            errors.append(f"round {i + 1}: the service still holds {r['leaked']} bytes of the killed dummy's "
                          f"shared memory {args.reclaim_wait:.0f} s after the kill")
    keys = {"  of which import": "import", "  of which setup_dummy": "attach"}
    results = {row: statistics.median(v) if (v := [r[keys.get(row, row)] for r in rounds
                                                     if r[keys.get(row, row)] is not None]) else None
               for row in DUMMY_ROWS}
    return {"results": results, "rounds": rounds, "errors": errors}


def run_impl(impl: str, python: str, master_cmd: list[str], args: Any, logdir: str) -> dict[str, Any]:
    """Master + mooncake_client + a dummy putting and getting; ``--rounds`` restarts of the
    service, each followed by ``--settle`` seconds of watching (every wait bounded)."""
    procs: list[subprocess.Popen] = []
    restarts: list[tuple[float, float, float]] = []
    errors: list[str] = []
    report: dict[str, Any] = {"outages": [], "calls": 0, "failed": 0}
    try:
        common, port, service = _start_pool(impl, python, master_cmd, args, logdir, procs)
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
            service = _service(impl, python, master_cmd, common, port, args, logdir)
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
    ap.add_argument("--kill", choices=["service", "dummy"], default="service",
                    help="what is SIGKILLed each round: the mooncake_client (default) or an engine's dummy "
                         "mid-put (then a new dummy reads what it stored)")
    ap.add_argument("--kill-after", type=int, default=128,
                    help="--kill dummy: puts that have returned when the dummy is SIGKILLed (1 MiB and "
                         "4 KiB alternately: 64 of each by default)")
    ap.add_argument("--ring", type=int, default=32,
                    help="--kill dummy: past --kill-after objects the dummy goes on putting, keeping its "
                         "newest --ring (it is putting when the kill lands, however late)")
    ap.add_argument("--reclaim-wait", type=float, default=15.0,
                    help="--kill dummy: seconds the service is watched for releasing the dead dummy's memory")
    ap.add_argument("--json", help="also write the results to this file")
    return ap


def _calls(res: dict[str, Any]) -> str:
    return f"{res.get('failed', 0)}/{res.get('calls', 0)}"


def _fmt(seconds: float | None, never: str = "not back") -> str:
    return never if seconds is None else f"{seconds * 1e3:.0f} ms"


def _stored(res: dict[str, Any] | None) -> str:
    if not res:
        return ""
    rs = res["rounds"]
    return f"{sum(r['readable'] for r in rs)}/{sum(r['acked'] for r in rs)}"


def _reclaimed(res: dict[str, Any] | None) -> str:
    if not res:
        return ""
    rs = res["rounds"]
    return f"{sum(r['leaked'] == 0 for r in rs)}/{len(rs)}"


def print_timings(title: str, rows: tuple[str, ...], ours: dict[str, Any], ref: dict[str, Any] | None,
                  width: int, never: str) -> None:
    """The header and one line per timed row: ours, the original's, original / ours."""
    print()
    print(f"{title:{width}s} {'ours':>10s} {'original':>10s} {'original/ours':>14s}")
    print("-" * (width + 38))
    r_res = (ref or {}).get("results", {})
    for row in rows:
        o, r = ours["results"].get(row), r_res.get(row)
        ratio = f"{r / o:13.2f}x" if o and r else "           n/a"
        label = row if row.startswith(" ") or title.endswith("(median)") else f"{row} (median)"
        print(f"{label:{width}s} {_fmt(o, never):>10s} {_fmt(r, never) if ref else '':>10s} {ratio:>14s}")


def print_dummy_kill(ours: dict[str, Any], ref: dict[str, Any] | None) -> None:
    print_timings("a dummy SIGKILLed mid-put", DUMMY_ROWS, ours, ref, 32, "never")
    rows: list[tuple[str, Any]] = [
        ("returned-0 puts read back", _stored),
        ("rounds shm released", _reclaimed),
        ("rounds killed mid-put loop", lambda res: f"{sum(r['mid-stream'] for r in res['rounds'])}/"
         f"{len(res['rounds'])}" if res else ""),
        ("wrong objects", lambda res: str(sum(r["wrong"] for r in res["rounds"])) if res else ""),
        ("unacked puts readable", lambda res: str(sum(r["unacked_readable"] for r in res["rounds"])) if res else ""),
        ("dummy shm held (MiB, per dummy)", lambda res: f"{res['rounds'][0]['dummy shm'] / (1 << 20):.0f}"
         if res and res["rounds"] else ""),
    ]
    for label, cell in rows:
        print(f"{label:32s} {cell(ours):>10s} {cell(ref):>10s}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.force_tcp = False  # measure_ours_and_ref's switch
    logdir = tempfile.mkdtemp(prefix="mc-bench-recovery-")
    if args.kill == "dummy":
        ours, ref = measure_ours_and_ref(run_dummy_kill, args, logdir)
        print_dummy_kill(ours, ref)
        return finish(ours, ref, args.json)
    ours, ref = measure_ours_and_ref(run_impl, args, logdir)
    print_timings("after a restart (median)", ROWS, ours, ref, 28, "not back")
    print(f"{'failed / all put+get':28s} {_calls(ours):>10s} {_calls(ref) if ref else '':>10s}")
    return finish(ours, ref, args.json)


if __name__ == "__main__":
    sys.exit(main())
