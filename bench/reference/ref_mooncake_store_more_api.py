"""Workload for ``bench_store_more_api.py``, written against the *public* Mooncake Store API.

The same file drives both implementations (``--impl ours`` resolves ``mooncake.store`` to this
project through ``mooncake_core.compat``). Roles as in ``ref_mooncake_store.py``: ``holder``
contributes memory and waits for stdin to close; ``run`` (no memory of its own) times the
tensor-into/from, TP, ranged-read and put-session rows against the holder's memory and prints
one JSON object. ``--torch-path`` lets a venv without torch (the reference one) import the
caller's torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
# same directory (run as a script): the shared set-up and the holder role
from ref_mooncake_store import MiB, _setup, holder


def run(args) -> None:
    if args.torch_path:
        sys.path.append(args.torch_path)
    import torch

    # the original stages non-registered puts/gets through its local buffer: it must hold the
    # largest object (64 MiB here)
    s = _setup(args, 0, 256 * MiB)
    results: dict[str, float] = {}
    errors: list[str] = []
    rng = np.random.default_rng(7)
    big = torch.from_numpy(rng.standard_normal(16 * MiB, dtype=np.float32))  # 64 MiB
    small = [torch.from_numpy(rng.standard_normal(MiB // 4, dtype=np.float32)) for _ in range(32)]  # 32 x 1 MiB
    raw = rng.integers(0, 256, 64 * MiB, dtype=np.uint8)
    buf = np.empty(80 * MiB, dtype=np.uint8)
    ptr = int(buf.ctypes.data)
    if s.register_buffer(ptr, buf.nbytes) != 0:
        errors.append("register_buffer failed")
    raw_ptr = int(raw.ctypes.data)
    if s.register_buffer(raw_ptr, raw.nbytes) != 0:
        errors.append("register_buffer(raw) failed")

    def timed(row: str, nbytes: int, fn) -> None:
        times = []
        for rep in range(args.reps):
            t0 = time.perf_counter()
            ok = fn(rep)
            times.append(time.perf_counter() - t0)
            if not ok:
                errors.append(f"{row} rep {rep}: wrong result")
        results[row] = nbytes / statistics.median(times) / 1e9

    def check(cond: bool) -> bool:
        return bool(cond)

    # setup data in the holder's memory (the runner has none: every byte crosses processes)
    assert s.put_tensor("big", big) == 0
    assert s.batch_put_tensor([f"s{i}" for i in range(32)], small) == [0] * 32
    assert s.put("raw", raw.tobytes()) == 0

    timed("get_tensor 64MiB", 64 * MiB, lambda r: check(torch.equal(s.get_tensor("big"), big)))
    timed("get_tensor_into 64MiB", 64 * MiB,
          lambda r: check(torch.equal(s.get_tensor_into("big", ptr, buf.nbytes), big)))
    step = 2 * MiB
    keys = [f"s{i}" for i in range(32)]
    timed("batch_get_tensor 32x1MiB", 32 * MiB,
          lambda r: check(all(torch.equal(a, b) for a, b in zip(s.batch_get_tensor(keys), small))))
    timed("batch_get_tensor_into 32x1MiB", 32 * MiB, lambda r: check(all(
        torch.equal(a, b) for a, b in zip(s.batch_get_tensor_into(keys, [ptr + i * step for i in range(32)],
                                                                  [step] * 32), small))))
    s.get_tensor_into("big", ptr, buf.nbytes)
    n = s.get_size("big")
    timed("put_tensor_from 64MiB", 64 * MiB, lambda r: check(s.put_tensor_from(f"pf{r}", ptr, n) == 0))
    timed("put_tensor 64MiB", 64 * MiB, lambda r: check(s.put_tensor(f"pt{r}", big) == 0))
    timed("pub_tensor_with_tp 64MiB tp4", 64 * MiB,
          lambda r: check(s.pub_tensor_with_tp(f"tp{r}", big.view(4096, 4096), tp_size=4, split_dim=0) == 0))
    timed("get_tensor_with_tp_into x4", 64 * MiB, lambda r: check(all(
        torch.equal(s.get_tensor_with_tp_into("tp0", ptr, buf.nbytes, k, 4), big.view(4096, 4096)[k * 1024:(k + 1) * 1024])
        for k in range(4))))

    # unified parallel IO: written as TP=4 shards along dim 0, read whole and as TP=2 shards
    # (another split: the reader cuts its shards out of the stored ones)
    from mooncake.store import ParallelAxis, ReadTarget, TensorParallelism

    def tp(rank: int, size: int):
        a = ParallelAxis()
        a.kind, a.rank, a.size, a.split_dim = "tp", rank, size, 0
        p = TensorParallelism()
        p.axes = [a]
        return p

    def target(mode: str, par):
        t = ReadTarget()
        t.mode, t.parallelism = mode, par
        return t
    mat = big.view(4096, 4096)
    for k in range(4):
        assert s.put_tensor_with_parallelism("u4", mat[k * 1024:(k + 1) * 1024].contiguous(), tp(k, 4)) == 0
    timed("parallelism full from tp4 64MiB", 64 * MiB,
          lambda r: check(torch.equal(s.get_tensor_with_parallelism("u4", target("full", tp(0, 4))), mat)))
    timed("parallelism tp2 shards from tp4 x2", 64 * MiB, lambda r: check(all(
        torch.equal(s.get_tensor_with_parallelism("u4", target("shard", tp(k, 2))), mat[k * 2048:(k + 1) * 2048])
        for k in range(2))))
    timed("parallelism tp4 shards as stored x4 (ref)", 64 * MiB, lambda r: check(all(
        torch.equal(s.get_tensor_with_parallelism("u4", target("shard", tp(k, 4))), mat[k * 1024:(k + 1) * 1024])
        for k in range(4))))

    # 256 fragments of 16 KiB scattered over a 64 MiB object (4 MiB read)
    frag, count = 16 * 1024, 256
    src = [int(x) * frag for x in rng.choice(64 * MiB // frag, count, replace=False)]
    dst = [i * frag for i in range(count)]
    want = b"".join(raw[o:o + frag].tobytes() for o in src)

    def ranges(r: int) -> bool:
        res = s.get_into_ranges([ptr], [["raw"]], [[dst]], [[src]], [[[frag] * count]])
        return res == [[[frag] * count]] and buf[:count * frag].tobytes() == want
    timed("get_into_ranges 256x16KiB", count * frag, ranges)
    def get_and_slice(r: int) -> bool:
        whole = s.get("raw")
        return b"".join(whole[o:o + frag] for o in src) == want
    timed("get + slice 256x16KiB (ref)", count * frag, get_and_slice)

    def session_get(r: int) -> bool:
        ok = s.batch_get_session_start(["raw"]) == [0]
        res = s.batch_get_into_multi_buffer_ranges(["raw"], [[ptr + d for d in dst]], [[frag] * count], [src])
        s.batch_get_session_end(["raw"])
        return ok and res == [count * frag] and buf[:count * frag].tobytes() == want
    timed("session ranged get 256x16KiB", count * frag, session_get)

    def session_put(r: int) -> bool:
        key = f"sp{r}"
        ok = s.batch_put_session_start([key], [64 * MiB]) == [0]
        piece = 4 * MiB
        res = s.batch_put_from_multi_buffer_ranges([key], [[raw_ptr + o for o in range(0, 64 * MiB, piece)]],
                                                   [[piece] * 16], [list(range(0, 64 * MiB, piece))])
        return ok and res == [64 * MiB] and s.batch_put_session_end([key]) == [0]
    timed("put session 64MiB in 16 ranges", 64 * MiB, session_put)
    if s.get("sp0") != raw.tobytes():
        errors.append("put session object differs")
    timed("put_from 64MiB (ref)", 64 * MiB, lambda r: check(s.put_from(f"pr{r}", raw_ptr, raw.nbytes) == 0))
    print(json.dumps({"results": results, "errors": errors}), flush=True)
    s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("role", choices=["holder", "run"])
    ap.add_argument("--impl", default="ref", choices=["ours", "ref"])
    ap.add_argument("--master", required=True)
    ap.add_argument("--meta", required=True)
    ap.add_argument("--segment", type=int, default=1 << 30)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--torch-path", default="", help="directory to append to sys.path to import torch")
    args = ap.parse_args()
    holder(args) if args.role == "holder" else run(args)


if __name__ == "__main__":
    main()
