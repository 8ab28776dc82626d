"""Do more threads copy one large buffer faster on this host? (issue 12: one 64 MiB descriptor)

    python3 -m bench.transfer.bench_copy_threads [--mib 64] [--reps 7] [--no-engine]

Why: the same-host transport (cma) already cuts a large transfer into 8 MiB chunks copied by
``cma.COPY_THREADS`` threads. Whether one 64 MiB descriptor can go faster than a one-copy
transport (UCX sm) depends on whether a second thread adds bandwidth on this machine or the
memory bus is the limit. Part 1 times the raw copies with 1, 2 and 4 threads, each copying
1/n of the buffer (libc ``memcpy`` and numpy in-process; ``process_vm_readv`` /
``process_vm_writev`` against a forked child). Part 2 times the engine's own
``transfer_sync_read`` / ``transfer_sync_write`` of one descriptor to a peer process over cma
with the copy-thread count forced to 1..4. Cases are interleaved run by run, so load from other
processes hits all of them alike. Prints medians (best in parentheses), GB/s = 1e9 B/s, and the
load average. Only a quiet machine gives a meaningful answer.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER = os.path.join(ROOT, "mooncake_lab", "te_peer.py")
THREADS = (1, 2, 4)


class _Iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    for f in (libc.process_vm_readv, libc.process_vm_writev):
        f.argtypes = [ctypes.c_int, ctypes.POINTER(_Iov), ctypes.c_ulong, ctypes.POINTER(_Iov), ctypes.c_ulong,
                      ctypes.c_ulong]
        f.restype = ctypes.c_ssize_t
    return libc


def _split(fn: Callable[[int, int], None], size: int, threads: int) -> float:
    """Seconds for ``threads`` threads to run ``fn(offset, n)`` over equal parts, started together."""
    per = size // threads
    if threads == 1:
        t0 = time.perf_counter()
        fn(0, size)
        return time.perf_counter() - t0
    bar = threading.Barrier(threads + 1)

    def body(k: int) -> None:
        bar.wait()
        fn(k * per, per)

    ts = [threading.Thread(target=body, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    t0 = time.perf_counter()
    bar.wait()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def _row(name: str, res: dict, keys: tuple, size: int) -> str:
    cells = [f"{k}T {size / statistics.median(res[k]) / 1e9:6.2f} ({size / min(res[k]) / 1e9:5.2f})" for k in keys]
    ratio = statistics.median(res[keys[0]]) / statistics.median(res[keys[1]])
    return f"  {name:10s} " + "  ".join(cells) + f"   {keys[1]}T/{keys[0]}T {ratio:.2f}x"


def raw_copies(size: int, reps: int) -> None:
    libc = _libc()
    src = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    dst = np.ones(size, dtype=np.uint8)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the remote side of process_vm_*: holds a buffer until killed
        peer = np.random.default_rng(2).integers(0, 256, size, dtype=np.uint8)
        os.write(w, peer.ctypes.data.to_bytes(8, "little"))
        time.sleep(600)
        os._exit(0)
    try:
        paddr = int.from_bytes(os.read(r, 8), "little")

        def vm(fn: Callable) -> Callable[[int, int], None]:
            def go(off: int, n: int) -> None:
                lo, re = _Iov(dst.ctypes.data + off, n), _Iov(paddr + off, n)
                if fn(pid, ctypes.byref(lo), 1, ctypes.byref(re), 1, 0) != n:
                    raise OSError(ctypes.get_errno(), "process_vm_* moved fewer bytes")
            return go

        cases: list[tuple[str, Callable[[int, int], None]]] = [
            ("memcpy", lambda off, n: libc.memcpy(dst.ctypes.data + off, src.ctypes.data + off, n)),
            ("numpy", lambda off, n: np.copyto(dst[off:off + n], src[off:off + n])),
            ("vm_readv", vm(libc.process_vm_readv)), ("vm_writev", vm(libc.process_vm_writev))]
        res: dict[tuple[str, int], list[float]] = {}
        for rep in range(reps):
            print(f"  raw round {rep + 1}/{reps}", file=sys.stderr, flush=True)
            for name, fn in cases:
                for th in THREADS:
                    res.setdefault((name, th), []).append(_split(fn, size, th))
        print(f"raw copy of {size >> 20} MiB, threads each copying 1/n, median (best) GB/s of {reps} interleaved "
              f"rounds, load {' '.join(open('/proc/loadavg').read().split()[:3])}")
        for name, _ in cases:
            print(_row(name, {th: res[(name, th)] for th in THREADS}, THREADS, size))
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def engine_copies(size: int, reps: int) -> None:
    from mooncake_core.engine import TransferEngine
    from mooncake_core.transfer import cma
    from mooncake_core.utils.log import setup_logging

    setup_logging("WARNING")
    peer = subprocess.Popen([sys.executable, PEER, "--metadata", "P2PHANDSHAKE", "--size", str(size)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    saved = cma.COPY_THREADS
    try:
        info = json.loads(peer.stdout.readline())
        src = np.random.default_rng(5).integers(0, 256, size, dtype=np.uint8)
        cma.COPY_THREADS = 4  # the pool is sized at start-up; the count used is set per transfer below
        eng = TransferEngine()
        if eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0 or \
                eng.register_memory(src.ctypes.data, size) != 0:
            raise SystemExit(f"engine start failed: {eng.last_error}")
        counts = (1, 2, 3, 4)
        res: dict[tuple[str, int], list[float]] = {}
        for rep in range(reps + 1):  # the first round (connection, probe) is dropped
            print(f"  engine round {rep + 1}/{reps + 1}", file=sys.stderr, flush=True)
            for th in counts:
                cma.COPY_THREADS = th
                for op, fn in (("write", eng.transfer_sync_write), ("read", eng.transfer_sync_read)):
                    t0 = time.perf_counter()
                    if fn(info["segment"], src.ctypes.data, info["addr"], size) != 0:
                        raise SystemExit(f"{op} failed: {eng.last_error}")
                    if rep:
                        res.setdefault((op, th), []).append(time.perf_counter() - t0)
        print(f"engine, one {size >> 20} MiB descriptor, transport {eng.transport_for(info['segment'])}, copy threads "
              f"forced, median (best) GB/s of {reps} rounds, load {' '.join(open('/proc/loadavg').read().split()[:3])}")
        for op in ("write", "read"):
            print(_row(op, {th: res[(op, th)] for th in counts}, counts, size))
        eng.close()
    finally:
        cma.COPY_THREADS = saved
        try:
            peer.stdin.write("exit\n")
            peer.stdin.flush()
            peer.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            peer.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=64, help="buffer size in MiB (default 64)")
    ap.add_argument("--reps", type=int, default=7, help="interleaved timed rounds per case (default 7)")
    ap.add_argument("--no-engine", action="store_true", help="raw copies only (skip the engine part)")
    a = ap.parse_args()
    size = a.mib << 20
    raw_copies(size, a.reps)
    if not a.no_engine:
        engine_copies(size, a.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
