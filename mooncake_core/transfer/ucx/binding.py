"""A thin, typed ctypes binding of the part of UCX's UCP API the transport uses.

Nothing here decides anything: each method is one UCP call with its status turned into
:class:`UcxError`. The transport (``transport.py``) holds the policy: locking, progress,
deadlines, which lanes.

Why ctypes plus one compiled loop -- measured with ``bench/transfer/bench_ucx_binding.py`` (UCX 1.22,
``UCX_TLS=self``: an endpoint to its own worker, so the figures are the binding's cost and
UCX's software path, no wire; three runs on this 2-core machine under other jobs' load, so
ranges; BENCHMARKS.md):

==================  ======================  =========================  ===================
binding             4 KiB put+flush (us)    32,768 x 8 B batch (ms)    per call, batch (us)
==================  ======================  =========================  ===================
ctypes              5.5 - 6.5               88 - 228                   2.7 - 7.0
cffi ABI mode       3.4 - 7.9               103 - 114                  3.1 - 3.5
cffi API mode       0.8 - 3.7               54 - 66                    1.7 - 2.0
a loop in C         0.7 - 2.7 (cffi API)    0.2 - 0.5                  0.01 - 0.02
==================  ======================  =========================  ===================

* The 4 KiB round trip differs by 3-5 us between bindings: real on an RDMA lane (a few us of
  wire), small beside a 4 KiB transfer's engine overhead (~15 us) and any emulated lane here
  (16 us over shared memory, 150+ us over tcp). Not decisive today; the next step, if RDMA
  latency needs it, is the same trick as below: post + flush + a bounded progress spin in one
  compiled call.
* The batch decides: ~3 us per block from Python is ~100 ms for a 32,768-block batch -- five
  times the wire time of 32,768 x 16 KiB on one 200 Gb/s NIC. No Python-level binding fixes
  that (cffi API mode only halves it); posting the batch from a loop in C does (100x+).
* So: ctypes for every call (no build step, no dependency, works with any libucp found at run
  time, NIXL's included, whose wheel has no headers), and the batch loop as ~15 lines of C
  compiled once per machine with the system compiler into ``~/.cache/mooncake-core/ucx/``
  (:func:`batch_helper`). It needs no UCX headers and links nothing: it is handed the
  ``ucp_put_nbx``/``ucp_get_nbx`` pointers of the library already loaded. Without a compiler
  the same batch posts from Python (correct, slower) and a log line says so.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from typing import Any

import numpy as np

__all__ = ["Ucp", "UcxError", "UCS_OK", "UCS_INPROGRESS", "status_is_ptr_err"]

UCS_OK = 0
UCS_INPROGRESS = 1
UCS_ERR_NO_RESOURCE = -2
UCS_ERR_UNREACHABLE = -6
UCS_ERR_NO_DEVICE = -14
UCS_ERR_BUSY = -15
UCS_ERR_CANCELED = -16
UCS_ERR_TIMED_OUT = -20
UCS_ERR_LAST = -100

UCP_FEATURE_RMA = 1 << 1
UCP_FEATURE_WAKEUP = 1 << 4
UCP_PARAM_FIELD_FEATURES = 1 << 0
UCP_PARAM_FIELD_MT_WORKERS_SHARED = 1 << 5
UCP_PARAM_FIELD_NAME = 1 << 8
UCP_WORKER_PARAM_FIELD_THREAD_MODE = 1 << 0
UCS_THREAD_MODE_SERIALIZED = 1
UCP_EP_PARAM_FIELD_REMOTE_ADDRESS = 1 << 0
UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE = 1 << 1
UCP_ERR_HANDLING_MODE_NONE = 0
UCP_ERR_HANDLING_MODE_PEER = 1
UCP_MEM_MAP_PARAM_FIELD_ADDRESS = 1 << 0
UCP_MEM_MAP_PARAM_FIELD_LENGTH = 1 << 1
UCP_OP_ATTR_FIELD_FLAGS = 1 << 4
UCP_EP_CLOSE_FLAG_FORCE = 1 << 0
UCP_API_MAJOR = 1
UCP_API_MINOR = 10  # the oldest API minor whose calls we use (put/get/flush _nbx: UCX 1.10)

_P = ctypes.c_void_p
_U64 = ctypes.c_uint64
_SZ = ctypes.c_size_t
_ST = ctypes.c_int  # ucs_status_t


class UcxError(RuntimeError):
    """A UCP call returned an error status (``status`` is the ucs_status_t, negative)."""

    def __init__(self, call: str, status: int, text: str) -> None:
        super().__init__(f"{call} failed: {text} (ucs_status {status})")
        self.call = call
        self.status = status


class _Params(ctypes.Structure):  # ucp_params_t (fields up to name; UCX reads only those masked)
    _fields_ = [("field_mask", _U64), ("features", _U64), ("request_size", _SZ), ("request_init", _P),
                ("request_cleanup", _P), ("tag_sender_mask", _U64), ("mt_workers_shared", ctypes.c_int),
                ("estimated_num_eps", _SZ), ("estimated_num_ppn", _SZ), ("name", ctypes.c_char_p),
                ("node_local_id", _SZ)]


class _WorkerParams(ctypes.Structure):  # ucp_worker_params_t (thread_mode only; padded)
    _fields_ = [("field_mask", _U64), ("thread_mode", ctypes.c_int), ("_rest", ctypes.c_char * 512)]


class _EpParams(ctypes.Structure):  # ucp_ep_params_t (address, err_mode; padded)
    _fields_ = [("field_mask", _U64), ("address", _P), ("err_mode", ctypes.c_int), ("_rest", ctypes.c_char * 512)]


class _MemMapParams(ctypes.Structure):  # ucp_mem_map_params_t (address, length; padded)
    _fields_ = [("field_mask", _U64), ("address", _P), ("length", _SZ), ("flags", ctypes.c_uint),
                ("prot", ctypes.c_uint), ("_rest", ctypes.c_char * 256)]


class _RequestParam(ctypes.Structure):  # ucp_request_param_t (op_attr_mask, flags; padded)
    _fields_ = [("op_attr_mask", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("_rest", ctypes.c_char * 256)]


_PTR_ERR_MIN = (1 << 64) + UCS_ERR_LAST  # UCS_PTR_IS_ERR: (uintptr_t)ptr >= (uintptr_t)UCS_ERR_LAST


def status_is_ptr_err(ptr: int | None) -> int:
    """The status inside a ``ucs_status_ptr_t``: 0 for NULL (done) or a request, <0 for an error."""
    if ptr is not None and ptr >= _PTR_ERR_MIN:
        return ptr - (1 << 64)
    return UCS_OK


_SIGS: dict[str, tuple[Any, list[Any]]] = {
    "ucp_get_version": (None, [ctypes.POINTER(ctypes.c_uint)] * 3),
    "ucp_config_read": (_ST, [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(_P)]),
    "ucp_config_modify": (_ST, [_P, ctypes.c_char_p, ctypes.c_char_p]),
    "ucp_config_release": (None, [_P]),
    "ucp_init_version": (_ST, [ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(_Params), _P, ctypes.POINTER(_P)]),
    "ucp_cleanup": (None, [_P]),
    "ucp_worker_create": (_ST, [_P, ctypes.POINTER(_WorkerParams), ctypes.POINTER(_P)]),
    "ucp_worker_destroy": (None, [_P]),
    "ucp_worker_get_address": (_ST, [_P, ctypes.POINTER(_P), ctypes.POINTER(_SZ)]),
    "ucp_worker_release_address": (None, [_P, _P]),
    "ucp_worker_progress": (ctypes.c_uint, [_P]),
    "ucp_worker_get_efd": (_ST, [_P, ctypes.POINTER(ctypes.c_int)]),
    "ucp_worker_arm": (_ST, [_P]),
    "ucp_worker_print_info": (None, [_P, _P]),
    "ucp_context_print_info": (None, [_P, _P]),
    "ucp_ep_create": (_ST, [_P, ctypes.POINTER(_EpParams), ctypes.POINTER(_P)]),
    "ucp_ep_close_nbx": (_P, [_P, ctypes.POINTER(_RequestParam)]),
    "ucp_ep_print_info": (None, [_P, _P]),
    "ucp_ep_flush_nbx": (_P, [_P, ctypes.POINTER(_RequestParam)]),
    "ucp_mem_map": (_ST, [_P, ctypes.POINTER(_MemMapParams), ctypes.POINTER(_P)]),
    "ucp_mem_unmap": (_ST, [_P, _P]),
    "ucp_rkey_pack": (_ST, [_P, _P, ctypes.POINTER(_P), ctypes.POINTER(_SZ)]),
    "ucp_rkey_buffer_release": (None, [_P]),
    "ucp_ep_rkey_unpack": (_ST, [_P, ctypes.c_char_p, ctypes.POINTER(_P)]),
    "ucp_rkey_destroy": (None, [_P]),
    "ucp_put_nbx": (_P, [_P, _P, _SZ, _U64, _P, ctypes.POINTER(_RequestParam)]),
    "ucp_get_nbx": (_P, [_P, _P, _SZ, _U64, _P, ctypes.POINTER(_RequestParam)]),
    "ucp_request_check_status": (_ST, [_P]),
    "ucp_request_free": (None, [_P]),
    "ucp_request_cancel": (None, [_P, _P]),
    "ucs_status_string": (ctypes.c_char_p, [_ST]),
}


#: the batch loop in C: posts every block with the put/get function it is handed (no UCX headers
#: or link needed: the function pointers come from the libucp already loaded)
_BATCH_C = r"""
#include <stdint.h>
#include <stddef.h>
typedef void *(*rma_fn)(void *, void *, size_t, uint64_t, void *, const void *);
typedef void (*free_fn)(void *);
long mc_ucx_post_many(rma_fn fn, free_fn fr, void *ep, const int64_t *local, const int64_t *remote,
                      const int64_t *len, const int64_t *rkey, long n, const void *param, long *bad) {
    for (long i = 0; i < n; i++) {
        if (len[i] <= 0) continue;
        void *r = fn(ep, (void *)(intptr_t)local[i], (size_t)len[i], (uint64_t)remote[i], (void *)(intptr_t)rkey[i],
                     param);
        if ((uintptr_t)r >= (uintptr_t)-100) { *bad = i; return (long)(intptr_t)r; }
        if (r) fr(r);
    }
    return 0;
}
"""
_helper_lock = threading.Lock()
_helper: list[Any] = []  # [] not tried yet; [None] unavailable; [fn] loaded


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mooncake-core", "ucx")


def batch_helper() -> Any:
    """The compiled batch loop (``mc_ucx_post_many``), built once per machine with the C compiler
    into ``~/.cache/mooncake-core/ucx/``; None when there is no compiler (the Python loop is used)."""
    with _helper_lock:
        if _helper:
            return _helper[0]
        fn = None
        tag = hashlib.sha256(_BATCH_C.encode()).hexdigest()[:16]
        path = os.path.join(_cache_dir(), f"mc_ucx_batch_{tag}.so")
        try:
            if not os.path.exists(path):
                cc = shutil.which(os.environ.get("CC", "") or "cc") or shutil.which("gcc")
                if cc is None:
                    raise OSError("no C compiler (cc/gcc) on PATH")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as tmp:
                    src, out = os.path.join(tmp, "b.c"), os.path.join(tmp, "b.so")
                    with open(src, "w") as f:
                        f.write(_BATCH_C)
                    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", out, src], check=True, capture_output=True,
                                   timeout=60)
                    os.replace(out, path)  # atomic: concurrent builders agree
            lib = ctypes.CDLL(path)
            fn = lib.mc_ucx_post_many
            fn.restype = ctypes.c_long
            fn.argtypes = [_P, _P, _P, _P, _P, _P, _P, ctypes.c_long, _P, ctypes.POINTER(ctypes.c_long)]
        except (OSError, subprocess.SubprocessError) as e:
            from mooncake_core.utils.log import get_logger
            get_logger("mooncake.te.ucx").info("UCX batch loop not compiled; large batches post from Python",
                                               extra={"error": str(e)[:200]})
            fn = None
        _helper.append(fn)
        return fn


class Ucp:
    """One loaded libucp: typed calls, statuses checked. Handles are plain ints."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        for name, (res, args) in _SIGS.items():
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        self._put = lib.ucp_put_nbx
        self._get = lib.ucp_get_nbx
        self._check = lib.ucp_request_check_status
        self._free = lib.ucp_request_free
        self.progress = lib.ucp_worker_progress  # (worker) -> events; hot, called bare
        self._noparam_struct = _RequestParam()
        self._noparam = ctypes.byref(self._noparam_struct)
        self._noparam_ptr = ctypes.addressof(self._noparam_struct)
        force = _RequestParam(op_attr_mask=UCP_OP_ATTR_FIELD_FLAGS, flags=UCP_EP_CLOSE_FLAG_FORCE)
        self._force = ctypes.byref(force)
        self._keep = (force,)
        libc = ctypes.CDLL(None)
        self._open_memstream = libc.open_memstream
        self._open_memstream.restype = _P
        self._open_memstream.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(_SZ)]
        self._fclose = libc.fclose
        self._fclose.argtypes = [_P]

    # ------------------------------------------------------------------ helpers
    def status_text(self, status: int) -> str:
        s = self.lib.ucs_status_string(status)
        return s.decode() if s else f"status {status}"

    def check(self, call: str, status: int) -> None:
        if status != UCS_OK:
            raise UcxError(call, status, self.status_text(status))

    def version(self) -> str:
        a, b, c = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
        self.lib.ucp_get_version(ctypes.byref(a), ctypes.byref(b), ctypes.byref(c))
        return f"{a.value}.{b.value}.{c.value}"

    def _capture(self, fn: Any, handle: int) -> str:
        """What a ``ucp_*_print_info(handle, FILE*)`` prints, as text (open_memstream)."""
        buf, size = ctypes.c_char_p(), _SZ()
        f = self._open_memstream(ctypes.byref(buf), ctypes.byref(size))
        if not f:
            return ""
        try:
            fn(handle, f)
        finally:
            self._fclose(f)
        text = ctypes.string_at(buf, size.value).decode(errors="replace") if buf else ""
        if buf:
            ctypes.CDLL(None).free(buf)
        return text

    # ------------------------------------------------------------------ context and worker
    def init(self, config: dict[str, str], name: str = "mooncake") -> int:
        """A context with RMA + WAKEUP; ``config`` entries are UCX variables without ``UCX_``
        (``TLS``, ``NET_DEVICES``), applied on top of the environment's ``UCX_*``."""
        cfg = _P()
        self.check("ucp_config_read", self.lib.ucp_config_read(None, None, ctypes.byref(cfg)))
        try:
            for k, v in config.items():
                st = self.lib.ucp_config_modify(cfg, k.encode(), v.encode())
                if st != UCS_OK:
                    raise UcxError(f"ucp_config_modify({k}={v})", st, self.status_text(st))
            p = _Params(field_mask=UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
                        features=UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP, mt_workers_shared=0)
            ctx = _P()
            self.check("ucp_init", self.lib.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, ctypes.byref(p), cfg,
                                                             ctypes.byref(ctx)))
        finally:
            self.lib.ucp_config_release(cfg)
        return int(ctx.value or 0)

    def context_info(self, ctx: int) -> str:
        """What ``ucp_context_print_info`` prints: the transports and devices the context found."""
        return self._capture(self.lib.ucp_context_print_info, ctx)

    def cleanup(self, ctx: int) -> None:
        self.lib.ucp_cleanup(ctx)

    def worker_create(self, ctx: int) -> int:
        p = _WorkerParams(field_mask=UCP_WORKER_PARAM_FIELD_THREAD_MODE, thread_mode=UCS_THREAD_MODE_SERIALIZED)
        w = _P()
        self.check("ucp_worker_create", self.lib.ucp_worker_create(ctx, ctypes.byref(p), ctypes.byref(w)))
        return int(w.value or 0)

    def worker_destroy(self, worker: int) -> None:
        self.lib.ucp_worker_destroy(worker)

    def worker_address(self, worker: int) -> bytes:
        a, n = _P(), _SZ()
        self.check("ucp_worker_get_address", self.lib.ucp_worker_get_address(worker, ctypes.byref(a),
                                                                              ctypes.byref(n)))
        try:
            return ctypes.string_at(a.value or 0, n.value)
        finally:
            self.lib.ucp_worker_release_address(worker, a)

    def worker_efd(self, worker: int) -> int:
        fd = ctypes.c_int(-1)
        self.check("ucp_worker_get_efd", self.lib.ucp_worker_get_efd(worker, ctypes.byref(fd)))
        return fd.value

    def worker_arm(self, worker: int) -> bool:
        """True when armed (safe to sleep on the efd); False when events are pending (progress)."""
        st = self.lib.ucp_worker_arm(worker)
        if st == UCS_ERR_BUSY:
            return False
        self.check("ucp_worker_arm", st)
        return True

    def worker_info(self, worker: int) -> str:
        return self._capture(self.lib.ucp_worker_print_info, worker)

    # ------------------------------------------------------------------ endpoints
    def ep_create(self, worker: int, address: bytes, peer_errors: bool) -> int:
        abuf = ctypes.create_string_buffer(address, len(address))
        p = _EpParams(field_mask=UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                      address=ctypes.cast(abuf, _P),
                      err_mode=UCP_ERR_HANDLING_MODE_PEER if peer_errors else UCP_ERR_HANDLING_MODE_NONE)
        ep = _P()
        self.check("ucp_ep_create", self.lib.ucp_ep_create(worker, ctypes.byref(p), ctypes.byref(ep)))
        return int(ep.value or 0)

    def ep_close_force(self, ep: int) -> int | None:
        """Start a forced close; the request (or None when done) must be progressed/freed."""
        r = self.lib.ucp_ep_close_nbx(ep, self._force)
        return None if not r or status_is_ptr_err(r) else int(r)

    def ep_info(self, ep: int) -> str:
        return self._capture(self.lib.ucp_ep_print_info, ep)

    def ep_flush(self, ep: int) -> int | None:
        """Start a flush: None when already complete, else a request to poll and free."""
        r = self.lib.ucp_ep_flush_nbx(ep, self._noparam)
        st = status_is_ptr_err(r)
        if st:
            raise UcxError("ucp_ep_flush_nbx", st, self.status_text(st))
        return int(r) if r else None

    # ------------------------------------------------------------------ memory and keys
    def mem_map(self, ctx: int, addr: int, length: int) -> int:
        p = _MemMapParams(field_mask=UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                          address=addr, length=length)
        h = _P()
        self.check("ucp_mem_map", self.lib.ucp_mem_map(ctx, ctypes.byref(p), ctypes.byref(h)))
        return int(h.value or 0)

    def mem_unmap(self, ctx: int, memh: int) -> None:
        self.check("ucp_mem_unmap", self.lib.ucp_mem_unmap(ctx, memh))

    def rkey_pack(self, ctx: int, memh: int) -> bytes:
        buf, n = _P(), _SZ()
        self.check("ucp_rkey_pack", self.lib.ucp_rkey_pack(ctx, memh, ctypes.byref(buf), ctypes.byref(n)))
        try:
            return ctypes.string_at(buf.value or 0, n.value)
        finally:
            self.lib.ucp_rkey_buffer_release(buf)

    def rkey_unpack(self, ep: int, packed: bytes) -> int:
        rk = _P()
        self.check("ucp_ep_rkey_unpack", self.lib.ucp_ep_rkey_unpack(ep, packed, ctypes.byref(rk)))
        return int(rk.value or 0)

    def rkey_destroy(self, rkey: int) -> None:
        self.lib.ucp_rkey_destroy(rkey)

    # ------------------------------------------------------------------ one-sided operations
    def post(self, write: bool, ep: int, local: int, length: int, remote: int, rkey: int) -> None:
        """Post one put (write) or get; the handle of a pending operation is released at
        once -- completion is learnt from the endpoint flush that follows."""
        r = (self._put if write else self._get)(ep, local, length, remote, rkey, self._noparam)
        if r:
            if r >= _PTR_ERR_MIN:
                st = r - (1 << 64)
                raise UcxError("ucp_put_nbx" if write else "ucp_get_nbx", st, self.status_text(st))
            self._free(r)

    def post_many(self, write: bool, ep: int, local: np.ndarray, remote: np.ndarray, length: np.ndarray,
                  rkey: np.ndarray) -> None:
        """Post one put/get per block (int64 arrays of equal length; blocks of length <= 0 are
        skipped): one C call when the batch loop is compiled, else a Python loop."""
        helper = batch_helper()
        if helper is None:
            for a, b, n, k in zip(local.tolist(), remote.tolist(), length.tolist(), rkey.tolist()):
                if n > 0:
                    self.post(write, ep, a, n, b, k)
            return
        arrs = [np.ascontiguousarray(x, dtype=np.int64) for x in (local, remote, length, rkey)]
        bad = ctypes.c_long(-1)
        fn = self._put if write else self._get
        st = helper(ctypes.cast(fn, _P), ctypes.cast(self._free, _P), ep, *(a.ctypes.data for a in arrs),
                    len(arrs[0]), self._noparam_ptr, ctypes.byref(bad))
        if st:
            raise UcxError(f"{'ucp_put_nbx' if write else 'ucp_get_nbx'} (block {bad.value})", int(st),
                           self.status_text(int(st)))

    def request_status(self, req: int) -> int:
        return int(self._check(req))

    def request_free(self, req: int) -> None:
        self._free(req)

    def request_cancel(self, worker: int, req: int) -> None:
        self.lib.ucp_request_cancel(worker, req)
