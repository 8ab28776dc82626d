"""Per-call cost of the UCP binding: ctypes vs cffi (ABI mode) vs cffi (API mode, compiled).

    python3 -m bench.transfer.bench_ucx_binding [--reps 20000]

One process, ``UCX_TLS=self`` (an endpoint to its own worker: a put is a memcpy, no wire), so
what is measured is the binding's cost plus UCX's own software path -- the part a binding
choice can change. Two shapes, as the transport uses them:

* a 4 KiB put + ``ucp_ep_flush_nbx`` + progress until the flush completes (the latency path);
* a 32,768-block batch: one put per 16 KiB block, then one flush (the KV hand-off shape), and
  the same with 8-byte blocks (the calls alone, no copy).

cffi API mode needs a C compiler and UCX's headers (the libucx wheel ships them); it is built
into a temporary directory here. Rows "+ C loop" post the whole batch from one C function:
"ctypes + C loop" is what the transport does (``Ucp.post_many``), "cffi API + C loop" the ceiling. The figures and the choice are in
``mooncake_core/transfer/ucx/binding.py``'s docstring and BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from mooncake_core.transfer.ucx.binding import Ucp, batch_helper
from mooncake_core.transfer.ucx.library import load

BLOCKS = 32768
CDEF = """
typedef struct { uint32_t op_attr_mask; uint32_t flags; char rest[256]; } rp_t;
void *ucp_put_nbx(void *ep, const void *buffer, size_t count, uint64_t remote_addr, void *rkey, const rp_t *param);
void *ucp_ep_flush_nbx(void *ep, const rp_t *param);
unsigned ucp_worker_progress(void *worker);
int ucp_request_check_status(void *request);
void ucp_request_free(void *request);
"""
API_SRC = """
#include <ucp/api/ucp.h>
typedef struct { uint32_t op_attr_mask; uint32_t flags; char rest[256]; } rp_t;
static void *b_put(void *ep, const void *buf, size_t n, uint64_t r, void *rk, const rp_t *p) {
    return ucp_put_nbx((ucp_ep_h)ep, buf, n, r, (ucp_rkey_h)rk, (const ucp_request_param_t *)p);
}
static void *b_flush(void *ep, const rp_t *p) { return ucp_ep_flush_nbx((ucp_ep_h)ep, (const ucp_request_param_t *)p); }
static unsigned b_progress(void *w) { return ucp_worker_progress((ucp_worker_h)w); }
static int b_check(void *r) { return (int)ucp_request_check_status(r); }
static void b_free(void *r) { ucp_request_free(r); }
static int post_batch(void *ep, uint64_t local, uint64_t remote, size_t n, size_t count, void *rkey) {
    ucp_request_param_t p; p.op_attr_mask = 0;
    for (size_t i = 0; i < n; i++) {
        ucs_status_ptr_t r = ucp_put_nbx((ucp_ep_h)ep, (void *)(local + i * count), count, remote + i * count,
                                         (ucp_rkey_h)rkey, &p);
        if (UCS_PTR_IS_ERR(r)) return (int)UCS_PTR_STATUS(r);
        if (r != NULL) ucp_request_free(r);
    }
    return 0;
}
"""
API_CDEF = """
typedef struct { uint32_t op_attr_mask; uint32_t flags; char rest[256]; } rp_t;
void *b_put(void *ep, const void *buf, size_t n, uint64_t r, void *rk, const rp_t *p);
void *b_flush(void *ep, const rp_t *p);
unsigned b_progress(void *w);
int b_check(void *r);
void b_free(void *r);
int post_batch(void *ep, uint64_t local, uint64_t remote, size_t n, size_t count, void *rkey);
"""


class Setup:
    def __init__(self) -> None:
        os.environ["UCX_TLS"] = "self"
        self.loaded = load()
        self.u = Ucp(self.loaded.lib)
        u = self.u
        self.ctx = u.init({})
        self.w = u.worker_create(self.ctx)
        self.ep = u.ep_create(self.w, u.worker_address(self.w), False)
        self.src = ctypes.create_string_buffer(BLOCKS * 16384)
        self.dst = ctypes.create_string_buffer(BLOCKS * 16384)
        self.sa, self.da = ctypes.addressof(self.src), ctypes.addressof(self.dst)
        memh = u.mem_map(self.ctx, self.da, len(self.dst))
        self.rkey = u.rkey_unpack(self.ep, u.rkey_pack(self.ctx, memh))


def ctypes_ops(s: Setup):
    u, ep, w, rk = s.u, s.ep, s.w, s.rkey

    def flush() -> None:
        r = u.ep_flush(ep)
        while r is not None and u.request_status(r) == 1:
            u.progress(w)
        if r is not None:
            u.request_free(r)

    def one() -> None:
        u.post(True, ep, s.sa, 4096, s.da, rk)
        flush()

    def batch(bs: int) -> None:
        post, sa, da = u.post, s.sa, s.da
        for i in range(BLOCKS):
            post(True, ep, sa + i * bs, bs, da + i * bs, rk)
        flush()

    arrays: dict[int, tuple[np.ndarray, ...]] = {}

    def batch_c(bs: int) -> None:  # what the transport does: arrays in, one C loop (binding.post_many)
        if bs not in arrays:
            i = np.arange(BLOCKS, dtype=np.int64) * bs
            arrays[bs] = (s.sa + i, s.da + i, np.full(BLOCKS, bs, dtype=np.int64), np.full(BLOCKS, rk, dtype=np.int64))
        u.post_many(True, ep, *arrays[bs])
        flush()
    return one, batch, batch_c


def cffi_ops(s: Setup, ffi, lib, c_loop: bool = False):
    ep, w, rk = ffi.cast("void *", s.ep), ffi.cast("void *", s.w), ffi.cast("void *", s.rkey)
    p = ffi.new("rp_t *")
    if hasattr(lib, "b_put"):  # API mode: the typed wrappers
        put, fl, prog, chk, free = lib.b_put, lib.b_flush, lib.b_progress, lib.b_check, lib.b_free
    else:
        put, fl, prog, chk, free = (lib.ucp_put_nbx, lib.ucp_ep_flush_nbx, lib.ucp_worker_progress,
                                    lib.ucp_request_check_status, lib.ucp_request_free)
    null = ffi.NULL
    err_min = (1 << 64) - 100

    def flush() -> None:
        r = fl(ep, p)
        if r != null:
            while chk(r) == 1:
                prog(w)
            free(r)

    def post(local: int, n: int, remote: int) -> None:
        r = put(ep, ffi.cast("void *", local), n, remote, rk, p)
        if r != null:
            if int(ffi.cast("uintptr_t", r)) >= err_min:
                raise RuntimeError("put failed")
            free(r)

    def one() -> None:
        post(s.sa, 4096, s.da)
        flush()

    def batch(bs: int) -> None:
        if c_loop:
            assert lib.post_batch(ep, s.sa, s.da, BLOCKS, bs, rk) == 0
        else:
            sa, da = s.sa, s.da
            for i in range(BLOCKS):
                post(sa + i * bs, bs, da + i * bs)
        flush()
    return one, batch


def build_api(s: Setup, tmp: str):
    import importlib.util

    from cffi import FFI
    base = os.path.dirname(os.path.dirname(s.loaded.path))  # .../libucx/lib/libucp.so.0 -> .../libucx
    inc, libdir = os.path.join(base, "include"), os.path.dirname(s.loaded.path)
    if not os.path.exists(os.path.join(inc, "ucp", "api", "ucp.h")):
        raise RuntimeError(f"no UCX headers under {inc}")
    ffi = FFI()
    ffi.cdef(API_CDEF)
    ffi.set_source("_ucx_bench_api", API_SRC, include_dirs=[inc], library_dirs=[libdir], extra_compile_args=["-w"],
                   extra_link_args=[os.path.join(libdir, "libucp.so.0"), f"-Wl,-rpath,{libdir}"])
    so = ffi.compile(tmpdir=tmp, verbose=False)
    spec = importlib.util.spec_from_file_location("_ucx_bench_api", so)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ffi, mod.lib


def measure(one, batch, reps: int) -> tuple[float, float, float]:
    for _ in range(200):
        one()
    t = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps // 5):
            one()
        t.append((time.perf_counter() - t0) / (reps // 5))
    b16 = []
    b8 = []
    batch(16384)
    for _ in range(3):
        t0 = time.perf_counter()
        batch(16384)
        b16.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        batch(8)
        b8.append(time.perf_counter() - t0)
    return statistics.median(t) * 1e6, statistics.median(b16) * 1e3, statistics.median(b8) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20000, help="4 KiB round trips per binding (default 20000)")
    a = ap.parse_args()
    s = Setup()
    print(f"UCX {s.u.version()} from {s.loaded.path} ({s.loaded.source}), UCX_TLS=self, {BLOCKS}-block batches")
    one, batch, batch_c = ctypes_ops(s)
    rows = [("ctypes", one, batch)]
    if batch_helper() is not None:
        rows.append(("ctypes + C loop", one, batch_c))
    try:
        from cffi import FFI
        ffi = FFI()
        ffi.cdef(CDEF)
        lib = ffi.dlopen(s.loaded.path)
        rows.append(("cffi ABI", *cffi_ops(s, ffi, lib)))
        with tempfile.TemporaryDirectory() as tmp:
            try:
                affi, alib = build_api(s, tmp)
                rows.append(("cffi API", *cffi_ops(s, affi, alib)))
                rows.append(("cffi API + C loop", *cffi_ops(s, affi, alib, c_loop=True)))
            except Exception as e:  # noqa: BLE001 - a missing compiler is a row that says so
                print(f"cffi API mode not built: {e}")
            print(f"{'binding':18s} {'4KiB put+flush us':>18s} {'32k x 16KiB ms':>15s} {'32k x 8B ms':>12s} "
                  f"{'us/call (8B)':>13s}")
            for name, one, batch in rows:
                lat, b16, b8 = measure(one, batch, a.reps)
                print(f"{name:18s} {lat:18.2f} {b16:15.1f} {b8:12.1f} {b8 * 1e3 / BLOCKS:13.2f}")
    except ImportError:
        print("cffi not installed: only ctypes measured")
        for name, one, batch in rows:
            print(name, *measure(one, batch, a.reps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
