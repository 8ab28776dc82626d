#!/usr/bin/env python3
"""Long fuzzing runs of every surface a peer or a client can reach (not a test; the CI tests in
tests/fuzz/ run the same drivers for a few hundred hypothesis examples each).

Surfaces: ``te`` (Transfer Engine tcp wire: data, vectored, control ops), ``master`` (store
master RPC), ``metadata`` (the master's embedded HTTP metadata server), ``proxy`` (PD proxy HTTP
+ admin API, fake engines behind it), ``handshake`` (a hostile peer answering our engine: the
P2P descriptor fetch and the replies to reads/writes), ``params`` (vLLM connector's
kv_transfer_params parser, in process). Each input comes from ``random.Random(seed + i)``, so a
failure is replayed with ``--seed`` and ``--start``. Every ``--check-every`` inputs the server's
liveness and invariants are checked (a real engine read / store put+get / a valid completion);
the report gives inputs/s, failures, answer codes, and the server's RSS and open fds before and
after.

    python3 -m bench.robustness.bench_fuzz --surface all --inputs 1000000
    python3 -m bench.robustness.bench_fuzz --surface te --inputs 20000 --json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any, Callable

import numpy as np

from mooncake_core.utils.proc import close_piped, spawn_until, stop_process
from mooncake_core.utils.progress import Progress
from mooncake_lab import repo_pythonpath
from mooncake_lab.fuzz.surfaces import (EvilPeer, FuzzFailure, HttpFuzzer, MasterRpcFuzzer, TeWireFuzzer, json_body,
                                        metadata_routes, proxy_health_503, proxy_routes, rand_bytes, rand_json_value)
from mooncake_lab.fuzz.targets import start_te_target

SURFACES = ("te", "master", "metadata", "proxy", "handshake", "params")
STOP = threading.Event()  # SIGTERM/SIGINT: finish the input in hand, then report what ran
TIMEOUT = [10.0]  # --timeout: how long a server may take to answer one input before it is a hang


def proc_stats(pid: int) -> dict[str, int]:
    rss = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return {"rss": -1, "fds": -1}
    return {"rss": rss, "fds": fds}


class Run:
    """Feeds one surface and keeps its figures."""

    def __init__(self, name: str, one: Callable[[random.Random], Any], check: Callable[[], None],
                 pid: int, extra: Callable[[], dict] = dict) -> None:
        self.name, self.one, self.check, self.pid, self.extra = name, one, check, pid, extra
        self.failures: list[dict] = []

    def go(self, n: int, seed: int, start: int, every: int, quiet: bool) -> dict:
        before = proc_stats(self.pid)
        t0 = time.monotonic()
        done = 0
        what = f"  [{self.name}]" if start == 0 else f"  [{self.name} from {start}]"
        prog = Progress(what, n, unit="inputs", every_s=2.0, enabled=not quiet)
        for i in range(start, start + n):
            if STOP.is_set():
                break
            try:
                self.one(random.Random(seed * 1_000_003 + i))
            except FuzzFailure as e:
                self.failures.append({"input": i, "error": str(e)[:500]})
                print(f"  [{self.name}] FAILURE at input {i} (--seed {seed} --start {i}): {str(e)[:300]}",
                      file=sys.stderr, flush=True)
                if len(self.failures) >= 5:
                    break
            done += 1
            prog.extra["failures"] = len(self.failures)
            prog.add()
            if done % every == 0:
                try:
                    self.check()
                except (AssertionError, Exception) as e:  # noqa: BLE001 - the report names it
                    self.failures.append({"input": i, "error": f"liveness: {type(e).__name__}: {e}"[:500]})
                    break
        try:
            self.check()
        except (AssertionError, Exception) as e:  # noqa: BLE001
            self.failures.append({"input": "end", "error": f"liveness: {type(e).__name__}: {e}"[:500]})
        prog.finish()
        secs = time.monotonic() - t0
        after = proc_stats(self.pid)
        return {"surface": self.name, "inputs": done, "seconds": round(secs, 1),
                "inputs_per_s": round(done / secs, 1) if secs else 0, "failures": self.failures,
                "rss_before": before["rss"], "rss_after": after["rss"], "fds_before": before["fds"],
                "fds_after": after["fds"], "stopped_early": STOP.is_set(), **self.extra()}


def surface_te(cleanup: list) -> Run:
    from mooncake_core.engine import TransferEngine

    t = start_te_target(sys.executable)
    cleanup.append(lambda: close_piped(t.proc))
    fz = TeWireFuzzer("127.0.0.1", t.rpc_port, t.base, t.size, t.initial(), timeout=TIMEOUT[0])
    eng = TransferEngine()
    assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = np.zeros(t.size, dtype=np.uint8)
    eng.register_memory(buf.ctypes.data, buf.nbytes)
    cleanup.append(eng.close)

    def check() -> None:
        st = t.check()
        assert st["guards_ok"], "unregistered guard bytes changed"
        assert st["sha"] == hashlib.sha256(fz.shadow).hexdigest(), "registered bytes differ from the model"
        assert eng.transfer_sync_read(t.segment, buf.ctypes.data, t.base, t.size) == 0, eng.last_error
        assert bytes(buf) == bytes(fz.shadow), "a real read returned other bytes"

    return Run("te", fz.one, check, t.proc.pid, lambda: {"kinds": dict(fz.kinds), "reconnects": fz.reconnects})


def _master(cleanup: list) -> tuple[Any, Any]:
    from mooncake_lab.store_procs import Master, make_client

    m = Master(sys.executable, tempfile.mkdtemp(prefix="fuzz-master-")).start()
    cleanup.append(m.stop)
    c = make_client(m, 16 << 20)
    cleanup.insert(len(cleanup) - 1, c.close)
    return m, c


def _store_live(m: Any, c: Any) -> Callable[[], None]:
    def check() -> None:
        key, val = f"fuzz-live/{os.urandom(8).hex()}", os.urandom(4096)
        assert c.put(key, val) == 0, "put failed"
        assert c.get(key) == val, "get returned other bytes"
        assert m.proc.poll() is None, "master died"
    return check


def surface_master(cleanup: list) -> Run:
    m, c = _master(cleanup)
    fz = MasterRpcFuzzer("127.0.0.1", m.port, timeout=TIMEOUT[0])
    return Run("master", fz.one, _store_live(m, c), m.proc.pid,
               lambda: {"kinds": dict(fz.kinds), "statuses": dict(fz.statuses)})


def surface_metadata(cleanup: list) -> Run:
    m, c = _master(cleanup)
    fz = HttpFuzzer("127.0.0.1", m.http_port, metadata_routes(), lambda r: rand_bytes(r, r.randrange(0, 2000)),
                    timeout=TIMEOUT[0])
    return Run("metadata", fz.one, _store_live(m, c), m.proc.pid, lambda: {"statuses": dict(fz.statuses)})


def surface_proxy(cleanup: list) -> Run:
    import httpx

    env = {**os.environ, "MC_LOG_LEVEL": "ERROR"}
    procs = []

    def spawn(args: list[str], what: str) -> int:
        p, mt = spawn_until([sys.executable, "-u", *args], what + r" listening on http://[^:]+:(\d+)", 30,
                            env=env, what=what)
        procs.append(p)
        cleanup.append(lambda: stop_process(p, 5))
        return int(mt.group(1))

    ports = [spawn(["-m", "mooncake_proxy.fake_engine", "--name", n, "--chunks", "2", "--no-record"],
                   "fake_engine") for n in ("P", "D")]
    port = spawn(["-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", "0", "--prefiller-hosts",
                  "127.0.0.1", "--prefiller-ports", str(ports[0]), "--decoder-hosts", "127.0.0.1",
                  "--decoder-ports", str(ports[1]), "--admin-key", "K", "--policy", "conductor"], "mooncake_proxy")
    url = f"http://127.0.0.1:{port}"
    fz = HttpFuzzer("127.0.0.1", port, proxy_routes(), json_body, timeout=TIMEOUT[0],
                    documented_5xx=proxy_health_503)

    def check() -> None:
        assert all(p.poll() is None for p in procs), "a process died"
        r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "hi " * 30, "max_tokens": 2},
                       timeout=10)
        assert r.status_code == 200, r.text[:300]

    return Run("proxy", fz.one, check, procs[-1].pid,
               lambda: {"statuses": dict(fz.statuses), "kinds": dict(fz.kinds)})


def surface_handshake(cleanup: list) -> Run:
    os.environ["MC_TRANSFER_TIMEOUT"] = "1"
    from mooncake_core.engine import TransferEngine

    victim = start_te_target(sys.executable)
    cleanup.append(lambda: close_piped(victim.proc))
    eng = TransferEngine()
    assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    cleanup.append(eng.close)
    guard, size = 4096, 64 << 10
    buf = np.full(size + 2 * guard, 0x5A, dtype=np.uint8)
    eng.register_memory(buf.ctypes.data + guard, size)
    evil = EvilPeer()
    cleanup.append(evil.close)
    from mooncake_core.transfer.descriptor import host_identity, process_start_time

    boot, pidns = host_identity()
    vinfo = {"boot_id": boot, "pidns": pidns, "pid": victim.proc.pid,
             "start_time": process_start_time(victim.proc.pid), "addr": victim.base, "length": victim.size}
    vsha = victim.check()["sha"]

    def one(rng: random.Random) -> None:
        length = rng.choice([0, 1, 4096, size, rng.randrange(1, size)])
        evil.new_plan(rng, vinfo, length, late_weight=0.002)
        fn = eng.transfer_sync_write if rng.random() < 0.5 else eng.transfer_sync_read
        t = time.monotonic()
        fn(evil.segment, buf.ctypes.data + guard, victim.base + rng.randrange(4096), length)
        if time.monotonic() - t > 8:
            raise FuzzFailure(f"call took {time.monotonic() - t:.1f}s")
        if not ((buf[:guard] == 0x5A).all() and (buf[guard + size:] == 0x5A).all()):
            raise FuzzFailure("local guard overwritten")

    def check() -> None:
        assert victim.check()["sha"] == vsha, "our engine wrote into another process"

    return Run("handshake", one, check, os.getpid(), lambda: {"served": dict(evil.served)})


def surface_params(cleanup: list) -> Run:
    from mooncake_lab.fuzz.vllm_params import KEYS, check_params, valid_params

    def one(rng: random.Random) -> None:
        if rng.random() < 0.3:
            d: Any = rand_json_value(rng)
        else:
            d = valid_params()
            for _ in range(rng.randrange(1, 4)):
                k = rng.choice(KEYS)
                if rng.random() < 0.2:
                    d.pop(k, None)
                else:
                    d[k] = rng.choice([rand_json_value(rng), -1, 2**64, 10**400, float("nan"), "x:1", [True]])
        try:
            check_params(d)
        except AssertionError as e:
            raise FuzzFailure(f"params {d!r:.300}: {e}") from None

    return Run("params", one, lambda: None, os.getpid())


def _merge(name: str, parts: list[dict], secs: float) -> dict:
    """One surface's figures from its jobs: counts summed, RSS/fds of the job that grew most."""
    out: dict[str, Any] = {"surface": name, "inputs": sum(r["inputs"] for r in parts), "seconds": round(secs, 1),
                           "failures": [f for r in parts for f in r["failures"]]}
    out["inputs_per_s"] = round(out["inputs"] / secs, 1) if secs else 0
    out["stopped_early"] = any(r.get("stopped_early") for r in parts)
    worst = max(parts, key=lambda r: (r["rss_after"] - r["rss_before"], r["fds_after"] - r["fds_before"]))
    out.update({k: worst[k] for k in ("rss_before", "rss_after", "fds_before", "fds_after")})
    for key in ("kinds", "statuses", "served"):
        total: Counter[str] = Counter()
        for r in parts:
            total.update(r.get(key) or {})
        if total:
            out[key] = dict(total)
    return out


