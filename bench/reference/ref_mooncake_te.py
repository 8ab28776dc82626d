"""Reference measurement: the ORIGINAL Mooncake Transfer Engine over tcp, same workload as
bench/transfer/bench_transfer_engine.py. Runs inside the reference venv (PyPI
mooncake-transfer-engine-non-cuda), using only its public Python API; prints one JSON object.

    /work/venvs/mooncake-ref/bin/python bench/reference/ref_mooncake_te.py [--quick]

This is our own script; it does not copy anything from the Mooncake sources.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")

import numpy as np
from mooncake.engine import TransferEngine

MB = 1 << 20
REGION = 64 * MB


def serve() -> int:
    eng = TransferEngine()
    if eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        print(json.dumps({"error": "initialize failed"}), flush=True)
        return 1
    buf = np.random.default_rng(2).integers(0, 256, REGION, dtype=np.uint8)
    assert eng.register_memory(buf.ctypes.data, buf.nbytes) == 0
    print(json.dumps({"segment": f"127.0.0.1:{eng.get_rpc_port()}", "addr": buf.ctypes.data}), flush=True)
    sys.stdin.readline()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--serve", action="store_true", help="(internal) run the target side")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    a = ap.parse_args()
    if a.serve:
        return serve()
    proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    info = json.loads(proc.stdout.readline())
    eng = TransferEngine()
    assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    src = np.random.default_rng(1).integers(0, 256, REGION, dtype=np.uint8)
    assert eng.register_memory(src.ctypes.data, src.nbytes) == 0
    seg, raddr = info["segment"], info["addr"]
    reps = {4096: 300, 64 * 1024: 200, MB: 50, 64 * MB: 5}
    if a.quick:
        reps = {k: max(2, v // 5) for k, v in reps.items()}
    out: dict[str, dict] = {}
    for op in ("write", "read"):
        fn = eng.transfer_sync_write if op == "write" else eng.transfer_sync_read
        bfn = eng.batch_transfer_sync_write if op == "write" else eng.batch_transfer_sync_read
        for size, n in reps.items():
            assert fn(seg, src.ctypes.data, raddr, size) == 0  # warm up / connect
            ts = []
            for _ in range(n):
                t0 = time.perf_counter()
                rc = fn(seg, src.ctypes.data, raddr, size)
                ts.append(time.perf_counter() - t0)
                assert rc == 0
            out[f"{op}:{size}"] = {"median_s": statistics.median(ts), "bytes": size}
        locs = [src.ctypes.data + i * MB for i in range(64)]
        rems = [raddr + i * MB for i in range(64)]
        ts = []
        for _ in range(reps[64 * MB]):
            t0 = time.perf_counter()
            assert bfn(seg, locs, rems, [MB] * 64) == 0
            ts.append(time.perf_counter() - t0)
        out[f"{op}:batch64x1M"] = {"median_s": statistics.median(ts), "bytes": 64 * MB}
    proc.stdin.write("x\n")
    proc.stdin.flush()
    proc.wait(10)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
