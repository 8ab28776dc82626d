"""Dummy-client workload written against the *public* Mooncake Store Python API only.

The same file drives both implementations (see ref_mooncake_store.py for how ``--impl ours``
makes ``import mooncake.store`` resolve to this project). The caller has started a master and a
``mooncake_client`` (the node's store service) on ``--service``; this process attaches to it with
``setup_dummy(mem_pool_size, local_buffer_size, service)`` -- the way an engine does -- and times:

* ``put`` / ``get`` of 4 MiB and 4 KiB bytes values (staged through the dummy's local buffer);
* ``put_from`` / ``get_into`` of 4 MiB on memory from ``alloc_from_mem_pool`` (shared with the
  service: the zero-copy path);
* with ``--full``, the same ``put`` / ``get`` from a *full* client set up in the same process
  (no segment of its own, objects in the service's segment): the in-run reference for what
  attaching as a dummy costs.

Role ``recover`` (bench/store/bench_pool_recovery.py) instead records when put + get fail and
work again while the caller restarts the service. Roles ``fill`` and ``verify`` (its ``--kill
dummy`` mode) are an engine that is SIGKILLed while it puts, and the one started after it, which
reads what the first stored.

Every value read back is compared with what was written. ``run`` prints one JSON object:
``{"results": {row: median seconds}, "errors": [...]}``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

KiB, MiB = 1 << 10, 1 << 20


def _store_class(impl: str):
    if impl == "ours":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the checkout
        from mooncake_core import compat

        compat.install(force=True)
    from mooncake.store import MooncakeDistributedStore

    return MooncakeDistributedStore


def _timed(fn, reps: int, check=None) -> float:
    """Median seconds of ``reps`` calls of fn(i); ``check(i, answer)`` runs after each call,
    outside the timing. Answers are not kept: holding every 4 MiB answer alive would time the
    kernel handing the process fresh pages instead of the call."""
    times = []
    for i in range(reps):
        t0 = time.perf_counter()
        got = fn(i)
        times.append(time.perf_counter() - t0)
        if check is not None:
            check(i, got)
        del got
    return statistics.median(times)


def _bytes_rows(s, tag: str, reps: int, results: dict, errors: list) -> None:
    for label, size, n in (("4MiB", 4 * MiB, reps), ("4KiB", 4 * KiB, reps * 20)):
        value = os.urandom(size)
        keys = [f"{tag}-{label}-{i}" for i in range(n)]
        bad: list[str] = []
        for i in range(3):  # warm-up, untimed: first touches of the staging memory, lazy connections
            s.put(f"{tag}-warm-{i}", value)
            s.get(f"{tag}-warm-{i}")
            s.remove(f"{tag}-warm-{i}")
        results[f"{tag} put {label}"] = _timed(lambda i: s.put(keys[i], value), n,
                                               lambda i, rc: rc == 0 or bad.append(f"put code {rc}"))
        results[f"{tag} get {label}"] = _timed(lambda i: s.get(keys[i]), n,
                                               lambda i, got: got == value or bad.append(f"get of {keys[i]} wrong"))
        if bad:
            errors.append(f"{tag} {label}: {len(bad)} failures, first: {bad[0]}")
        for k in keys:
            s.remove(k)


def run(args) -> None:
    Store = _store_class(args.impl)
    results: dict[str, float] = {}
    errors: list[str] = []
    s = Store()
    rc = s.setup_dummy(args.mem_pool, args.local_buffer, args.service)
    if rc != 0:
        raise SystemExit(f"setup_dummy failed with {rc}")
    _bytes_rows(s, "dummy", args.reps, results, errors)

    # zero-copy: put_from / get_into on pool memory the service maps too
    size = 4 * MiB
    buf = s.alloc_from_mem_pool(size)
    if not buf or s.register_buffer(buf, size) != 0:
        errors.append(f"alloc_from_mem_pool(4 MiB) + register_buffer failed (address {buf})")
    else:
        payload = os.urandom(size)
        ctypes.memmove(buf, payload, size)
        keys = [f"zc-{i}" for i in range(args.reps)]
        bad: list[str] = []
        results["dummy put_from 4MiB"] = _timed(lambda i: s.put_from(keys[i], buf, size), args.reps,
                                                lambda i, rc: rc == 0 or bad.append(f"put_from code {rc}"))
        ctypes.memset(buf, 0, size)
        results["dummy get_into 4MiB"] = _timed(lambda i: s.get_into(keys[i], buf, size), args.reps,
                                                lambda i, n: n == size or bad.append(f"get_into answered {n}"))
        if ctypes.string_at(buf, size) != payload:
            bad.append("get_into: the bytes differ")
        if bad:
            errors.append(f"dummy 4MiB zero-copy: {len(bad)} failures, first: {bad[0]}")
        for k in keys:
            s.remove(k)
        s.unregister_buffer(buf)
    s.close()

    if args.full:
        f = Store()
        rc = f.setup("127.0.0.1", args.meta, 0, args.local_buffer, "tcp", "", args.master)
        if rc != 0:
            errors.append(f"full client setup failed with {rc}")
        else:
            _bytes_rows(f, "full", args.reps, results, errors)
            f.close()
    print(json.dumps({"results": results, "errors": errors}), flush=True)


def recover(args) -> None:
    """The pool-recovery workload: attach, then put + get a 4 KiB value (bytes compared) every
    ``--interval`` seconds until a line arrives on stdin, while the caller kills and restarts
    the service. Prints ``{"ready": true}`` once attached, and at the end one JSON object: the
    outages seen (``[first failed call, first successful put + get after it]``, on
    ``time.monotonic()``, the host's CLOCK_MONOTONIC, which the caller reads too; the second
    null when it never came back) and the count of failed calls."""
    import threading

    Store = _store_class(args.impl)
    s = Store()
    rc = s.setup_dummy(args.mem_pool, args.local_buffer, args.service)
    if rc != 0:
        raise SystemExit(f"setup_dummy failed with {rc}")
    value = os.urandom(4 * KiB)
    count = [0]

    def round_trip() -> bool:
        count[0] += 1
        key = f"recover-{count[0]}"
        return s.put(key, value) == 0 and s.get(key) == value

    if not round_trip():
        raise SystemExit("the first put + get failed")
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    print(json.dumps({"ready": True}), flush=True)
    outages: list[list[float | None]] = []
    failed = 0
    while not stop.is_set():
        t = time.monotonic()
        if round_trip():
            if outages and outages[-1][1] is None:
                outages[-1][1] = time.monotonic()
        else:
            failed += 1
            if not outages or outages[-1][1] is not None:
                outages.append([t, None])
        time.sleep(args.interval)
    print(json.dumps({"outages": outages, "calls": count[0], "failed": failed}), flush=True)
    os._exit(0)  # a dummy of a service that never came back may hang in close()


def _object(tag: str, i: int, large_every: int) -> tuple[str, int]:
    """The fill's ``i``-th key and size: 1 MiB for every ``large_every``-th, else 4 KiB (``verify``
    derives the same)."""
    return (f"{tag}-1MiB-{i}", MiB) if i % large_every == 0 else (f"{tag}-4KiB-{i}", 4 * KiB)


def _value(key: str, size: int) -> bytes:
    """The bytes stored under ``key``: derived from the key, so the next process can check them."""
    import random

    return random.Random(key).randbytes(size)


def fill(args) -> None:
    """An engine storing its cache, to be SIGKILLed mid-stream: attach, take a 1 MiB buffer from
    ``alloc_from_mem_pool`` (memory the service maps), print ``{"ready": true}``, wait for a line
    on stdin, then put objects 0, 1, ... of ``_object`` (1 MiB ones with ``put_from`` from the
    pool buffer, 4 KiB ones with ``put``), printing ``{"i": index, "rc": code}`` after each put
    returns, until killed (or ``--fill-limit`` s). Past ``--keep`` objects it keeps the newest
    ``--ring`` only (removing the one ``--ring`` back before each put), so a kill that lands late
    still finds it putting without filling the pool."""
    Store = _store_class(args.impl)
    s = Store()
    rc = s.setup_dummy(args.mem_pool, args.local_buffer, args.service)
    if rc != 0:
        raise SystemExit(f"setup_dummy failed with {rc}")
    values = [_value(*_object(args.tag, i, args.large_every)) for i in range(args.keep + args.ring)]
    buf = s.alloc_from_mem_pool(MiB)
    if not buf or s.register_buffer(buf, MiB) != 0:
        raise SystemExit(f"alloc_from_mem_pool(1 MiB) + register_buffer failed (address {buf})")
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()
    deadline = time.monotonic() + args.fill_limit
    i = 0
    while time.monotonic() < deadline:
        key, size = _object(args.tag, i, args.large_every)
        value = values[i] if i < len(values) else _value(key, size)
        if i >= args.keep + args.ring:
            s.remove(_object(args.tag, i - args.ring, args.large_every)[0])
        if size == MiB:
            ctypes.memmove(buf, value, size)
            rc = s.put_from(key, buf, size)
        else:
            rc = s.put(key, value)
        print(json.dumps({"i": i, "rc": rc}), flush=True)
        i += 1
    print(json.dumps({"done": True}), flush=True)
    os._exit(0)


def verify(args) -> None:
    """The engine started after ``fill`` was killed: attach, get the first object the killed one
    stored until it answers its bytes (``first_get``, on ``time.monotonic()``), then get objects
    0 .. ``--count`` - 1 and compare (``--acked``: those that must be there); remove them all. Prints one JSON object, then waits for
    a line on stdin (the caller inspects the service meanwhile) and closes."""
    Store = _store_class(args.impl)
    imported = time.monotonic()
    s = Store()
    rc = s.setup_dummy(args.mem_pool, args.local_buffer, args.service)
    attached = time.monotonic()
    if rc != 0:
        raise SystemExit(f"setup_dummy failed with {rc}")
    acked = {int(i) for i in args.acked.split(",") if i}
    objs = [_object(args.tag, i, args.large_every) for i in range(args.count)]
    report: dict = {"imported": imported, "attached": attached, "first_get": None, "acked": len(acked), "readable": 0,
                    "missing": [], "wrong": [], "unacked_readable": 0}
    if acked:
        key, size = objs[min(acked)]
        want = _value(key, size)
        deadline = time.monotonic() + args.settle
        while time.monotonic() < deadline:
            if s.get(key) == want:
                report["first_get"] = time.monotonic()
                break
            time.sleep(0.005)
    for i, (key, size) in enumerate(objs):
        got = s.get(key)
        if got:
            if got != _value(key, size):
                report["wrong"].append(key)
            elif i in acked:
                report["readable"] += 1
            else:
                report["unacked_readable"] += 1
        elif i in acked:
            report["missing"].append(key)
        s.remove(key, force=True)  # its get leased it
    print(json.dumps(report), flush=True)
    sys.stdin.readline()
    s.close()
    os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["run", "recover", "fill", "verify"])
    ap.add_argument("--impl", choices=["ours", "ref"], required=True)
    ap.add_argument("--master", required=True, help="master host:port (for --full)")
    ap.add_argument("--meta", required=True, help="metadata server URL (for --full)")
    ap.add_argument("--service", required=True, help="the mooncake_client's HOST:PORT")
    ap.add_argument("--reps", type=int, default=20, help="calls per row (4 KiB rows: 20x this)")
    ap.add_argument("--mem-pool", type=int, default=64 * MiB, help="setup_dummy's mem_pool_size")
    ap.add_argument("--local-buffer", type=int, default=64 * MiB, help="setup_dummy's local_buffer_size")
    ap.add_argument("--full", action="store_true", help="also time a full client in this process")
    ap.add_argument("--interval", type=float, default=0.005, help="recover: seconds between put + get tries")
    ap.add_argument("--tag", default="dk", help="fill/verify: key prefix of the round")
    ap.add_argument("--count", type=int, default=128, help="verify: objects 0 .. count-1 are read")
    ap.add_argument("--keep", type=int, default=128, help="fill: objects kept before the ring starts")
    ap.add_argument("--ring", type=int, default=32, help="fill: newest objects kept past --keep")
    ap.add_argument("--fill-limit", type=float, default=60.0, help="fill: seconds it puts at most")
    ap.add_argument("--large-every", type=int, default=2, help="fill/verify: every n-th object is 1 MiB, the rest 4 KiB")
    ap.add_argument("--acked", default="", help="verify: indexes whose put returned 0 (comma-separated)")
    ap.add_argument("--settle", type=float, default=10.0, help="verify: seconds to wait for the first get")
    args = ap.parse_args()
    {"recover": recover, "fill": fill, "verify": verify}.get(args.role, run)(args)


if __name__ == "__main__":
    main()
