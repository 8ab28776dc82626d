"""A thin, typed ctypes binding of the part of UCX's UCP API the transport uses.

Nothing here decides which lanes, peers or deadlines: each :class:`Ucp` method is one UCP call
with its status turned into :class:`UcxError`, and :class:`NativeWorker` runs the waits the
transport (``transport.py``) asks for, with the poll and sleep times it passes.

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
  wire), small beside a 4 KiB transfer's engine overhead (~15 us) and any emulated lane here.
  What did matter was the waiting, not the binding: a wait written in Python holds the GIL
  between UCP calls, so the progress thread and the caller handed the GIL (and the worker lock)
  back and forth on every operation -- 4 KiB over UCX's tcp lane cost 4-7x our tcp. Post +
  flush + a bounded poll, then a sleep on the event fd, in one compiled call (``mc_w_rma``) and
  the progress thread's loop in C too (``mc_w_run``) brought it to 1.5-2.5x on the same loaded
  host (docs/benchmarks-log.md).
* The batch decides: ~3 us per block from Python is ~100 ms for a 32,768-block batch -- five
  times the wire time of 32,768 x 16 KiB on one 200 Gb/s NIC. No Python-level binding fixes
  that (cffi API mode only halves it); posting the batch from a loop in C does (100x+).
* So: ctypes for every call (no build step, no dependency, works with any libucp found at run
  time, NIXL's included, whose wheel has no headers), and the batch loop plus the worker's lock,
  waits and progress loop as a small C file compiled once per machine with the system compiler
  into ``~/.cache/mooncake-core/ucx/`` (:func:`native`). It needs no UCX headers and links
  nothing: it is handed the ``ucp_*`` function pointers of the library already loaded. Without
  a compiler the same batch posts, and the waits run, from Python (correct, slower) and a log
  line says so.
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

__all__ = ["Ucp", "UcxError", "UCS_OK", "UCS_INPROGRESS", "status_is_ptr_err", "NativeWorker", "native"]

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


#: The compiled part (no UCX headers or link needed: the UCP functions come as pointers from
#: the libucp already loaded):
#:
#: * ``mc_ucx_post_many``: posts every block of a batch with the put/get it is handed.
#: * ``mc_w_*``: a worker's lock (a pthread mutex) and its waits, so the hot path never holds
#:   the GIL while it waits and never hands work to another thread: ``mc_w_rma`` posts one
#:   operation, flushes its endpoint and progresses the worker itself until the flush completes
#:   (spinning a bounded time, then sleeping on the worker's event fd; never past the deadline);
#:   ``mc_w_run`` is the progress thread's loop (serves the peers' requests while no caller
#:   progresses; it stands aside on a condition variable while one does).
_NATIVE_C = r"""
#define _GNU_SOURCE
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <pthread.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>
#include <sys/eventfd.h>
typedef void *(*rma_fn)(void *, void *, size_t, uint64_t, void *, const void *);
typedef void *(*flush_fn)(void *, const void *);
typedef unsigned (*progress_fn)(void *);
typedef int (*status_fn)(void *);
typedef void (*free_fn)(void *);
#define IS_ERR(r) ((uintptr_t)(r) >= (uintptr_t)-100)
#define INPROGRESS 1

long mc_ucx_post_many(rma_fn fn, free_fn fr, void *ep, const int64_t *local, const int64_t *remote,
                      const int64_t *len, const int64_t *rkey, long n, const void *param, long *bad) {
    for (long i = 0; i < n; i++) {
        if (len[i] <= 0) continue;
        void *r = fn(ep, (void *)(intptr_t)local[i], (size_t)len[i], (uint64_t)remote[i], (void *)(intptr_t)rkey[i],
                     param);
        if (IS_ERR(r)) { *bad = i; return (long)(intptr_t)r; }
        if (r) fr(r);
    }
    return 0;
}

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int waiters, stop, wakefd, efd;
    int c_misses, c_skip; /* the callers' polling back-off */
    void *worker;
    const void *param;
    progress_fn progress;
    status_fn arm, check;
    free_fn fr;
    rma_fn put, get;
    flush_fn flush;
} mc_w;

static double mc_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

mc_w *mc_w_new(void *worker, int efd, void *progress, void *arm, void *check, void *fr, void *put, void *get,
               void *flush, const void *param) {
    mc_w *w = calloc(1, sizeof(mc_w));
    if (!w) return NULL;
    w->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->wakefd < 0) { free(w); return NULL; }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->worker = worker; w->efd = efd; w->param = param;
    w->progress = (progress_fn)progress; w->arm = (status_fn)arm; w->check = (status_fn)check;
    w->fr = (free_fn)fr; w->put = (rma_fn)put; w->get = (rma_fn)get; w->flush = (flush_fn)flush;
    return w;
}

