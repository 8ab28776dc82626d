"""The UCX transport (``protocol="rdma"``) against our tcp and cma transports, same run.

    python3 -m bench.transfer.bench_ucx [--rounds 3] [--quick] [--json FILE]
    python3 -m bench.transfer.bench_ucx --nics [--rate 400mbit] [--rounds 5]     (root: namespaces, veth, tc)

Two target processes (engines on ``protocol="rdma"``), one with ``UCX_TLS=tcp`` and one with
``UCX_TLS=sm,self``; the initiator has one engine per lane set. Every row's reference is
measured in the same round on the same target, through ``transport_hint``: ``tcp`` (our tcp
transport) for UCX over tcp, ``cma`` (our cross-memory attach) for UCX over shared memory.
Rounds interleave UCX and reference; medians are printed, then ratios against the targets
of the issue: UCX-over-tcp >= 0.9x our tcp (64 MiB), UCX-over-sm >= 0.8x our cma (64 MiB),
and, reported, 4 KiB latency and a 32,768 x 16 KiB scattered batch against our tcp.
No RDMA NIC here: these are the UCX code path's costs over emulated lanes, not RDMA figures.

``--nics``: two "hosts" (network + pid + UTS namespaces, mooncake_lab/twohosts.py) with two
data NICs shaped by ``tc tbf`` to ``--rate`` each; UCX over tcp on them. Writes and reads of
32 MiB with ``device_name="d0"`` and ``"d0,d1"`` (same run, interleaved), the ratio (target
>= 1.8x), then a 64 MiB write during which ``d1`` goes down: its time against an undisturbed
one and a byte-exact check, and the bytes each NIC carried.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from bench.transfer.bench_transfer_engine import _time  # median of n runs after a warm-up

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MB = 1 << 20
BLOCK = 16 * 1024
LANES = {"tcp": ("tcp", "tcp"), "sm": ("sm,self", "cma")}  # name -> (UCX_TLS, reference hint)


def serve(size: int) -> int:
    from mooncake_core.engine import TransferEngine
    from mooncake_core.utils.log import setup_logging
    setup_logging("ERROR")
    eng = TransferEngine()
    assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0, eng.last_error
    buf = np.zeros(size, dtype=np.uint8)
    buf[::4096] = 1  # touch every page
    assert eng.register_memory(buf.ctypes.data, buf.nbytes) == 0
    print(json.dumps({"segment": eng.get_local_segment_name(), "addr": buf.ctypes.data}), flush=True)
    sys.stdin.readline()
    eng.close()
    return 0


def nics(rounds: int, rate: str) -> int:
    import threading

    from mooncake_lab.line_peer import spawn_line_peer
    from mooncake_lab.te_helpers import PEER, Peer, sha
    from mooncake_lab.twohosts import TwoHosts, available
    why = available()
    if why:
        print(f"two-host lab unavailable: {why}")
        return 1
    env = {**os.environ, "UCX_TLS": "tcp", "MC_SLICE_TIMEOUT": "1", "MC_RDMA_RAIL_PAUSE_SECONDS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    size = 64 * MB
    with TwoHosts(rate=rate) as lab:
        def start(host: str, dev: str, seed: int) -> Peer:
            argv = lab.argv(host, [sys.executable, PEER, "--metadata", "P2PHANDSHAKE", "--size", str(size),
                                   "--seed", str(seed), "--hostname", lab.ip[host], "--protocol", "rdma",
                                   "--device", dev])
            proc, info = spawn_line_peer(argv, f"peer on {host}", env=env)
            return Peer(proc, info["segment"], info["addr"], info["size"], info["pid"], info["rpc_port"], seed)

        def xfer(p: Peer, tgt: Peer, op: str, n: int) -> float:
            r = json.loads(p.cmd(f"xfer {op} {tgt.segment} {tgt.addr} 0 {n}", timeout=300))
            assert r["rc"] == 0, r
            return float(r["s"])

        tgt = start("b", "d0,d1", 1)
        one, two = start("a", "d0", 2), start("a", "d0,d1", 3)
        res: dict[str, list[float]] = {}
        for _ in range(rounds):
            for name, p in (("one NIC", one), ("two NICs", two)):
                for op in ("w", "r"):
                    res.setdefault(f"{name} {op}", []).append(xfer(p, tgt, op, 32 * MB))
        print(f"two hosts, NICs shaped to {rate} each, UCX over tcp, 32 MiB, median of {rounds}")
        for k, v in res.items():
            print(f"  {k:12s} {32 / statistics.median(v):7.1f} MiB/s")
        for op, word in (("w", "write"), ("r", "read")):
            ratio = statistics.median(res[f"one NIC {op}"]) / statistics.median(res[f"two NICs {op}"])
            print(f"  two NICs / one, {word}: {ratio:.2f}x  (target >= 1.8)  {'OK' if ratio >= 1.8 else 'SHORT'}")
        calm = xfer(two, tgt, "w", size)
        cut = threading.Timer(0.2, lab.link, args=("d1", False))
        cut.start()
        hit = xfer(two, tgt, "w", size)
        cut.join()
        exact = tgt.sha(0, size) == sha(two.expected())
        lanes = {ln: n for _t, ln, op, n in json.loads(two.cmd("lanes")) if op == "write"}
        print(f"failover: 64 MiB write, d1 down after 0.2 s: {hit:.2f} s (undisturbed {calm:.2f} s, "
              f"MC_SLICE_TIMEOUT=1), byte-exact: {exact}; bytes per NIC so far: {lanes}")
        lab.link("d1", True)
        time.sleep(1.5)
        xfer(two, tgt, "w", size)
        lanes2 = {ln: n for _t, ln, op, n in json.loads(two.cmd("lanes")) if op == "write"}
        print(f"d1 back after MC_RDMA_RAIL_PAUSE_SECONDS=1: next 64 MiB write put "
              f"{(lanes2.get('tcp/d1', 0) - lanes.get('tcp/d1', 0)) >> 20} MiB on d1")
        for p in (one, two, tgt):
            p.stop()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds; each measures UCX and its reference (default 3)")
    ap.add_argument("--quick", action="store_true", help="one round, fewer repetitions, an 8,192-block batch")
    ap.add_argument("--blocks", type=int, default=32768, help="blocks of 16 KiB in the batch row (default 32768)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    ap.add_argument("--nics", action="store_true", help="the two-NIC run between two namespaced hosts (root)")
    ap.add_argument("--rate", default="400mbit", help="tc tbf rate of each data NIC with --nics (default 400mbit)")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        return serve(a.serve)
    if a.nics:
        return nics(a.rounds, a.rate)
    if a.quick:
        a.rounds, a.blocks = 1, 8192
    from mooncake_core.engine import TransferEngine
    from mooncake_core.transfer.ucx.library import load
    from mooncake_core.utils.log import setup_logging
    setup_logging("ERROR")
    region = max(64 * MB, a.blocks * BLOCK)
    src = np.random.default_rng(1).integers(0, 256, region, dtype=np.uint8)
    dst = np.zeros(region, dtype=np.uint8)
    peers, engines = {}, {}
    for name, (tls, _) in LANES.items():
        env = {**os.environ, "UCX_TLS": tls, "PYTHONPATH": os.pathsep.join(filter(None, [
            REPO, os.environ.get("PYTHONPATH")]))}
        p = subprocess.Popen([sys.executable, __file__, "--serve", str(region)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
        line = p.stdout.readline()
        while line.startswith("["):  # a UCX warning (UCX logs to stdout), e.g. an unused UCX_* variable
            print(line.rstrip(), file=sys.stderr)
            line = p.stdout.readline()
        peers[name] = (p, json.loads(line))
        os.environ["UCX_TLS"] = tls
        e = TransferEngine()
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0, e.last_error
        assert e.register_memory(src.ctypes.data, src.nbytes) == 0
        assert e.register_memory(dst.ctypes.data, dst.nbytes) == 0
        engines[name] = e
    lib = load()
    print(f"UCX from {lib.path} ({lib.source}); {a.rounds} round(s); loopback, one host, no RDMA NIC")

    reps = {4096: 300 if a.quick else 2000, 64 * MB: 3 if a.quick else 7}
    rng = np.random.default_rng(2)
    perm = rng.permutation(region // BLOCK)[:a.blocks].astype(np.int64)
    results: dict[str, list[float]] = {}

    def record(key: str, v: float) -> None:
        results.setdefault(key, []).append(v)

    for _ in range(a.rounds):
        for name, (_, ref) in LANES.items():
            e = engines[name]
            seg, raddr = peers[name][1]["segment"], peers[name][1]["addr"]
            for hint in ("rdma", ref):
                label = f"{'ucx' if hint == 'rdma' else hint}/{name}"
                for size in (4096, 64 * MB):
                    t = _time(lambda: e.transfer_sync_write(seg, src.ctypes.data, raddr, size, hint), reps[size])
                    record(f"{label} write {size}", t)
                    t = _time(lambda: e.transfer_sync_read(seg, dst.ctypes.data, raddr, size, hint), reps[size])
                    record(f"{label} read {size}", t)
                if name == "tcp":  # the scattered batch against our tcp
                    locs = (src.ctypes.data + np.arange(a.blocks, dtype=np.int64) * BLOCK).tolist()
                    rems = (raddr + perm * BLOCK).tolist()
                    lens = [BLOCK] * a.blocks
                    t = _time(lambda: e.batch_transfer_sync_write(seg, locs, rems, lens, hint), 3)
                    record(f"{label} batch-write {a.blocks}", t)
                    t = _time(lambda: e.batch_transfer_sync_read(seg, locs, rems, lens, hint), 3)
                    record(f"{label} batch-read {a.blocks}", t)
        # the last batch read brought back what the batch write put there: the rows moved real bytes
        e = engines["tcp"]
        first = int(perm[0])
        assert e.transfer_sync_read(peers["tcp"][1]["segment"], dst.ctypes.data, peers["tcp"][1]["addr"] + first * BLOCK,
                                    BLOCK, "rdma") == 0
        assert (dst[:BLOCK] == src[:BLOCK]).all(), "UCX moved the wrong bytes"

    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"{'row':34s} {'median':>12s} {'GB/s':>8s}")
    for k, t in med.items():
        parts = k.split()
        size = int(parts[-1]) * (BLOCK if "batch" in parts[1] else 1)
        print(f"{k:34s} {t * 1e6:10.1f}us {size / t / 1e9:8.2f}")

    def ratio(num: str, den: str, lower_better: bool = False) -> float:
        return med[den] / med[num] if not lower_better else med[num] / med[den]

    checks = [
        ("ucx-tcp / tcp  write 64 MiB (throughput)", ratio("ucx/tcp write 67108864", "tcp/tcp write 67108864"), 0.9),
        ("ucx-tcp / tcp  read 64 MiB (throughput)", ratio("ucx/tcp read 67108864", "tcp/tcp read 67108864"), 0.9),
        ("ucx-sm / cma   write 64 MiB (throughput)", ratio("ucx/sm write 67108864", "cma/sm write 67108864"), 0.8),
        ("ucx-sm / cma   read 64 MiB (throughput)", ratio("ucx/sm read 67108864", "cma/sm read 67108864"), 0.8),
        (f"ucx-tcp / tcp  batch write {a.blocks} x 16 KiB", ratio(f"ucx/tcp batch-write {a.blocks}",
                                                                 f"tcp/tcp batch-write {a.blocks}"), None),
        (f"ucx-tcp / tcp  batch read {a.blocks} x 16 KiB", ratio(f"ucx/tcp batch-read {a.blocks}",
                                                                f"tcp/tcp batch-read {a.blocks}"), None),
        ("ucx-tcp / tcp  4 KiB write latency (lower)", ratio("ucx/tcp write 4096", "tcp/tcp write 4096", True), None),
        ("ucx-tcp / tcp  4 KiB read latency (lower)", ratio("ucx/tcp read 4096", "tcp/tcp read 4096", True), None),
        ("ucx-sm / cma   4 KiB write latency (lower)", ratio("ucx/sm write 4096", "cma/sm write 4096", True), None),
    ]
    print("\nRatios (throughput: UCX / reference, higher is better; latency: lower is better):")
    for label, v, target in checks:
        verdict = "" if target is None else (f"(target >= {target})  " + ("OK" if v >= target else "SHORT"))
        print(f"  {label:48s} {v:6.2f}  {verdict}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"median_s": med, "ratios": {c[0]: c[1] for c in checks}}, f, indent=1)
    for e in engines.values():
        e.close()
    for p, _ in peers.values():
        p.stdin.write("\n")
        p.stdin.flush()
        p.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
