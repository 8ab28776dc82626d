"""Many-small-block batch benchmark: the SGLang KV hand-off pattern on the bare engine.

    python3 -m bench.transfer.bench_te_batch [--blocks 16384] [--block-kib 16] [--rounds 5] [--baseline-tree DIR]
    python3 -m bench.transfer.bench_te_batch --tcp [--baseline-tree DIR]     # tcp, write + read, vs a raw socket

A target process (mooncake_lab/te_peer.py, P2PHANDSHAKE) registers one buffer; this process
registers a random source buffer and times ``batch_transfer_sync_write`` of ``--blocks``
blocks whose destinations are a random permutation of the target's pages (nothing can be
merged), transport chosen by the engine (cma on one host; ``--force-tcp`` for tcp). After the
timed rounds the whole target buffer is hashed and compared with the expected bytes.
Printed: median and best GB/s, and a one-thread numpy memcpy of the same bytes as reference.

``--tcp`` forces the tcp transport (MC_FORCE_TCP=1 in both processes), times
``batch_transfer_sync_write`` *and* ``batch_transfer_sync_read`` (the read gathers the same
scattered pages back into a second local buffer, also verified), and measures in the same
run a raw Python socket stream of the same bytes between two processes (``sendall`` of the
whole buffer, ``recv_into`` on the other side, 1-byte ack) as the reference, interleaved
round by round with our write and read: printed ratio ours/raw is the median of per-round
ratios (target >= 0.8x).

``--baseline-tree DIR`` also runs the same measurement with ``mooncake_core`` imported from DIR
(e.g. ``git archive HEAD~1 mooncake_core | tar -x -C /tmp/base``) and prints new/old ratios,
so a before/after comparison comes from one run on the same (possibly loaded) machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER = os.path.join(ROOT, "mooncake_lab", "te_peer.py")


def _measure(a: argparse.Namespace) -> dict:
    """Runs inside a child process (so the tree under test is the one imported)."""
    from mooncake_core.engine import TransferEngine
    from mooncake_core.utils.log import setup_logging

    setup_logging("WARNING")
    blk = a.block_kib * 1024
    size = a.blocks * blk
    if a.force_tcp or a.tcp:
        os.environ["MC_FORCE_TCP"] = "1"  # the initiator picks the transport: set it here too
    env = dict(os.environ)
    peer = subprocess.Popen([sys.executable, PEER, "--metadata", "P2PHANDSHAKE", "--size", str(size)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    raw = RawStream(size) if a.tcp else None
    try:
        info = json.loads(peer.stdout.readline())
        eng = TransferEngine()
        assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, eng.last_error
        src = np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8)
        assert eng.register_memory(src.ctypes.data, size) == 0
        perm = np.random.default_rng(3).permutation(a.blocks)
        bufs = (src.ctypes.data + np.arange(a.blocks) * blk).tolist()
        dsts = (info["addr"] + perm * blk).tolist()
        lens = [blk] * a.blocks
        back = np.ones_like(src)  # tcp mode: the scattered pages are read back into it, in source order
        bbufs = (back.ctypes.data + np.arange(a.blocks) * blk).tolist()
        if a.tcp:
            assert eng.register_memory(back.ctypes.data, size) == 0

        def timed(fn) -> float:
            t0 = time.perf_counter()
            rc = fn()
            assert rc in (0, None), eng.last_error
            return time.perf_counter() - t0

        times: list[float] = []
        rtimes: list[float] = []
        raws: list[float] = []
        # tcp mode interleaves write, read and the raw-socket reference round by round, so load
        # from other processes on a shared box hits both sides of each ratio alike
        for _ in range(a.rounds + 1):
            times.append(timed(lambda: eng.batch_transfer_sync_write(info["segment"], bufs, dsts, lens)))
            if a.tcp:
                rtimes.append(timed(lambda: eng.batch_transfer_sync_read(info["segment"], bbufs, dsts, lens)))
                raws.append(timed(raw.once))
        expect = np.empty_like(src)
        expect.reshape(a.blocks, blk)[perm] = src.reshape(a.blocks, blk)
        peer.stdin.write(f"sha 0 {size}\n")
        peer.stdin.flush()
        ok = peer.stdout.readline().strip() == hashlib.sha256(expect.tobytes()).hexdigest()
        if a.tcp:
            ok = ok and bool(np.array_equal(back, src))
        transport = eng.transport_for(info["segment"])
        peer.stdin.write("exit\n")
        peer.stdin.flush()
        eng.close()
        t = times[1:]
        out = {"ok": ok, "bytes": size, "median_s": statistics.median(t), "best_s": min(t),
               "transport": transport}
        if a.tcp:
            r, w = rtimes[1:], raws[1:]
            out.update(read_median_s=statistics.median(r), read_best_s=min(r), raw_median_s=statistics.median(w),
                       raw_best_s=min(w),
                       write_ratios=[x / y for x, y in zip(w, t)], read_ratios=[x / y for x, y in zip(w, r)])
        return out
    finally:
        if raw is not None:
            raw.close()
        try:
            peer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            peer.kill()


def _raw_sink(nbytes: int) -> int:
    """Child role of the raw-socket reference: receive ``nbytes`` per round, ack each."""
    import socket

    ls = socket.create_server(("127.0.0.1", 0))
    print(ls.getsockname()[1], flush=True)
    ls.settimeout(60)
    conn, _ = ls.accept()
    conn.settimeout(60)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = np.ones(nbytes, dtype=np.uint8)
    view = memoryview(buf).cast("B")
    while True:
        got = 0
        while got < nbytes:
            k = conn.recv_into(view[got:], nbytes - got)
            if k == 0:
                return 0 if got == 0 else 1
            got += k
        conn.sendall(b"k")


class RawStream:
    """The reference: a raw Python socket stream of ``nbytes`` to another process
    (``sendall`` of one buffer -> ``recv_into``, then a 1-byte ack), one round per ``once``."""

    def __init__(self, nbytes: int):
        import socket

        self.sink = subprocess.Popen([sys.executable, __file__, "--raw-sink", str(nbytes)],
                                     stdout=subprocess.PIPE, text=True)
        port = int(self.sink.stdout.readline())
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.src = np.random.default_rng(5).integers(0, 256, nbytes, dtype=np.uint8)
        self.view = memoryview(self.src).cast("B")

    def once(self) -> None:
        self.sock.sendall(self.view)
        if self.sock.recv(1) != b"k":
            raise SystemExit("raw socket sink failed")

    def close(self) -> None:
        self.sock.close()
        try:
            self.sink.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.sink.kill()


def run_tree(tree: str, argv: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, __file__, "--child", *argv], env=env, capture_output=True, text=True,
                         timeout=600, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"measurement in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=16384, help="blocks per batch (default 16384)")
    p.add_argument("--block-kib", type=int, default=16, help="KiB per block (default 16)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up (default 5)")
    p.add_argument("--force-tcp", action="store_true", help="MC_FORCE_TCP=1 (tcp instead of cma)")
    p.add_argument("--baseline-tree", default="", help="also measure mooncake_core imported from this dir")
    p.add_argument("--passes", type=int, default=2, help="interleaved passes per tree, pooled (default 2)")
    p.add_argument("--tcp", action="store_true",
                   help="tcp mode: force tcp, time write and read, compare with a raw socket stream")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--raw-sink", type=int, default=0, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = build_parser()
    a = p.parse_args(argv)
    if a.raw_sink:
        return _raw_sink(a.raw_sink)
    if a.child:
        print(json.dumps(_measure(a)), flush=True)
        return 0
    child_argv = [x for x in argv if not x.startswith("--baseline-tree") and x != a.baseline_tree]
    trees = [("current", ROOT)] + ([("baseline", a.baseline_tree)] if a.baseline_tree else [])
    res: dict[str, list[dict]] = {n: [] for n, _ in trees}
    n = a.blocks * a.block_kib * 1024
    for _ in range(max(1, a.passes)):
        for name, tree in trees:
            res[name].append(run_tree(tree, child_argv))
    src = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    dst = np.ones_like(src)  # touched: page faults are not part of the reference
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    memcpy = n / best / 1e9
    print(f"batch of {a.blocks} x {a.block_kib} KiB scattered blocks = {n / 2**20:.0f} MiB")
    med = {}
    for name, rs in res.items():
        m = statistics.median(r["median_s"] for r in rs)
        best = min(r["best_s"] for r in rs)
        med[name] = m
        ok = all(r["ok"] for r in rs)
        print(f"  {name:9s} median {m * 1e3:8.1f} ms {n / m / 1e9:6.2f} GB/s  best {n / best / 1e9:6.2f} GB/s  "
              f"transport {rs[0]['transport']}  verified {'yes' if ok else 'NO'}")
    print(f"  memcpy    {n / 1e9 / memcpy * 1e3:8.1f} ms {memcpy:6.2f} GB/s  (numpy, one thread)")
    if "baseline" in med:
        print(f"  ratio current/baseline {med['baseline'] / med['current']:5.2f}x")
    if a.tcp:
        rmed = {}
        for name, rs in res.items():
            m = statistics.median(r["read_median_s"] for r in rs)
            best = min(r["read_best_s"] for r in rs)
            rmed[name] = m
            print(f"  {name:9s} read   median {m * 1e3:8.1f} ms {n / m / 1e9:6.2f} GB/s  best {n / best / 1e9:6.2f} GB/s")
        raw_m = statistics.median(r["raw_median_s"] for rs in res.values() for r in rs)
        raw_b = min(r["raw_best_s"] for rs in res.values() for r in rs)
        print(f"  raw socket     median {raw_m * 1e3:8.1f} ms {n / raw_m / 1e9:6.2f} GB/s  best {n / raw_b / 1e9:6.2f} GB/s"
              f"  (Python sendall -> recv_into, same bytes, two processes)")
        for name, rs in res.items():
            w = statistics.median(x for r in rs for x in r["write_ratios"])
            rd = statistics.median(x for r in rs for x in r["read_ratios"])
            print(f"  ratio {name}/raw socket (median of per-round ratios): write {w:5.2f}x  read {rd:5.2f}x"
                  f"  (target >= 0.8x)")
        if "baseline" in rmed:
            print(f"  ratio current/baseline read {rmed['baseline'] / rmed['current']:5.2f}x")
    return 0 if all(r["ok"] for rs in res.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