void mc_w_free(mc_w *w) {
    close(w->wakefd);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

void mc_w_lock(mc_w *w) { pthread_mutex_lock(&w->mu); }
void mc_w_unlock(mc_w *w) { pthread_mutex_unlock(&w->mu); }
void mc_w_enter(mc_w *w) { pthread_mutex_lock(&w->mu); w->waiters++; pthread_mutex_unlock(&w->mu); }
void mc_w_leave(mc_w *w) {
    pthread_mutex_lock(&w->mu);
    if (--w->waiters == 0) pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void mc_w_stop(mc_w *w) {
    uint64_t one = 1;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (write(w->wakefd, &one, sizeof one) < 0) { /* the flag alone stops it within the idle wait */ }
}

/* Arm the worker; when nothing is pending, sleep on its event fd (or the stop fd) at most wait_s. */
static void mc_idle(mc_w *w, double wait_s) {
    pthread_mutex_lock(&w->mu);
    int st = w->arm(w->worker);
    pthread_mutex_unlock(&w->mu);
    if (st != 0 || wait_s <= 0) return; /* events pending (UCS_ERR_BUSY): progress again */
    struct pollfd p[2] = {{w->efd, POLLIN, 0}, {w->wakefd, POLLIN, 0}};
    struct timespec ts = {(time_t)wait_s, (long)((wait_s - (double)(time_t)wait_s) * 1e9)};
    ppoll(p, 2, &ts, NULL);
}

/* Busy-poll budget with back-off (as our tcp transport's Poller): a spin that found nothing makes
   the next 1, 3, 7 ... 63 waits sleep at once; one that found its event clears that. Polling only
   wins while a core is free for the peer; on a loaded host it takes the core the peer needs. */
static int mc_should_spin(int *skip) { if (*skip) { (*skip)--; return 0; } return 1; }
static void mc_record(int *misses, int *skip, int hit) {
    if (hit) { *misses = 0; *skip = 0; return; }
    if (*misses < 6) (*misses)++;
    *skip = (1 << *misses) - 1;
}

/* Progress until req completes (its status) or `until` (INPROGRESS); req is not freed. Polls for
   at most spin_s first (with back-off), then progresses while events come and sleeps on the event
   fd (at most wait_s at a time) when none do. The caller has entered. */
int mc_w_poll(mc_w *w, void *req, double spin_s, double wait_s, double until) {
    double t0 = mc_now();
    pthread_mutex_lock(&w->mu);
    int spin = spin_s > 0 && mc_should_spin(&w->c_skip);
    pthread_mutex_unlock(&w->mu);
    for (;;) {
        pthread_mutex_lock(&w->mu);
        unsigned n = w->progress(w->worker);
        int st = w->check(req);
        if (st != INPROGRESS && spin) mc_record(&w->c_misses, &w->c_skip, 1);
        pthread_mutex_unlock(&w->mu);
        if (st != INPROGRESS) return st;
        double t = mc_now();
        if (t > until) return INPROGRESS;
        if (spin) {
            if (t - t0 < spin_s) continue;
            spin = 0;
            pthread_mutex_lock(&w->mu); mc_record(&w->c_misses, &w->c_skip, 0); pthread_mutex_unlock(&w->mu);
        }
        if (n) continue;
        mc_idle(w, until - t < wait_s ? until - t : wait_s);
    }
}

/* mc_w_poll to the deadline, then req freed either way (UCX releases a request still in flight
   when it completes or is cancelled). */
int mc_w_wait(mc_w *w, void *req, double spin_s, double wait_s, double deadline) {
    int st = mc_w_poll(w, req, spin_s, wait_s, deadline);
    pthread_mutex_lock(&w->mu);
    w->fr(req);
    pthread_mutex_unlock(&w->mu);
    return st;
}

/* One put (write) or get, its endpoint flushed, progressed to completion or the deadline.
   *closed is the endpoint's closed flag (read under the lock: never post on a closed endpoint).
   Returns the status (<0 error, INPROGRESS at the deadline); *stage: 0 post, 1 flush, 2 wait, -1 closed. */
int mc_w_rma(mc_w *w, int write, void *ep, const int *closed, void *local, size_t len, uint64_t remote, void *rkey,
             double spin_s, double wait_s, double deadline, int *stage) {
    pthread_mutex_lock(&w->mu);
    if (*closed) { pthread_mutex_unlock(&w->mu); *stage = -1; return -24; }
    w->waiters++;
    void *r = (write ? w->put : w->get)(ep, local, len, remote, rkey, w->param);
    int st = 0;
    if (IS_ERR(r)) { *stage = 0; st = (int)(intptr_t)r; }
    else {
        if (r) w->fr(r);
        void *f = w->flush(ep, w->param);
        if (IS_ERR(f)) { *stage = 1; st = (int)(intptr_t)f; }
        else if (f) {
            pthread_mutex_unlock(&w->mu);
            *stage = 2;
            st = mc_w_wait(w, f, spin_s, wait_s, deadline);
            pthread_mutex_lock(&w->mu);
        }
    }
    if (--w->waiters == 0) pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return st;
}

/* The progress thread: progress while no caller does; after an event, poll up to spin_s for the
   next one (with back-off), else sleep on the event fd (at most wait_s); returns after mc_w_stop. */
void mc_w_run(mc_w *w, double spin_s, double wait_s) {
    double spin_until = 0;
    int misses = 0, skip = 0;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (w->waiters && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (w->stop) { pthread_mutex_unlock(&w->mu); return; }
        unsigned n = w->progress(w->worker);
        pthread_mutex_unlock(&w->mu);
        double t = mc_now();
        if (n) {
            if (spin_until) mc_record(&misses, &skip, 1);
            spin_until = spin_s > 0 && mc_should_spin(&skip) ? t + spin_s : 0;
            continue;
        }
        if (spin_until) {
            if (t < spin_until) continue;
            mc_record(&misses, &skip, 0);
            spin_until = 0;
        }
        mc_idle(w, wait_s);
    }
}
"""
_helper_lock = threading.Lock()
_helper: list[Any] = []  # [] not tried yet; [None] unavailable; [CDLL] loaded


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mooncake-core", "ucx")


def native() -> Any:
    """The compiled part (``_NATIVE_C``), built once per machine with the C compiler into
    ``~/.cache/mooncake-core/ucx/``; None when there is no compiler (then the transport posts
    batches and waits from Python: correct, slower)."""
    with _helper_lock:
        if _helper:
            return _helper[0]
        lib = None
        tag = hashlib.sha256(_NATIVE_C.encode()).hexdigest()[:16]
        path = os.path.join(_cache_dir(), f"mc_ucx_native_{tag}.so")
        try:
            if not os.path.exists(path):
                cc = shutil.which(os.environ.get("CC", "") or "cc") or shutil.which("gcc")
                if cc is None:
                    raise OSError("no C compiler (cc/gcc) on PATH")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as tmp:
                    src, out = os.path.join(tmp, "b.c"), os.path.join(tmp, "b.so")
                    with open(src, "w") as f:
                        f.write(_NATIVE_C)
                    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", out, src, "-lpthread"], check=True,
                                   capture_output=True, timeout=60)
                    os.replace(out, path)  # atomic: concurrent builders agree
            lib = ctypes.CDLL(path)
            _D = ctypes.c_double
            for name, res, args in (
                    ("mc_ucx_post_many", ctypes.c_long, [_P, _P, _P, _P, _P, _P, _P, ctypes.c_long, _P,
                                                         ctypes.POINTER(ctypes.c_long)]),
                    ("mc_w_new", _P, [_P, ctypes.c_int, _P, _P, _P, _P, _P, _P, _P, _P]),
                    ("mc_w_free", None, [_P]), ("mc_w_lock", None, [_P]), ("mc_w_unlock", None, [_P]),
                    ("mc_w_enter", None, [_P]), ("mc_w_leave", None, [_P]), ("mc_w_stop", None, [_P]),
                    ("mc_w_wait", ctypes.c_int, [_P, _P, _D, _D, _D]),
                    ("mc_w_poll", ctypes.c_int, [_P, _P, _D, _D, _D]),
                    ("mc_w_rma", ctypes.c_int, [_P, ctypes.c_int, _P, _P, _P, _SZ, _U64, _P, _D, _D, _D,
                                                ctypes.POINTER(ctypes.c_int)]),
                    ("mc_w_run", None, [_P, _D, _D])):
                fn = getattr(lib, name)
                fn.restype = res
                fn.argtypes = args
        except (OSError, subprocess.SubprocessError) as e:
            from mooncake_core.utils.log import get_logger
            get_logger("mooncake.te.ucx").info("UCX native helpers not compiled; batches post and waits run from "
                                               "Python", extra={"error": str(e)[:200]})
            lib = None
        _helper.append(lib)
        return lib


def batch_helper() -> Any:
    """The compiled batch loop (``mc_ucx_post_many``), or None (see :func:`native`)."""
    lib = native()
    return None if lib is None else lib.mc_ucx_post_many


class NativeWorker:
    """A UCP worker's lock, waits and progress loop in C (``mc_w_*`` in ``_NATIVE_C``): the
    caller of a transfer posts, flushes and progresses in one call without the GIL, and the
    progress thread runs without the GIL too (it never competes with the caller for it).

    ``lock`` is a context manager over the same mutex, for every other UCP call on the worker.
    """

    def __init__(self, lib: Any, ucp: "Ucp", worker: int, efd: int) -> None:
        u = ucp.lib
        self._lib = lib
        self.h = lib.mc_w_new(worker, efd, *(ctypes.cast(f, _P) for f in (
            u.ucp_worker_progress, u.ucp_worker_arm, u.ucp_request_check_status, u.ucp_request_free,
            u.ucp_put_nbx, u.ucp_get_nbx, u.ucp_ep_flush_nbx)), ucp._noparam_ptr)
        if not self.h:
            raise OSError("mc_w_new failed (out of memory or file descriptors)")
        self.lock = _NativeLock(lib, self.h)

    def enter(self) -> None:
        self._lib.mc_w_enter(self.h)

    def leave(self) -> None:
        self._lib.mc_w_leave(self.h)

    def wait(self, req: int, spin_s: float, wait_s: float, deadline: float) -> int:
        """Progress until ``req`` completes (its status) or ``deadline`` (time.monotonic;
        UCS_INPROGRESS); ``req`` is released either way. The caller has entered."""
        return int(self._lib.mc_w_wait(self.h, req, spin_s, wait_s, deadline))

    def poll(self, req: int, spin_s: float, wait_s: float, until: float) -> int:
        """Like :meth:`wait` up to ``until``, but ``req`` stays the caller's (to free)."""
        return int(self._lib.mc_w_poll(self.h, req, spin_s, wait_s, until))

    def rma(self, write: bool, ep: int, closed: ctypes.c_int, local: int, length: int, remote: int, rkey: int,
            spin_s: float, wait_s: float, deadline: float) -> tuple[int, int]:
        """Put/get, flush and wait in one call: (status, stage) -- stage 0 post, 1 flush, 2 wait,
        -1 the endpoint was closed (``closed`` set) before the post."""
        stage = ctypes.c_int(2)
        st = self._lib.mc_w_rma(self.h, int(write), ep, ctypes.byref(closed), local, length, remote, rkey, spin_s,
                                wait_s, deadline, ctypes.byref(stage))
        return int(st), stage.value

    def run(self, spin_s: float, wait_s: float) -> None:
        """The progress thread's body: returns after :meth:`stop`."""
        self._lib.mc_w_run(self.h, spin_s, wait_s)

    def stop(self) -> None:
        self._lib.mc_w_stop(self.h)

    def free(self) -> None:
        if self.h:
            self._lib.mc_w_free(self.h)
            self.h = None


class _NativeLock:
    """``with lock:`` over the worker's pthread mutex (ctypes drops the GIL while it blocks)."""

    __slots__ = ("_lock", "_unlock", "_h")

    def __init__(self, lib: Any, h: int) -> None:
        self._lock, self._unlock, self._h = lib.mc_w_lock, lib.mc_w_unlock, h

    def __enter__(self) -> None:
        self._lock(self._h)

    def __exit__(self, *exc: object) -> None:
        self._unlock(self._h)


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
    def init(self, config: dict[str, str], name: str = "mooncake", shared: bool = False,
             tuning: dict[str, str] | None = None) -> int:
        """A context with RMA + WAKEUP; ``config`` entries are UCX variables without ``UCX_``
        (``TLS``, ``NET_DEVICES``), applied on top of the environment's ``UCX_*``. ``tuning``:
        entries applied where this UCX knows them (our defaults, skipped otherwise). ``shared``:
        several workers, each used by its own thread, share the context (UCX then locks the
        context itself)."""
        cfg = _P()
        self.check("ucp_config_read", self.lib.ucp_config_read(None, None, ctypes.byref(cfg)))
        try:
            for k, v in config.items():
                st = self.lib.ucp_config_modify(cfg, k.encode(), v.encode())
                if st != UCS_OK:
                    raise UcxError(f"ucp_config_modify({k}={v})", st, self.status_text(st))
            for k, v in (tuning or {}).items():
                self.lib.ucp_config_modify(cfg, k.encode(), v.encode())  # an older UCX without the knob: skipped
            p = _Params(field_mask=UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
                        features=UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP, mt_workers_shared=int(shared))
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
