"""Store workload written against the *public* Mooncake Store Python API only.

The same file drives both implementations, so the comparison is apples to apples:

* inside the reference venv (``/work/venvs/mooncake-ref``, PyPI
  ``mooncake-transfer-engine-non-cuda``) ``import mooncake.store`` is the original;
* with ``--impl ours`` it first calls ``mooncake_core.compat.install(force=True)`` so the
  very same import resolves to this project.

Roles:
  holder  set up a client that contributes ``--segment`` bytes of memory and wait until
          stdin closes (the "other process" the data lives in);
  run     a client without a segment that runs the timed workload against the holder's
          memory and prints one JSON object of results on stdout.

Run by ``bench/store/bench_store.py``; not meant to be called by hand (but it can be:
``python bench/reference/ref_mooncake_store.py run --master 127.0.0.1:50051 --meta http://...``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import numpy as np

MiB = 1 << 20


def _store_module(impl: str):
    if impl == "ours":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the checkout
        from mooncake_core import compat

        compat.install(force=True)
    from mooncake.store import MooncakeDistributedStore

    return MooncakeDistributedStore


def _setup(args, segment: int, local_buffer: int):
    Store = _store_module(args.impl)
    s = Store()
    rc = s.setup("127.0.0.1", args.meta, segment, local_buffer, "tcp", "", args.master)
    if rc != 0:
        raise SystemExit(f"setup failed with {rc}")
    return s


def holder(args) -> None:
    s = _setup(args, args.segment, 16 * MiB)
    print(json.dumps({"ready": s.get_hostname()}), flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    s.close()


def _rate(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def run(args) -> None:
    s = _setup(args, 0, args.local_buffer)
    rng = np.random.default_rng(42)
    big = rng.integers(0, 256, 64 * MiB, dtype=np.uint8)
    big_bytes = big.tobytes()
    results: dict[str, float] = {}
    errors: list[str] = []
    reps = args.reps

    def check(cond: bool, what: str) -> None:
        if not cond:
            errors.append(what)

    def clear() -> None:
        # objects just read are leased (--default_kv_lease_ttl=2000 in bench_store.py):
        # let the leases run out so remove_all frees everything, for both implementations
        time.sleep(args.lease_wait)
        s.remove_all()

    def timed(fn, size: int) -> float:
        """GB/s of one call (single-op rows report the median over calls: robust to a
        scheduler hiccup on a shared 2-core box)."""
        t0 = time.perf_counter()
        fn()
        return _rate(size, time.perf_counter() - t0)

    # --- warm-up (untimed): connections, first-touch of memory on both sides
    t_end = time.perf_counter() + args.warmup
    i = 0
    while time.perf_counter() < t_end:
        s.put(f"warm-{i % 32}", big_bytes[:MiB])
        s.get(f"warm-{i % 32}")
        i += 1
    clear()

    # --- put/get of bytes objects
    for size, n, label in ((MiB, 40 * reps, "1MiB"), (64 * MiB, 3 * reps, "64MiB")):
        val = big_bytes[:size]
        keys = [f"pg-{label}-{i}" for i in range(n)]
        rates = [timed(lambda k=k, v=val: check(s.put(k, v) == 0, f"put {k}"), size) for k in keys]
        results[f"put {label}"] = statistics.median(rates)
        rates = [timed(lambda k=k, n=size: check(len(s.get(k)) == n, f"get {k}"), size) for k in keys]
        results[f"get {label}"] = statistics.median(rates)
        check(s.get(keys[-1]) == val, f"get {label} bytes differ")
        clear()

    # --- zero copy: put_from / get_into with registered buffers
    dst = np.zeros(64 * MiB, dtype=np.uint8)
    src_ptr, dst_ptr = int(big.ctypes.data), int(dst.ctypes.data)
    check(s.register_buffer(src_ptr, big.nbytes) == 0, "register src")
    check(s.register_buffer(dst_ptr, dst.nbytes) == 0, "register dst")
    for size, n, label in ((MiB, 40 * reps, "1MiB"), (64 * MiB, 3 * reps, "64MiB")):
        keys = [f"zc-{label}-{i}" for i in range(n)]
        rates = [timed(lambda k=k, n=size: check(s.put_from(k, src_ptr, n) == 0, f"put_from {k}"), size)
                 for k in keys]
        results[f"put_from {label}"] = statistics.median(rates)
        rates = [timed(lambda k=k, n=size: check(s.get_into(k, dst_ptr, n) == n, f"get_into {k}"), size)
                 for k in keys]
        results[f"get_into {label}"] = statistics.median(rates)
        check(bool(np.array_equal(dst[:size], big[:size])), f"get_into {label} bytes differ")
        clear()

    # --- batches of 64 x 1 MiB
    bput, bget, bzput, bzget = [], [], [], []
    for r in range(reps):
        keys = [f"b{r}-{i}" for i in range(64)]
        vals = [big_bytes[i * MiB:(i + 1) * MiB] for i in range(64)]
        t0 = time.perf_counter()
        check(s.put_batch(keys, vals) == 0, "put_batch")
        bput.append(_rate(64 * MiB, time.perf_counter() - t0))
        t0 = time.perf_counter()
        got = s.get_batch(keys)
        bget.append(_rate(64 * MiB, time.perf_counter() - t0))
        check(got[5] == vals[5] and got[63] == vals[63], "get_batch bytes differ")
        zkeys = [f"bz{r}-{i}" for i in range(64)]
        ptrs = [src_ptr + i * MiB for i in range(64)]
        t0 = time.perf_counter()
        rcs = s.batch_put_from(zkeys, ptrs, [MiB] * 64)
        bzput.append(_rate(64 * MiB, time.perf_counter() - t0))
        check(list(rcs) == [0] * 64, "batch_put_from")
        dptrs = [dst_ptr + i * MiB for i in range(64)]
        dst[:] = 0
        t0 = time.perf_counter()
        rcs = s.batch_get_into(zkeys, dptrs, [MiB] * 64)
        bzget.append(_rate(64 * MiB, time.perf_counter() - t0))
        check(list(rcs) == [MiB] * 64 and bool(np.array_equal(dst, big)), "batch_get_into")
        clear()
    results["put_batch 64x1MiB"] = statistics.median(bput)
    results["get_batch 64x1MiB"] = statistics.median(bget)
    results["batch_put_from 64x1MiB"] = statistics.median(bzput)
    results["batch_get_into 64x1MiB"] = statistics.median(bzget)
    s.unregister_buffer(src_ptr)
    s.unregister_buffer(dst_ptr)

    # --- 8 threads x 100 x 1 MiB (put, then get)
    threads, per = 8, args.thread_ops

    def worker(tid: int, op: str) -> None:
        val = big_bytes[tid * MiB:(tid + 1) * MiB]
        for i in range(per):
            k = f"t{tid}-{i}"
            if op == "put":
                check(s.put(k, val) == 0, f"thread put {k}")
            else:
                check(len(s.get(k)) == MiB, f"thread get {k}")

    for op in ("put", "get"):
        ts = [threading.Thread(target=worker, args=(t, op)) for t in range(threads)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        results[f"8 threads x {per} x 1MiB {op}"] = _rate(threads * per * MiB, time.perf_counter() - t0)
    clear()

    # --- is_exist QPS from one thread
    check(s.put("exists", b"x" * 100) == 0, "put exists")
    n = 0
    t0 = time.perf_counter()
    end = t0 + args.qps_seconds
    while True:
        for _ in range(200):
            s.is_exist("exists")
        n += 200
        if time.perf_counter() >= end:
            break
    results["is_exist QPS"] = n / (time.perf_counter() - t0)
    check(s.is_exist("exists") == 1 and s.is_exist("missing-key") == 0, "is_exist values")
    clear()
    s.close()
    print(json.dumps({"results": results, "errors": errors[:20]}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", choices=["holder", "run"], help="holder: contribute memory; run: timed workload")
    p.add_argument("--impl", choices=["ref", "ours"], default="ref",
                   help="'ours' aliases mooncake.store to mooncake_core first")
    p.add_argument("--master", required=True, help="master address host:port")
    p.add_argument("--meta", required=True, help="metadata server, e.g. http://127.0.0.1:8080/metadata")
    p.add_argument("--segment", type=int, default=2 << 30, help="holder: bytes of memory to contribute")
    p.add_argument("--local-buffer", type=int, default=512 * MiB, help="run: local buffer bytes")
    p.add_argument("--reps", type=int, default=3, help="repetitions (scales the op counts)")
    p.add_argument("--thread-ops", type=int, default=100, help="ops per thread in the 8-thread test")
    p.add_argument("--qps-seconds", type=float, default=2.0, help="duration of the is_exist test")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of untimed put/get before measuring")
    p.add_argument("--lease-wait", type=float, default=2.1,
                   help="seconds to wait for read leases to expire before clearing the store")
    args = p.parse_args()
    holder(args) if args.role == "holder" else run(args)


if __name__ == "__main__":
    main()
