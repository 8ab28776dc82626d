"""A Transfer Engine peer process whose memory is on a GPU (or, with --host, in host memory).

Ready line: {"segment", "addrs", "size", "pid"}. Commands (one line each, one answer line):
``sha I OFF LEN`` (sha256 of region I's bytes, copied to the host), ``unregister I``,
``exit``. Region i holds np.random.default_rng(seed + i) bytes. Used by tests/gpu and
bench/gpu/bench_gpu_transfer.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mooncake_core.engine import TransferEngine  # noqa: E402


def region_bytes(seed: int, i: int, size: int) -> np.ndarray:
    return np.random.default_rng(seed + i).integers(0, 256, size, dtype=np.uint8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--regions", type=int, default=1, help="separate allocations (cudaMalloc each)")
    ap.add_argument("--size", type=int, default=1 << 20, help="bytes per region")
    ap.add_argument("--seed", type=int, default=7, help="region i holds default_rng(seed + i) bytes")
    ap.add_argument("--host", action="store_true", help="host memory instead of the GPU (a reference)")
    ap.add_argument("--zero", action="store_true", help="leave the regions zeroed (faster start for big ones)")
    ap.add_argument("--protocol", default="tcp", help="initialize's protocol (rdma: the UCX transport)")
    a = ap.parse_args()
    eng = TransferEngine()
    if eng.initialize("127.0.0.1", "P2PHANDSHAKE", a.protocol, "") != 0:
        print(json.dumps({"error": eng.last_error}), flush=True)
        return
    addrs: list[int] = []
    keep: list[np.ndarray] = []
    if a.host:
        for i in range(a.regions):
            arr = np.zeros(a.size, np.uint8) if a.zero else region_bytes(a.seed, i, a.size)
            keep.append(arr)
            addrs.append(arr.ctypes.data)
        loc = "cpu:0"
    else:
        from cuda.bindings import runtime as rt

        from mooncake_core.transfer.cuda.ipc import copier
        c = copier()
        if c is None:
            print(json.dumps({"error": "no CUDA device"}), flush=True)
            return
        c.set_device(0)
        for i in range(a.regions):
            err, ptr = rt.cudaMalloc(a.size)
            if err != rt.cudaError_t.cudaSuccess:
                print(json.dumps({"error": f"cudaMalloc: {err}"}), flush=True)
                return
            if a.zero:
                rt.cudaMemset(ptr, 0, a.size)
            else:
                data = region_bytes(a.seed, i, a.size)  # held: a temporary's address would dangle
                c.copy(int(ptr), data.ctypes.data, a.size)
            addrs.append(int(ptr))
        loc = "cuda:0"
    for p in addrs:
        if eng.register_memory(p, a.size, loc) != 0:
            print(json.dumps({"error": eng.last_error}), flush=True)
            return
    print(json.dumps({"segment": eng.get_local_segment_name(), "addrs": addrs, "size": a.size, "pid": os.getpid(),
                      "location": eng.get_segment_buffers(eng.get_local_segment_name())[0][2]}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "sha":
            i, off, n = int(cmd[1]), int(cmd[2]), int(cmd[3])
            host = np.empty(n, np.uint8)
            if a.host:
                host[:] = keep[i][off:off + n]
            else:
                c.copy(host.ctypes.data, addrs[i] + off, n)
            print(hashlib.sha256(host.tobytes()).hexdigest(), flush=True)
        elif cmd[0] == "unregister":
            print(eng.unregister_memory(addrs[int(cmd[1])]), flush=True)
        elif cmd[0] == "exit":
            break
    eng.close()


if __name__ == "__main__":
    main()
