"""Each CUDA call the cuda plugin makes, once, printed (the first thing a GPU run does: an API
mismatch in cuda-python shows here by name rather than as a failing transfer)."""

from __future__ import annotations

import ctypes
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def step(name, fn):
    try:
        out = fn()
        print(f"ok   {name}: {out!r}"[:300], flush=True)
        return out
    except Exception:  # noqa: BLE001 - report and go on
        print(f"FAIL {name}:\n{traceback.format_exc()}", flush=True)
        return None


def main() -> None:
    import importlib.metadata as md
    for dist in ("cuda-bindings", "cuda-python", "torch", "numpy"):
        step(f"version {dist}", lambda d=dist: md.version(d))
    from mooncake_core.transfer.cuda.runtime import CudaCopier, available
    step("available", available)
    c = step("CudaCopier()", CudaCopier)
    if c is None:
        return
    rt = c.rt
    step("set_device(0)", lambda: c.set_device(0))
    ptr = step("cudaMalloc", lambda: int(c._check(rt.cudaMalloc(1 << 20), "cudaMalloc")))
    pinned = step("alloc_pinned", lambda: c.alloc_pinned(1 << 20))
    host = ctypes.create_string_buffer(b"x" * (1 << 20))
    step("copy h2d", lambda: c.copy(ptr, ctypes.addressof(host), 1 << 20))
    s = step("new_stream", lambda: c.new_stream(0))
    step("copy_async d2h", lambda: c.copy_async(pinned, ptr, 1 << 20, s))
    step("synchronize", lambda: c.synchronize(s))
    step("pinned bytes back", lambda: ctypes.string_at(pinned, 8))
    step("device_of(dev)", lambda: c.device_of(ptr))
    step("device_of(host)", lambda: c.device_of(ctypes.addressof(host)))
    step("device_of(pinned)", lambda: c.device_of(pinned))
    step("allocation_of(ptr+4096)", lambda: (c.allocation_of(ptr + 4096), ptr))
    step("ipc_export", lambda: c.ipc_export(ptr).hex()[:32])
    step("free_pinned", lambda: c.free_pinned(pinned))
    import torch
    t = torch.zeros(3 << 20, dtype=torch.uint8, device="cuda")
    step("torch tensor allocation_of", lambda: (c.allocation_of(t.data_ptr() + 10), t.data_ptr()))
    step("torch tensor ipc_export", lambda: c.ipc_export(c.allocation_of(t.data_ptr())[0]).hex()[:16])
    step("cudaMemcpyBatchAsync doc", lambda: (rt.cudaMemcpyBatchAsync.__doc__ or "")[:400])
    import time

    import numpy as np
    nb, bs = 32768, 16 << 10
    src = torch.randint(0, 256, (nb * bs,), dtype=torch.uint8, device="cuda")
    perm = np.random.default_rng(0).permutation(nb)
    for how in ("kernel", "batch", "loop"):
        dst = torch.zeros_like(src)
        d = [dst.data_ptr() + int(perm[i]) * bs for i in range(nb)]
        sr = [src.data_ptr() + i * bs for i in range(nb)]
        st = c.new_stream(0)

        def go(how=how, d=d, sr=sr, st=st):
            t0 = time.perf_counter()
            if how in ("batch", "kernel"):
                c.copy_batch_async(d, sr, [bs] * nb, st, device_only=(how == "kernel"))
            else:
                for a, b in zip(d, sr):
                    c.copy_async(a, b, bs, st)
            c.synchronize(st)
            return (f"{time.perf_counter() - t0:.4f} s, batch={c._batch} {c.batch_error[:200]} "
                    f"kernel={c._kernel} {c.kernel_error[:600]}")
        step(f"32768 x 16 KiB {how}", go)
        step(f"32768 x 16 KiB {how} again", go)
        inv = torch.from_numpy(np.argsort(perm)).cuda()
        step(f"{how} byte-exact", lambda dst=dst, inv=inv: bool(torch.equal(dst.view(nb, bs), src.view(nb, bs)[inv])))


if __name__ == "__main__":
    main()
