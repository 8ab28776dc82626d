#!/usr/bin/env python3
"""What one device copy between raw addresses costs through each library the cuda plugin could
use (needs a CUDA GPU): why it uses cuda-python (``cuda.bindings``) rather than torch.

    python3 -m bench.gpu.bench_gpu_copy_call [--copies 4096] [--block 16384]

Rows, each moving --copies blocks of --block bytes GPU->GPU to shuffled slots, one call per block
(median of 5 after a warm-up): ``cuda.bindings`` cudaMemcpyAsync on a raw int address; torch,
wrapping each raw address as a tensor (``__cuda_array_interface__``) then ``copy_`` -- the only
way torch copies between raw addresses; and, as the floor, our copy kernel (one launch).
"""

from __future__ import annotations

import argparse
import statistics
import time


import numpy as np


class _Raw:
    """A raw device address as a CUDA array (so torch.as_tensor wraps it without a copy)."""

    def __init__(self, ptr: int, n: int) -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=4096, help="blocks per run")
    ap.add_argument("--block", type=int, default=16 << 10, help="bytes per block")
    a = ap.parse_args()
    import torch

    from mooncake_core.transfer.cuda.runtime import CudaCopier
    c = CudaCopier()
    n, bs = a.copies, a.block
    src = torch.randint(0, 256, (n * bs,), dtype=torch.uint8, device="cuda")
    dst = torch.zeros_like(src)
    perm = np.random.default_rng(0).permutation(n)
    d = [dst.data_ptr() + int(perm[i]) * bs for i in range(n)]
    s = [src.data_ptr() + i * bs for i in range(n)]
    stream = c.new_stream(0)
    tstream = torch.cuda.Stream()

    def cuda_bindings() -> None:
        for x, y in zip(d, s):
            c.copy_async(x, y, bs, stream)
        c.synchronize(stream)

    def torch_wrap() -> None:
        with torch.cuda.stream(tstream):
            for x, y in zip(d, s):
                torch.as_tensor(_Raw(x, bs), device="cuda").copy_(torch.as_tensor(_Raw(y, bs), device="cuda"),
                                                                 non_blocking=True)
        tstream.synchronize()

    def kernel() -> None:
        c.copy_batch_async(d, s, [bs] * n, stream, device_only=True)
        c.synchronize(stream)

    for name, fn in (("cuda.bindings cudaMemcpyAsync", cuda_bindings), ("torch as_tensor + copy_", torch_wrap),
                     ("copy kernel, one launch", kernel)):
        dst.zero_()
        fn()
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        ok = torch.equal(dst.view(n, bs)[torch.from_numpy(perm).cuda()], src.view(n, bs))
        t = statistics.median(ts)
        print(f"{name:32s} {t * 1e3:8.2f} ms  {t / n * 1e6:6.2f} us/copy  {n * bs / t / 1e9:7.1f} GB/s  "
              f"byte-exact={ok}", flush=True)


if __name__ == "__main__":
    main()
