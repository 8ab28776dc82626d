"""The CUDA side of ``device_memory.DeviceCopier``, thin, over ``cuda.bindings.runtime``.

Why ``cuda-python`` and not torch's runtime: torch exposes no copy between raw addresses or
IPC handle of a raw pointer (only of its own storages), and wrapping every address in a tensor
costs more than the copy of a 16 KiB block (measured on an H200: 22.5 us a copy through torch
against 8.2 us here, ``bench/gpu/bench_gpu_copy_call.py``); ``cuda.bindings`` is NVIDIA's own binding of the
runtime, takes plain int pointers, and is one small wheel (``pip install cuda-python``).
Every call's status is checked; a failure raises ``CudaError`` naming the call and CUDA's error.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

__all__ = ["CudaCopier", "CudaError", "available"]

IPC_HANDLE_BYTES = 64
#: below this many copies a batch goes to the runtime's copy calls, not the kernel
KERNEL_MIN = 32

#: one thread block per copy; 16-byte loads/stores where both ends and the length allow
SCATTER_SRC = r"""
extern "C" __global__ void mc_scatter_copy(const unsigned long long* dst, const unsigned long long* src,
                                           const unsigned long long* len, unsigned int count) {
    unsigned int i = blockIdx.x;
    if (i >= count) return;
    unsigned long long d = dst[i], s = src[i], n = len[i];
    if (((d | s | n) & 15ULL) == 0) {
        uint4* d4 = (uint4*)d;
        const uint4* s4 = (const uint4*)s;
        for (unsigned long long k = threadIdx.x; k < (n >> 4); k += blockDim.x) d4[k] = s4[k];
    } else {
        char* d1 = (char*)d;
        const char* s1 = (const char*)s;
        for (unsigned long long k = threadIdx.x; k < n; k += blockDim.x) d1[k] = s1[k];
    }
}
"""


class CudaError(RuntimeError):
    """A CUDA runtime/driver call failed."""


def available() -> bool:
    """True when ``cuda.bindings`` imports and sees at least one device."""
    try:
        from cuda.bindings import runtime as rt
    except Exception:  # noqa: BLE001 - absent or broken: no CUDA here
        return False
    try:
        err, n = rt.cudaGetDeviceCount()
    except Exception:  # noqa: BLE001
        return False
    return err == rt.cudaError_t.cudaSuccess and n > 0


class CudaCopier:
    """Device copies for one process (thread-safe: each thread sets its device before a call)."""

    kind = "cuda"

    def __init__(self) -> None:
        from cuda.bindings import driver as drv
        from cuda.bindings import runtime as rt
        self.rt, self.drv = rt, drv
        self._ok = rt.cudaError_t.cudaSuccess
        self._default_kind = rt.cudaMemcpyKind.cudaMemcpyDefault
        self._local = threading.local()
        n = self._check(rt.cudaGetDeviceCount(), "cudaGetDeviceCount")
        if n < 1:
            raise CudaError("cudaGetDeviceCount: no CUDA device")
        self.devices = int(n)
        self._batch: bool | None = None  # cudaMemcpyBatchAsync: unknown / works / missing
        self._kernel: bool | None = None  # the copy kernel: unknown / works / unavailable
        self.kernel_error = ""
        self._kernels: dict[int, Any] = {}
        self._scratch: dict[tuple[int, int], tuple[int, int]] = {}
        self._attrs: list[Any] | None = None
        self.batch_error = ""

    # ------------------------------------------------------------------ plumbing
    def _check(self, res: Any, what: str) -> Any:
        err = res[0] if isinstance(res, tuple) else res
        if err != self._ok and err != getattr(self.drv.CUresult, "CUDA_SUCCESS", None):
            try:
                name = self.rt.cudaGetErrorString(err)[1]
                name = name.decode() if isinstance(name, bytes) else str(name)
            except Exception:  # noqa: BLE001 - a driver error has no runtime string
                name = str(err)
            raise CudaError(f"{what} failed: {name} ({err})")
        if isinstance(res, tuple):
            return res[1] if len(res) == 2 else res[1:]
        return None

    def set_device(self, device: int) -> None:
        if getattr(self._local, "device", None) != device:
            self._check(self.rt.cudaSetDevice(device), f"cudaSetDevice({device})")
            self._local.device = device

    # ------------------------------------------------------------------ copies
    def copy(self, dst: int, src: int, n: int) -> None:
        self._check(self.rt.cudaMemcpy(dst, src, n, self._default_kind), f"cudaMemcpy({dst:#x}, {src:#x}, {n})")

    def copy_async(self, dst: int, src: int, n: int, stream: Any) -> None:
        device, s = stream
        self.set_device(device)
        self._check(self.rt.cudaMemcpyAsync(dst, src, n, self._default_kind, s),
                    f"cudaMemcpyAsync({dst:#x}, {src:#x}, {n})")

    def copy_batch_async(self, dsts: Any, srcs: Any, sizes: Any, stream: Any, device_only: bool = False) -> None:
        """Many copies queued on ``stream`` at once. ``device_only`` (every address is device or
        pinned memory, which kernels can reach): one launch of a copy kernel (:data:`SCATTER_SRC`,
        compiled once with NVRTC); else one ``cudaMemcpyBatchAsync`` (CUDA 12.8+); else a loop.
        Why: a KV block list is thousands of 16 KiB copies, and a call per copy (or the batch
        API, which the driver still runs copy by copy) moved 32,768 blocks at 1.3-2.4 GB/s on an
        H200 (BENCHMARKS.md) -- one kernel moves them at memory speed."""
        n = len(sizes)
        if device_only and n >= KERNEL_MIN and self._kernel is not False:
            device, s = stream
            try:
                self._scatter(device, s, dsts, srcs, sizes)
                return
            except Exception as e:  # noqa: BLE001 - no NVRTC / launch refused: the batch API instead
                if self._kernel:
                    raise
                self._kernel = False
                self.kernel_error = str(e)
        if not isinstance(sizes, list):
            dsts, srcs, sizes = (np.asarray(x).tolist() for x in (dsts, srcs, sizes))
        if len(sizes) > 1 and self._batch is not False:
            device, s = stream
            self.set_device(device)
            try:
                if self._attrs is None:
                    a = self.rt.cudaMemcpyAttributes()
                    a.srcAccessOrder = self.rt.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream
                    self._attrs = [a]
                self._check(self.rt.cudaMemcpyBatchAsync(dsts, srcs, sizes, len(sizes), self._attrs, [0], 1, s),
                            f"cudaMemcpyBatchAsync({len(sizes)} copies)")
                self._batch = True
                return
            except (AttributeError, TypeError, CudaError) as e:
                if self._batch:  # it worked before: a real failure
                    raise
                self._batch = False
                self.batch_error = str(e)
        for d, src, n in zip(dsts, srcs, sizes):
            self.copy_async(d, src, n, stream)

    def _module(self, device: int) -> Any:
        """The copy kernel for ``device``, compiled for its compute capability (once)."""
        fn = self._kernels.get(device)
        if fn is not None:
            return fn
        from cuda.bindings import nvrtc
        self.set_device(device)
        rt = self.rt
        major = self._check(rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor, device),
                            "cudaDeviceGetAttribute")
        minor = self._check(rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor, device),
                            "cudaDeviceGetAttribute")

        def ok(res: Any, what: str) -> Any:
            err = res[0] if isinstance(res, tuple) else res
            if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                raise CudaError(f"{what} failed: {err}")
            return res[1] if isinstance(res, tuple) and len(res) > 1 else None

        prog = ok(nvrtc.nvrtcCreateProgram(SCATTER_SRC.encode(), b"mc_scatter_copy.cu", 0, [], []),
                  "nvrtcCreateProgram")
        opts = [f"--gpu-architecture=compute_{major}{minor}".encode()]
        if nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            size = ok(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise CudaError(f"nvrtcCompileProgram failed: {log.decode(errors='replace')}")
        size = ok(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        ptx = b" " * size
        ok(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        module = self._check(self.drv.cuModuleLoadData(ptx), "cuModuleLoadData")
        fn = self._check(self.drv.cuModuleGetFunction(module, b"mc_scatter_copy"), "cuModuleGetFunction")
        self._kernels[device] = fn
        return fn

    def _scatter(self, device: int, stream: Any, dsts: Any, srcs: Any, sizes: Any) -> None:
        """Upload the three address arrays (stream-ordered, into a per-stream device scratch) and
        launch one block per copy."""
        fn = self._module(device)
        table = np.concatenate([np.asarray(dsts, dtype=np.uint64), np.asarray(srcs, dtype=np.uint64),
                                np.asarray(sizes, dtype=np.uint64)])
        n = len(table) // 3
        key = (device, id(stream))
        cap, scratch = self._scratch.get(key, (0, 0))
        if cap < table.nbytes:
            if scratch:
                self._check(self.rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
                self._check(self.rt.cudaFree(scratch), "cudaFree")
            cap = max(table.nbytes, 1 << 16)
            scratch = int(self._check(self.rt.cudaMalloc(cap), "cudaMalloc(scratch)"))
            self._scratch[key] = (cap, scratch)
        # pageable source: the runtime copies it out before returning, so ``table`` may go
        self._check(self.rt.cudaMemcpyAsync(scratch, table.ctypes.data, table.nbytes,
                                            self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream),
                    "cudaMemcpyAsync(copy table)")
        args: list[np.ndarray] = [np.array([scratch], dtype=np.uint64), np.array([scratch + 8 * n], dtype=np.uint64),
                np.array([scratch + 16 * n], dtype=np.uint64), np.array([n], dtype=np.uint32)]
        ptrs = np.array([a.ctypes.data for a in args], dtype=np.uint64)
        self._check(self.drv.cuLaunchKernel(fn, n, 1, 1, 256, 1, 1, 0, stream, ptrs.ctypes.data, 0),
                    f"cuLaunchKernel(mc_scatter_copy, {n} copies)")
        self._kernel = True

    def new_stream(self, device: int) -> Any:
        self.set_device(device)
        s = self._check(self.rt.cudaStreamCreateWithFlags(self.rt.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")
        return (device, s)

    def synchronize(self, stream: Any) -> None:
        self._check(self.rt.cudaStreamSynchronize(stream[1]), "cudaStreamSynchronize")

    def alloc_pinned(self, n: int) -> int:
        flags = self.rt.cudaHostAllocPortable | self.rt.cudaHostAllocMapped  # kernels reach it too (UVA)
        return int(self._check(self.rt.cudaHostAlloc(n, flags), f"cudaHostAlloc({n})"))

    def free_pinned(self, addr: int) -> None:
        self._check(self.rt.cudaFreeHost(addr), "cudaFreeHost")

    def device_of(self, addr: int) -> int | None:
        try:
            attrs = self._check(self.rt.cudaPointerGetAttributes(addr), "cudaPointerGetAttributes")
        except CudaError:
            return None
        if attrs.type == self.rt.cudaMemoryType.cudaMemoryTypeDevice:
            return int(attrs.device)
        return None

    # ------------------------------------------------------------------ IPC
    def allocation_of(self, addr: int) -> tuple[int, int]:
        """(base, size) of the cudaMalloc allocation holding ``addr`` (IPC exports whole allocations)."""
        base, size = self._check(self.drv.cuMemGetAddressRange(addr), "cuMemGetAddressRange")
        return int(base), int(size)

    def ipc_export(self, base: int) -> bytes:
        h = self._check(self.rt.cudaIpcGetMemHandle(base), f"cudaIpcGetMemHandle({base:#x})")
        return ctypes.string_at(h.getPtr(), IPC_HANDLE_BYTES)

    def ipc_open(self, handle: bytes, device: int) -> int:
        if len(handle) != IPC_HANDLE_BYTES:
            raise CudaError(f"an IPC handle is {IPC_HANDLE_BYTES} bytes, got {len(handle)}")
        self.set_device(device)
        h = self.rt.cudaIpcMemHandle_t()
        ctypes.memmove(h.getPtr(), handle, IPC_HANDLE_BYTES)
        return int(self._check(self.rt.cudaIpcOpenMemHandle(h, self.rt.cudaIpcMemLazyEnablePeerAccess),
                               "cudaIpcOpenMemHandle"))

    def ipc_close(self, ptr: int) -> None:
        self._check(self.rt.cudaIpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle")
