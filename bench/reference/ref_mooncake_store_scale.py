"""Workload of ``bench_store_scale.py``, written against the *public* Mooncake Store API only.

The same file drives both implementations (``--impl ours`` resolves ``mooncake.store`` to this
project through ``mooncake_core.compat``). Roles:

  fill    one client that contributes ``--segment`` bytes: fills the store with ``--value``-byte
          objects by ``put_batch`` of ``--batch`` fresh keys up to each ``--checkpoints`` count,
          and at every checkpoint times single ``put`` (fresh keys), ``get`` and ``is_exist``
          (p50/p99 over ``--probes`` calls) and reads the master's RSS (``--master-pid``).
          Prints ``{"progress": stored}`` lines while filling, then one JSON object (the result).
  clients a client without memory that puts/gets ``--value``-byte objects for ``--seconds``
          (after a start barrier: the file ``--go`` appears) and prints its op count: one
          key per put/get, or ``--batch`` keys per put_batch/get_batch (an op = one key).

Not meant to be called by hand; ``bench_store_scale.py`` starts everything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ref_mooncake_store import _setup  # same directory (run as a script)


def _rss(pid: int) -> int:
    """Resident bytes of process ``pid`` (0 when unknown)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (0 when unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def fill(args) -> None:
    s = _setup(args, args.segment, args.local_buffer)
    val = os.urandom(args.value)
    errors: list[str] = []
    out: dict = {"checkpoints": {}, "fill": {}}
    stored = 0
    fresh = 0

    def probe(at: int) -> None:
        nonlocal fresh
        put_t, get_t, ex_t = [], [], []
        keys = []
        for _ in range(args.probes):
            k = f"probe-{fresh}"
            fresh += 1
            t0 = time.perf_counter()
            rc = s.put(k, val)
            put_t.append(time.perf_counter() - t0)
            if rc != 0:
                errors.append(f"put {k}: {rc}")
            keys.append(k)
        for k in keys:
            t0 = time.perf_counter()
            got = s.get(k)
            get_t.append(time.perf_counter() - t0)
            if len(got) != len(val):
                errors.append(f"get {k}: {len(got)} bytes")
        for k in keys:
            t0 = time.perf_counter()
            ok = s.is_exist(k)
            ex_t.append(time.perf_counter() - t0)
            if ok != 1:
                errors.append(f"is_exist {k}: {ok}")
        us = 1e6
        out["checkpoints"][str(at)] = {
            "put_p50_us": _pct(put_t, 0.5) * us, "put_p99_us": _pct(put_t, 0.99) * us,
            "get_p50_us": _pct(get_t, 0.5) * us, "get_p99_us": _pct(get_t, 0.99) * us,
            "exist_p50_us": _pct(ex_t, 0.5) * us, "exist_p99_us": _pct(ex_t, 0.99) * us,
            "master_rss": _rss(args.master_pid) if args.master_pid else 0,
        }
        print(f"checkpoint {at}: {out['checkpoints'][str(at)]}", file=sys.stderr, flush=True)

    fill_s = 0.0
    cpu_client = cpu_master = 0.0  # CPU seconds of the fill ops: robust to a loaded machine
    batch = args.batch
    vals = [val] * batch
    told = 0.0  # progress lines for the parent (it prints done/total, rate, ETA): at most 2 a second
    for at in sorted(args.checkpoints):
        while stored < at:
            n = min(batch, at - stored)
            keys = [f"fill-{stored + i}" for i in range(n)]
            c0, m0, t0 = time.process_time(), _cpu(args.master_pid), time.perf_counter()
            rc = s.put_batch(keys, vals[:n]) if batch > 1 else s.put(keys[0], val)
            fill_s += time.perf_counter() - t0
            cpu_client += time.process_time() - c0
            cpu_master += _cpu(args.master_pid) - m0
            if rc != 0:
                errors.append(f"put_batch at {stored}: {rc}")
                break
            stored += n
            if time.monotonic() - told >= 0.5:
                told = time.monotonic()
                print(json.dumps({"progress": stored}), flush=True)
        probe(at)
        stored += args.probes
    filled = stored - args.probes * len(args.checkpoints)
    out["fill"] = {"objects": stored, "seconds": fill_s, "client_cpu_us": cpu_client / max(filled, 1) * 1e6,
                   "master_cpu_us": cpu_master / max(filled, 1) * 1e6,
                   "objects_per_s": (stored - args.probes * len(args.checkpoints)) / fill_s if fill_s else 0}
    out["errors"] = errors[:20]
    print(json.dumps(out), flush=True)
    if args.hold:
        sys.stdin.read()  # keep the segment mounted until the parent closes our stdin
    s.close()


def clients(args) -> None:
    s = _setup(args, 0, args.local_buffer)
    val = os.urandom(args.value)
    tag = f"c{os.getpid()}"
    print(json.dumps({"ready": tag}), flush=True)
    while not os.path.exists(args.go):
        time.sleep(0.005)
    n = 0
    errs = 0
    b = args.batch
    vals = [val] * b
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end:
        if b > 1:  # put_batch / get_batch of b fresh keys: 2 * b ops
            keys = [f"{tag}-{n + i}" for i in range(b)]
            if s.put_batch(keys, vals) != 0:
                errs += b
            errs += sum(len(g) != len(val) for g in s.get_batch(keys))
            n += b
            continue
        k = f"{tag}-{n}"
        if s.put(k, val) != 0:
            errs += 1
        if len(s.get(k)) != len(val):
            errs += 1
        n += 1
    print(json.dumps({"ops": 2 * n, "errors": errs}), flush=True)
    s.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", choices=["fill", "clients", "holder"], help="see above")
    p.add_argument("--impl", choices=["ref", "ours"], default="ref",
                   help="'ours' aliases mooncake.store to mooncake_core first")
    p.add_argument("--master", required=True, help="master address host:port")
    p.add_argument("--meta", required=True, help="metadata server, e.g. http://127.0.0.1:8080/metadata")
    p.add_argument("--segment", type=int, default=1 << 30, help="fill/holder: bytes of memory to contribute")
    p.add_argument("--local-buffer", type=int, default=64 << 20, help="local buffer bytes")
    p.add_argument("--value", type=int, default=1024, help="object size in bytes")
    p.add_argument("--batch", type=int, default=1000,
                   help="fill: keys per put_batch (1 = single puts); clients: keys per put_batch + get_batch")
    p.add_argument("--checkpoints", type=int, nargs="+", default=[0, 100_000, 300_000],
                   help="fill: object counts at which to probe latencies")
    p.add_argument("--probes", type=int, default=200, help="fill: timed calls per op and checkpoint")
    p.add_argument("--master-pid", type=int, default=0, help="fill: pid of the master (for its RSS)")
    p.add_argument("--hold", action="store_true", help="fill: wait for stdin to close before exiting")
    p.add_argument("--seconds", type=float, default=3.0, help="clients: duration of the timed loop")
    p.add_argument("--go", default="", help="clients: start when this file exists")
    args = p.parse_args()
    if args.role == "holder":
        from ref_mooncake_store import holder
        holder(args)
    else:
        fill(args) if args.role == "fill" else clients(args)


if __name__ == "__main__":
    main()
