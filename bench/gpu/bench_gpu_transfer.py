#!/usr/bin/env python3
"""GPU memory through our Transfer Engine against the same bytes moved without it (needs a CUDA GPU).

    python3 -m bench.gpu.bench_gpu_transfer [--reps 5] [--json out.json]

Rows (two processes on one host; medians of --reps timed runs after one warm-up):
  ipc-1GiB       our engine, cuda_ipc, 64 x 16 MiB GPU->GPU writes into a peer process
                 vs torch ``dst.copy_(src)`` of the same 1 GiB on the same GPU (cudaMemcpy
                 device to device; target: ours >= 0.8x)
  ipc-4GiB       the same with 64 x 64 MiB (the engine's fixed cost spread over more bytes)
  ipc-blocks     the vLLM layout, 32,768 x 16 KiB blocks (512 MiB) to shuffled slots, vs the
                 same reference copy of 512 MiB contiguous (what a block list costs), and vs torch
                 moving the same blocks to the same slots in one process (an index copy)
  ucx-1GiB       the UCX transport (``protocol="rdma"``, its cuda lanes: cuda_ipc on one host)
                 moving the ipc-1GiB row's bytes GPU->GPU into a peer process, vs our cuda
                 plugin's time for the same (the ipc-1GiB row; target: UCX >= 0.9x). Skipped,
                 saying why, when the UCX loaded has no cuda lane (carry libucx-cu13 in .whl/)
  tcp-device     256 MiB as 16 x 16 MiB over our tcp (transport_hint tcp), GPU memory on both
                 ends (pinned staging, double-buffered, on both sides) vs the same with host
                 memory on both ends (target: >= 0.8x)
Ratio = reference time / our time (> 1: ours faster).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

import numpy as np

from bench.transfer.bench_transfer_engine import _time as timed
from mooncake_lab.line_peer import spawn_line_peer
from mooncake_core.engine import TransferEngine

MB = 1 << 20


def peer(regions: int, size: int, host: bool = False, env: dict | None = None,
         protocol: str = "tcp") -> tuple[object, dict]:
    argv = [sys.executable, str(REPO / "tests" / "gpu" / "gpu_peer.py"), "--regions", str(regions), "--size",
            str(size), "--zero", "--protocol", protocol] + (["--host"] if host else [])
    return spawn_line_peer(argv, "gpu peer", env=env or dict(os.environ))


def ucx_row(src, nbytes: int, bs: int, reps: int, t_cuda: float, row) -> None:
    """The ucx-1GiB row: a second engine on ``protocol="rdma"`` writes ``src``'s first
    ``nbytes`` GPU->GPU into a UCX peer process, in ``bs`` pieces (as the ipc rows), with
    ``transport_hint="rdma"``; reference: our cuda plugin's time ``t_cuda`` for the same."""
    e = TransferEngine()
    if e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") != 0:
        print(f"ucx-1GiB skipped: initialize: {e.last_error}", flush=True)
        return
    try:
        if e.register_memory(src.data_ptr(), nbytes, "cuda:0") != 0:
            print(f"ucx-1GiB skipped: register_memory: {e.last_error}", flush=True)
            return
        p, info = peer(1, nbytes, protocol="rdma")
        try:
            seg, base = info["segment"], info["addrs"][0]
            offs = list(range(0, nbytes, bs))

            def run() -> None:
                if e.batch_transfer_sync_write(seg, [src.data_ptr() + o for o in offs], [base + o for o in offs],
                                               [bs] * len(offs), "rdma") != 0:
                    raise RuntimeError(e.last_error)

            try:
                run()
            except RuntimeError as err:  # e.g. this UCX has no cuda lane
                print(f"ucx-1GiB skipped: {err}", flush=True)
                return
            row("ucx-1GiB", nbytes, timed(run, reps), t_cuda, "our cuda plugin (cuda_ipc)", "ucx")
        finally:
            p.kill()  # type: ignore[attr-defined]
            p.wait()  # type: ignore[attr-defined]
    finally:
        e.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="timed runs per row (median reported)")
    ap.add_argument("--json", help="write the rows here as JSON")
    ap.add_argument("--staging", type=int, nargs="+", default=[32],
                    help="MC_DEVICE_STAGING_BYTES values (MiB) to run the tcp-device row with (both ends)")
    ap.add_argument("--profile", action="store_true", help="print where the ipc-1GiB row's time goes (cProfile)")
    a = ap.parse_args()
    import torch

    rows: list[dict] = []
    eng = TransferEngine()
    assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, eng.last_error

    def reg(t, loc="cuda:0"):
        assert eng.register_memory(t.data_ptr(), t.numel() * t.element_size(), loc) == 0, eng.last_error

    def row(name: str, nbytes: int, ours: float, ref: float, ref_name: str, transport: str) -> None:
        r = {"row": name, "bytes": nbytes, "ours_s": ours, "ref_s": ref, "ours_GBps": nbytes / ours / 1e9,
             "ref_GBps": nbytes / ref / 1e9, "ratio": ref / ours, "reference": ref_name, "transport": transport}
        rows.append(r)
        print(f"{name:30s} {nbytes / MB:7.0f} MiB  ours {r['ours_GBps']:8.1f} GB/s ({transport})  "
              f"ref {r['ref_GBps']:8.1f} GB/s ({ref_name})  ratio {r['ratio']:.2f}x", flush=True)

    # --- same host, GPU -> GPU through CUDA IPC
    n, big = 1 << 30, 4 << 30
    src = torch.randint(0, 256, (big,), dtype=torch.uint8, device="cuda")
    ref_dst = torch.empty_like(src)
    reg(src)
    p, info = peer(1, big)
    seg, base = info["segment"], info["addrs"][0]
    bs = 16 * MB
    offs = list(range(0, n, bs))

    def ours_ipc():
        assert eng.batch_transfer_sync_write(seg, [src.data_ptr() + o for o in offs], [base + o for o in offs],
                                             [bs] * len(offs)) == 0, eng.last_error

    def ref_copy(nbytes: int):
        def f():
            ref_dst[:nbytes].copy_(src[:nbytes])
            torch.cuda.synchronize()
        return f

    t_ipc = timed(ours_ipc, a.reps)
    row("ipc-1GiB", n, t_ipc, timed(ref_copy(n), a.reps), "torch copy_ d2d", eng.transport_for(seg))
    offs4 = list(range(0, big, 64 * MB))

    def ours_ipc4():
        assert eng.batch_transfer_sync_write(seg, [src.data_ptr() + o for o in offs4], [base + o for o in offs4],
                                             [64 * MB] * len(offs4)) == 0, eng.last_error

    row("ipc-4GiB", big, timed(ours_ipc4, a.reps), timed(ref_copy(big), a.reps), "torch copy_ d2d",
        eng.transport_for(seg))
    if a.profile:
        import cProfile
        import pstats
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20):
            ours_ipc()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(14)
    nb, bb = 32768, 16 << 10
    perm = np.random.default_rng(0).permutation(nb)
    locs = [src.data_ptr() + i * bb for i in range(nb)]
    rems = [base + int(perm[i]) * bb for i in range(nb)]

    def ours_blocks():
        assert eng.batch_transfer_sync_write(seg, locs, rems, [bb] * nb) == 0, eng.last_error

    t_blocks = timed(ours_blocks, a.reps)
    row("ipc-blocks", nb * bb, t_blocks, timed(ref_copy(nb * bb), a.reps), "torch copy_ d2d contiguous",
        eng.transport_for(seg))
    perm_t = torch.from_numpy(perm).cuda()

    def ref_index():
        ref_dst[:nb * bb].view(nb, bb)[perm_t] = src[:nb * bb].view(nb, bb)
        torch.cuda.synchronize()

    row("ipc-blocks", nb * bb, t_blocks, timed(ref_index, a.reps), "torch index copy, same blocks", eng.transport_for(seg))
    p.kill()  # type: ignore[attr-defined]
    p.wait()  # type: ignore[attr-defined]
    ucx_row(src, n, bs, a.reps, t_ipc, row)

    # --- over tcp: GPU memory on both ends vs host memory on both ends
    m = 256 * MB
    hsrc = torch.from_numpy(np.random.default_rng(1).integers(0, 256, m, dtype=np.uint8))
    reg(hsrc, "cpu:0")
    times = {}
    for kind in ["host"] + [f"device@{mib}" for mib in a.staging]:
        env = dict(os.environ)
        if kind != "host":
            os.environ["MC_DEVICE_STAGING_BYTES"] = env["MC_DEVICE_STAGING_BYTES"] = str(int(kind[7:]) * MB)
        pp, inf = peer(1, m, host=(kind == "host"), env=env)
        buf = hsrc if kind == "host" else src
        o2 = list(range(0, m, bs))

        def run(buf=buf, inf=inf, o2=o2):
            assert eng.batch_transfer_sync_write(inf["segment"], [buf.data_ptr() + o for o in o2],
                                                 [inf["addrs"][0] + o for o in o2], [bs] * len(o2), "tcp") == 0, \
                eng.last_error

        times[kind] = timed(run, a.reps)
        pp.kill()  # type: ignore[attr-defined]
        pp.wait()  # type: ignore[attr-defined]
        if kind != "host":
            row(f"tcp-device staging {kind[7:]} MiB", m, times[kind], times["host"], "our tcp, host memory", "tcp")
    eng.close()
    gpu = torch.cuda.get_device_name(0)
    print(f"GPU: {gpu}; torch {torch.__version__}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
