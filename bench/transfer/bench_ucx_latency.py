"""4 KiB latency of the UCX transport over UCX's tcp lane, this tree against a baseline tree,
each against our tcp transport measured in the same process, rounds interleaved.

    python3 -m bench.transfer.bench_ucx_latency --baseline-tree DIR [--rounds 5] [--ops 1000]

``DIR`` holds another ``mooncake_core`` (``git archive <commit> mooncake_core | tar -x -C DIR``).
Each round runs, for each tree, a child process that imports that tree, starts a target
engine (same tree, ``protocol="rdma"``, ``UCX_TLS=tcp``) and times ``--ops`` 4 KiB writes and
reads over UCX and over our tcp (``transport_hint``), interleaved. The figure that compares the
trees on a loaded host is each tree's UCX/tcp ratio (lower is better): the tcp reference absorbs
the load of the moment. Medians over rounds are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REGION = 1 << 20


def _use_tree(tree: str) -> None:
    """Import ``mooncake_core`` from ``tree`` (``python -m`` puts the working directory first)."""
    sys.path.insert(0, tree)


def _target(size: int, tree: str) -> int:
    _use_tree(tree)
    from bench.transfer.bench_ucx import serve  # imports mooncake_core inside: from ``tree``
    return serve(size)


def _child(tree: str, ops: int) -> int:
    _use_tree(tree)
    import numpy as np

    from mooncake_core.engine import TransferEngine
    from mooncake_core.utils.log import setup_logging
    setup_logging("ERROR")
    env = {**os.environ, "UCX_TLS": "tcp"}
    p = subprocess.Popen([sys.executable, "-m", "bench.transfer.bench_ucx_latency", "--target", str(REGION),
                          "--child", tree],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        info = json.loads(p.stdout.readline()) if p.stdout else {}
        os.environ["UCX_TLS"] = "tcp"
        e = TransferEngine()
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0, e.last_error
        src = np.ones(REGION, dtype=np.uint8)
        assert e.register_memory(src.ctypes.data, src.nbytes) == 0
        seg, raddr = info["segment"], info["addr"]

        def lat(hint: str, write: bool, n: int) -> float:
            f = e.transfer_sync_write if write else e.transfer_sync_read
            t = time.perf_counter()
            for _ in range(n):
                if f(seg, src.ctypes.data, raddr, 4096, hint) != 0:
                    raise RuntimeError(e.last_error)
            return (time.perf_counter() - t) / n

        for hint in ("rdma", "tcp"):  # connect and warm up
            lat(hint, True, 50)
        times: dict[str, list[float]] = {}
        for _ in range(3):  # interleaved thirds: a burst of load hits UCX and tcp alike
            for h in ("rdma", "tcp"):
                for w in (True, False):
                    times.setdefault(f"{'ucx' if h == 'rdma' else 'tcp'} {'write' if w else 'read'}", []).append(
                        lat(h, w, max(1, ops // 3)))
        out: dict[str, float | str] = {k: statistics.median(v) for k, v in times.items()}
        out["engine_file"] = sys.modules["mooncake_core.engine"].__file__ or ""
        print(json.dumps(out), flush=True)
        e.close()
    finally:
        if p.stdin:
            p.stdin.write("\n")
            p.stdin.flush()
        p.wait(timeout=30)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline-tree", required=False, default="",
                    help="directory holding the baseline mooncake_core (e.g. from git archive)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--ops", type=int, default=1000, help="4 KiB operations per measurement (default 1000)")
    ap.add_argument("--target", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.target:
        return _target(a.target, a.child)
    if a.child:
        return _child(a.child, a.ops)
    trees = [("current", REPO)] + ([("baseline", os.path.abspath(a.baseline_tree))] if a.baseline_tree else [])
    res: dict[str, list[dict]] = {n: [] for n, _ in trees}
    for _ in range(a.rounds):
        for name, tree in trees:
            env = dict(os.environ)
            r = subprocess.run([sys.executable, "-m", "bench.transfer.bench_ucx_latency", "--child", tree,
                                "--ops", str(a.ops)], capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
            if r.returncode != 0:
                raise SystemExit(f"{name} failed:\n{r.stderr[-3000:]}")
            res[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
    print(f"4 KiB latency over UCX's tcp lane vs our tcp, {a.rounds} interleaved rounds x {a.ops} ops, "
          f"load {os.getloadavg()[0]:.1f}")
    for name, rs in res.items():
        print(f"  {name:9s} ({os.path.dirname(os.path.dirname(rs[0]['engine_file']))})")
        for op in ("write", "read"):
            ucx = statistics.median(r[f"ucx {op}"] for r in rs)
            tcp = statistics.median(r[f"tcp {op}"] for r in rs)
            ratios = [r[f"ucx {op}"] / r[f"tcp {op}"] for r in rs]
            print(f"    {op:5s} ucx {ucx * 1e6:7.1f} us  tcp {tcp * 1e6:6.1f} us  ucx/tcp median "
                  f"{statistics.median(ratios):5.2f}x (range {min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
