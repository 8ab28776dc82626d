"""Transfer Engine benchmark (loopback, one run, references measured in the same run).

    python3 -m bench.transfer.bench_transfer_engine [--quick] [--ref-python /work/venvs/mooncake-ref/bin/python]

Measures single transfers of 4 KiB, 64 KiB, 1 MiB, 64 MiB and a 64 x 1 MiB batch, write and
read, for each transport (tcp, same-host cma, in-process local), against a target engine in a
second process; and, in the same run: numpy memcpy of the same sizes, a raw Python socket
sendall/recv_into stream between two processes (payload + 1-byte ack, like a TE write),
a raw 4 KiB socket ping-pong, and -- when the reference venv exists -- the original Mooncake
TE over tcp (bench/reference/ref_mooncake_te.py). Prints a table with GB/s, ratios against the
targets, and peak RSS against registered bytes. Numbers on a shared 2-core box are noisy:
compare ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

MB = 1 << 20
REGION = 64 * MB
SIZES = [4096, 64 * 1024, MB, 64 * MB]
DEFAULT_REF = "/work/venvs/mooncake-ref/bin/python"


def _rss_kib(pid: str = "self", field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reps(size: int, quick: bool) -> int:
    n = {4096: 1000, 64 * 1024: 400, MB: 100, 64 * MB: 7}.get(size, 7)
    return max(3, n // 4) if quick else n


def _time(fn, n: int) -> float:
    """Median seconds of ``fn()`` over n runs (after one warm-up)."""
    fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


# ----------------------------------------------------------------------------- child roles
def serve_engine() -> int:
    from mooncake_core.engine import TransferEngine
    eng = TransferEngine()
    assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, eng.last_error
    buf = np.random.default_rng(2).integers(0, 256, REGION, dtype=np.uint8)
    assert eng.register_memory(buf.ctypes.data, buf.nbytes) == 0
    print(json.dumps({"segment": eng.get_local_segment_name(), "addr": buf.ctypes.data}), flush=True)
    sys.stdin.readline()
    print(_rss_kib("self", "VmHWM"), flush=True)
    eng.close()
    return 0


def serve_raw(port: int, mode: str) -> int:
    """Raw-socket peer: 'stream' = recv_into N bytes then 1-byte ack; 'pingpong' = echo 4 KiB."""
    ls = socket.create_server(("127.0.0.1", port))
    conn, _ = ls.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(REGION)
    view = memoryview(buf)
    hdr = bytearray(8)
    while True:
        got = conn.recv_into(hdr, 8)
        if got == 0:
            return 0
        while got < 8:
            got += conn.recv_into(memoryview(hdr)[got:], 8 - got)
        n = int.from_bytes(hdr, "little")
        done = 0
        while done < n:
            k = conn.recv_into(view[done:n], n - done)
            if k == 0:
                return 0
            done += k
        if mode == "stream":
            conn.sendall(b"k")
        else:
            conn.sendall(view[:n])


def _raw_client(python: str, mode: str):
    from mooncake_core.utils.net import free_port
    port = free_port()
    proc = subprocess.Popen([python, __file__, "--raw-serve", str(port), mode])
    deadline = time.monotonic() + 10
    while True:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return proc, s


class RawPeer:
    """A raw-socket peer process kept open across rounds ('stream' or 'pingpong')."""

    def __init__(self, mode: str):
        self.proc, self.sock = _raw_client(sys.executable, mode)
        self.ack = bytearray(1)

    def stream_once(self, view: memoryview, size: int) -> None:
        self.sock.sendall(size.to_bytes(8, "little"))
        self.sock.sendall(view[:size])
        self.sock.recv_into(self.ack, 1)

    def pingpong_once(self, out_v: memoryview, in_v: memoryview) -> None:
        self.sock.sendall((4096).to_bytes(8, "little"))
        self.sock.sendall(out_v)
        got = 0
        while got < 4096:
            got += self.sock.recv_into(in_v[got:], 4096 - got)

    def close(self) -> None:
        self.sock.close()
        self.proc.wait(10)


# ----------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    ap.add_argument("--ref-python", default=DEFAULT_REF,
                    help="python of the venv holding the original Mooncake (mooncake-transfer-engine-non-cuda); "
                         "the comparison is skipped with a note when it does not exist")
    ap.add_argument("--transports", default="tcp,shm,local",
                    help="comma list of transports to measure: tcp, shm (same-host cma), local (in-process)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="measurement rounds; references and transports are interleaved in each round and "
                         "the median over rounds is reported (default 3; --quick uses 1)")
    ap.add_argument("--json", metavar="FILE", help="also write all results as JSON to FILE")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--raw-serve", nargs=2, metavar=("PORT", "MODE"), help=argparse.SUPPRESS)
    return ap


def main() -> int:
    ap = build_parser()
    a = ap.parse_args()
    if a.serve:
        return serve_engine()
    if a.raw_serve:
        return serve_raw(int(a.raw_serve[0]), a.raw_serve[1])
    if a.quick:
        a.rounds = 1

    os.environ.setdefault("MC_LOG_LEVEL", "WARNING")
    from mooncake_core.engine import TransferEngine
    from mooncake_core.utils.log import setup_logging
    setup_logging("WARNING")
    base_rss = _rss_kib()

    results: dict[str, object] = {}
    rng = np.random.default_rng(1)
    src = rng.integers(0, 256, REGION, dtype=np.uint8)
    dst = np.zeros(REGION, dtype=np.uint8)
    registered = src.nbytes + dst.nbytes

    have_ref = os.path.exists(a.ref_python)
    if not have_ref:
        print(f"note: {a.ref_python} not found; skipping the original-Mooncake comparison "
              "(see docs/transfer-engine.md to create the reference venv)", file=sys.stderr)
    ref_runs: list[dict] = []

    def run_ref() -> None:
        """One run of the original Mooncake (its own two processes), part of every round."""
        env = dict(os.environ, MC_TCP_BIND_ADDRESS="127.0.0.1", GLOG_minloglevel="2")
        cmd = [a.ref_python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref_mooncake_te.py"),
               "--quick"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
            ref_runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
        except Exception as e:  # the reference is optional; say why it is missing
            print(f"note: original Mooncake reference run failed: {e}", file=sys.stderr)


    # our engine ---------------------------------------------------------------------------
    peer = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    info = json.loads(peer.stdout.readline())
    eng = TransferEngine()
    assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert eng.register_memory(src.ctypes.data, src.nbytes) == 0
    assert eng.register_memory(dst.ctypes.data, dst.nbytes) == 0
    targets = {"tcp": (info["segment"], info["addr"], "tcp"), "shm": (info["segment"], info["addr"], "shm")}
    local_eng = None
    if "local" in a.transports:
        local_eng = TransferEngine()
        assert local_eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        lbuf = np.random.default_rng(3).integers(0, 256, REGION, dtype=np.uint8)
        registered += lbuf.nbytes
        assert local_eng.register_memory(lbuf.ctypes.data, lbuf.nbytes) == 0
        targets["local"] = (local_eng.get_local_segment_name(), lbuf.ctypes.data, "local")

    # Rounds interleave every reference with our measurements, so load from other processes
    # on a shared box hits both sides of each ratio alike; the median over rounds is reported.
    stream, pong = RawPeer("stream"), RawPeer("pingpong")
    sview = memoryview(src).cast("B")
    out_v, in_v = sview[:4096], memoryview(dst).cast("B")[:4096]
    samples: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        samples.setdefault(key, []).append(value)

    tnames = [t for t in a.transports.split(",") if t in targets]
    for rnd in range(a.rounds):
        for size in SIZES:
            n = max(2, _reps(size, a.quick) // a.rounds)
            add(f"memcpy:{size}", _time(lambda size=size: np.copyto(dst[:size], src[:size]), n))
            add(f"raw:{size}", _time(lambda size=size: stream.stream_once(sview, size), n))
        add("pingpong", _time(lambda: pong.pingpong_once(out_v, in_v), max(2, _reps(4096, a.quick) // a.rounds)))
        for tname in tnames:
            seg, raddr, hint = targets[tname]
            for op in ("write", "read"):
                fn = eng.transfer_sync_write if op == "write" else eng.transfer_sync_read
                bfn = eng.batch_transfer_sync_write if op == "write" else eng.batch_transfer_sync_read
                buf = src if op == "write" else dst
                baddr = buf.ctypes.data  # resolved once, as the raw-socket reference holds its views
                for size in SIZES:
                    def once(size=size):
                        assert fn(seg, baddr, raddr, size, hint) == 0, eng.last_error
                    add(f"{tname}:{op}:{size}", _time(once, max(2, _reps(size, a.quick) // a.rounds)))
                locs = [buf.ctypes.data + i * MB for i in range(64)]
                rems = [raddr + i * MB for i in range(64)]

                def batch():
                    assert bfn(seg, locs, rems, [MB] * 64, hint) == 0, eng.last_error
                add(f"{tname}:{op}:batch64x1M", _time(batch, max(2, _reps(64 * MB, a.quick) // a.rounds)))
        if have_ref:
            run_ref()
        print(f"round {rnd + 1}/{a.rounds} done", file=sys.stderr)
    stream.close()
    pong.close()
    med = {k: statistics.median(v) for k, v in samples.items()}
    ref = None
    if ref_runs:
        ref = {k: {"median_s": statistics.median(r[k]["median_s"] for r in ref_runs if k in r)}
               for k in ref_runs[0]}
    results["original_tcp_s"] = ref
    memcpy = {size: med[f"memcpy:{size}"] for size in SIZES}
    raw = {size: med[f"raw:{size}"] for size in SIZES}
    pp = med["pingpong"]
    results["memcpy_s"], results["raw_stream_s"], results["raw_pingpong_4k_s"] = memcpy, raw, pp
    ours: dict[str, dict[str, float]] = {}
    for k, v in med.items():
        parts = k.split(":")
        if len(parts) == 3:
            ours.setdefault(parts[0], {})[f"{parts[1]}:{parts[2]}"] = v
    for tname in tnames:  # correctness spot check on every transport
        seg, raddr, hint = targets[tname]
        assert eng.transfer_sync_write(seg, src.ctypes.data, raddr, MB, hint) == 0
        assert eng.transfer_sync_read(seg, dst.ctypes.data, raddr, MB, hint) == 0
        assert np.array_equal(src[:MB], dst[:MB]), f"{tname}: data mismatch"
    results["ours_s"] = ours
    peak = _rss_kib("self", "VmHWM")
    peer.stdin.write("x\n")
    peer.stdin.flush()
    peer_hwm = int(peer.stdout.readline() or 0)
    peer.wait(10)
    eng.close()
    if local_eng:
        local_eng.close()

    # report -------------------------------------------------------------------------------
    def gbps(nbytes: int, s: float | None) -> str:
        return f"{nbytes / s / 1e9:7.2f}" if s else "     - "

    print(f"\nTransfer Engine benchmark (loopback, medians; GB/s = 1e9 B/s){' [quick]' if a.quick else ''}")
    print(f"{'transport':<9} {'op':<6} {'size':>10} {'lat us':>9} {'GB/s':>7} | {'memcpy':>7} {'raw sock':>8} "
          f"{'original':>8}")
    for tname, rows in ours.items():
        for key, s in rows.items():
            op, size_s = key.split(":")
            nbytes = 64 * MB if size_s == "batch64x1M" else int(size_s)
            label = "64x1MiB" if size_s == "batch64x1M" else (f"{nbytes // 1024} KiB" if nbytes < MB
                                                               else f"{nbytes // MB} MiB")
            ref_s = (ref or {}).get(key, {}).get("median_s") if tname == "tcp" else None
            m = memcpy.get(nbytes if size_s != "batch64x1M" else 64 * MB)
            r = raw.get(nbytes if size_s != "batch64x1M" else 64 * MB)
            print(f"{tname:<9} {op:<6} {label:>10} {s * 1e6:9.1f} {gbps(nbytes, s)} | {gbps(nbytes, m)} "
                  f"{gbps(nbytes, r):>8} {gbps(nbytes, ref_s):>8}")

    print("\nRatios against targets (higher is better unless noted):")
    checks = []

    def ratio(name: str, value: float | None, target: float, higher: bool = True) -> None:
        if value is None:
            print(f"  {name:<52} n/a")
            return
        ok = value >= target if higher else value <= target
        checks.append(ok)
        print(f"  {name:<52} {value:6.2f}  (target {'>=' if higher else '<='} {target})  {'OK' if ok else 'MISS'}")

    tcp = ours.get("tcp", {})
    for key in ("write:67108864", "read:67108864", "write:batch64x1M", "read:batch64x1M"):
        if key in tcp:
            ratio(f"tcp/raw-socket {key}", raw[64 * MB] / tcp[key], 0.8)
            if ref and key in ref:
                ratio(f"tcp/original {key}", ref[key]["median_s"] / tcp[key], 1.2)
    shm = ours.get("shm", {})
    for key in ("write:67108864", "read:67108864", "write:batch64x1M"):
        if key in shm:
            ratio(f"same-host/memcpy {key}", memcpy[64 * MB] / shm[key], 0.6)
    if "write:4096" in tcp:
        ratio("tcp 4 KiB write latency / raw 4 KiB ping-pong (lower)", tcp["write:4096"] / pp, 2.0, higher=False)
        ratio("tcp 4 KiB read latency / raw 4 KiB ping-pong (lower)", tcp["read:4096"] / pp, 2.0, higher=False)
    print(f"  raw 4 KiB ping-pong round trip: {pp * 1e6:.1f} us")
    grown = (peak - base_rss) * 1024
    print(f"\nMemory: initiator peak RSS grew {grown / MB:.0f} MiB over its start ({base_rss // 1024} MiB) while "
          f"{registered / MB:.0f} MiB are registered (ratio {grown / registered:.2f}); target process peak RSS "
          f"{peer_hwm // 1024} MiB for a {REGION // MB} MiB region")
    results["peak_rss_growth_bytes"], results["registered_bytes"] = grown, registered
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    print(f"\n{sum(checks)}/{len(checks)} ratio targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