def run_jobs(a: argparse.Namespace, argv: list[str]) -> int:
    """``--jobs N``: this script N times per surface over disjoint ranges, their JSON merged."""
    import subprocess

    keep: list[str] = []
    skip = False
    for x in argv:  # drop the options this level sets per job
        if skip:
            skip = False
            continue
        if x in ("--jobs", "--surface", "--inputs", "--start"):
            skip = True
            continue
        if x.split("=")[0] in ("--jobs", "--surface", "--inputs", "--start") or x in ("--json", "--quiet"):
            continue
        keep.append(x)
    names = SURFACES if a.surface == "all" else tuple(a.surface.split(","))
    out = []
    for name in names:
        t0 = time.monotonic()
        share = [a.inputs // a.jobs + (1 if j < a.inputs % a.jobs else 0) for j in range(a.jobs)]
        procs, start = [], a.start
        for n in share:
            procs.append(subprocess.Popen([sys.executable, __file__, *keep, "--surface", name, "--inputs", str(n),
                                           "--start", str(start), "--json", *(["--quiet"] if a.quiet else [])],
                                          stdout=subprocess.PIPE,  # each job's progress lines pass through
                                          env={**os.environ, "PYTHONPATH": repo_pythonpath()}))
            start += n
        if not a.quiet:
            print(f"[{name}] {a.inputs} inputs in {a.jobs} jobs ...", file=sys.stderr, flush=True)

        def forward(signum: int, _frame: Any) -> None:
            STOP.set()
            for pr in procs:
                pr.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        parts = []
        for pr in procs:
            stdout, _ = pr.communicate()
            try:
                parts.extend(json.loads(stdout)["surfaces"])
            except (ValueError, KeyError):
                parts.append({"inputs": 0, "failures": [{"input": "job", "error": f"job exited {pr.returncode} "
                                                         "without a report"}], "rss_before": 0, "rss_after": 0,
                              "fds_before": 0, "fds_after": 0})
        out.append(_merge(name, parts, time.monotonic() - t0))
    report(out, a.json)
    return 1 if any(r["failures"] for r in out) else 0


def report(out: list[dict], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"surfaces": out}, indent=1))
        return
    print(f"{'surface':<10} {'inputs':>9} {'inputs/s':>9} {'failures':>8} {'RSS MB before/after':>20} "
          f"{'fds before/after':>17}")
    for r in out:
        print(f"{r['surface']:<10} {r['inputs']:>9} {r['inputs_per_s']:>9.0f} {len(r['failures']):>8} "
              f"{r['rss_before'] / 2**20:>9.1f}/{r['rss_after'] / 2**20:<9.1f} "
              f"{r['fds_before']:>8}/{r['fds_after']:<8}" + ("  (stopped early)" if r.get("stopped_early") else ""))
        for f in r["failures"]:
            print(f"   input {f['input']}: {f['error']}")
        extra = {k: v for k, v in r.items() if k in ("kinds", "statuses", "served")}
        if extra:
            print("   " + json.dumps(extra))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--surface", default="all", help=f"one of {', '.join(SURFACES)}, a comma list, or all")
    p.add_argument("--inputs", type=int, default=100_000, help="inputs per surface")
    p.add_argument("--seed", type=int, default=1, help="base seed (input i uses seed*1000003+i)")
    p.add_argument("--start", type=int, default=0, help="index of the first input (replay a failure)")
    p.add_argument("--check-every", type=int, default=1000, help="liveness/invariant check interval (inputs)")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds a server may take to answer one input before it counts as a hang (raise it "
                        "on a loaded machine: a descheduled server is not a hung one)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--jobs", type=int, default=1,
                   help="processes per surface, each with its own server, fed disjoint input ranges "
                        "(overlaps the waits on incomplete requests; the table then sums their figures)")
    a = p.parse_args(argv)
    if a.jobs > 1:
        return run_jobs(a, argv or sys.argv[1:])
    for sig in (signal.SIGTERM, signal.SIGINT):  # stop at the next input and still report
        signal.signal(sig, lambda *_: STOP.set())
    TIMEOUT[0] = a.timeout
    from mooncake_core.utils.log import setup_logging

    setup_logging("CRITICAL")  # every refused input is logged by design; the report counts them
    names = SURFACES if a.surface == "all" else tuple(a.surface.split(","))
    bad = [n for n in names if n not in SURFACES]
    if bad:
        p.error(f"unknown surface(s) {bad}; choose from {SURFACES}")
    out = []
    for name in names:
        cleanup: list = []
        try:
            run = globals()[f"surface_{name}"](cleanup)
            if not a.quiet:
                print(f"[{name}] {a.inputs} inputs ...", file=sys.stderr, flush=True)
            out.append(run.go(a.inputs, a.seed, a.start, a.check_every, a.quiet))
        finally:
            for f in reversed(cleanup):
                try:
                    f()
                except Exception:  # noqa: BLE001 - best-effort teardown
                    pass
    report(out, a.json)
    return 1 if any(r["failures"] for r in out) else 0


if __name__ == "__main__":
    sys.exit(main())
