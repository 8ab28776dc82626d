"""GPU memory through the UCX transport (``protocol="rdma"``), on a real GPU (skipped elsewhere,
naming what is missing): ``cuda:N`` regions ``ucp_mem_map``-ed, moved by UCX's cuda lanes
(cuda_copy / cuda_ipc on one host; GPUDirect RDMA on an RDMA host) with no pinned-host staging.

Two processes on one GPU, forced onto UCX with ``transport_hint="rdma"`` (the cuda IPC transport
would win on priority): device -> device write and read, host -> device write, byte-exact.
Run: ``python -m pytest tests/gpu -q`` on a GPU machine with the libucx wheel (``.whl/``,
docs/gpu.md) or another UCX built with CUDA.
"""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np
import pytest

from mooncake_core.transfer.cuda.runtime import available

from mooncake_lab.line_peer import spawn_line_peer

from gpu_peer import region_bytes  # tests/gpu on sys.path (pytest's rootdir-relative import)

HERE = os.path.dirname(os.path.abspath(__file__))

MB = 1 << 20


def _ucx_cuda() -> str | None:
    """None when UCX is here with a cuda lane; else what is missing."""
    if not available():
        return "needs a CUDA GPU (cuda-python sees none here); run tests/gpu on a GPU machine (docs/gpu.md)"
    from mooncake_core.transfer.base import TransportContext
    from mooncake_core.transfer.memory import RegionTable
    from mooncake_core.transfer.ucx.transport import UcxTransport
    t = UcxTransport(TransportContext(lambda: "probe", RegionTable(), protocol="rdma"))
    try:
        if not t.active:
            return "no UCX library here: pip install libucx-cu13 (or carry its wheel in .whl/)"
        if not t.capabilities.serves("cuda:0"):
            return f"this UCX found no cuda lane (lanes: {sorted({r.lane for r in t.lanes})})"
        return None
    finally:
        t.close()


_MISSING = _ucx_cuda() if available() else "needs a CUDA GPU (cuda-python sees none here)"
pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.skipif(_MISSING is not None,
                                                                           reason=str(_MISSING))]


def test_cuda_memory_through_ucx_between_two_processes_byte_exact():
    torch = pytest.importorskip("torch")
    from mooncake_core.engine import TransferEngine

    proc, info = spawn_line_peer([sys.executable, os.path.join(HERE, "gpu_peer.py"), "--size", str(8 * MB),
                                  "--seed", "3", "--protocol", "rdma"], "gpu peer", env=dict(os.environ))
    e = TransferEngine()
    try:
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0, e.last_error
        seg, remote = info["segment"], info["addrs"][0]
        src = torch.from_numpy(np.random.default_rng(5).integers(0, 256, 8 * MB, dtype=np.uint8)).cuda()
        dst = torch.zeros(8 * MB, dtype=torch.uint8, device="cuda")
        host = torch.from_numpy(np.random.default_rng(6).integers(0, 256, 8 * MB, dtype=np.uint8))
        for t, loc in ((src, "cuda:0"), (dst, "cuda:0"), (host, "cpu:0")):
            assert e.register_memory(t.data_ptr(), t.numel(), loc) == 0, e.last_error

        def peer_sha() -> str:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(f"sha 0 0 {8 * MB}\n")
            proc.stdin.flush()
            return proc.stdout.readline().strip()

        assert peer_sha() == hashlib.sha256(region_bytes(3, 0, 8 * MB).tobytes()).hexdigest()
        assert e.transfer_sync_write(seg, src.data_ptr(), remote, 8 * MB, "rdma") == 0, e.last_error
        assert peer_sha() == hashlib.sha256(src.cpu().numpy().tobytes()).hexdigest()
        assert e.transfer_sync_read(seg, dst.data_ptr(), remote, 8 * MB, "rdma") == 0, e.last_error
        assert torch.equal(dst, src)
        blocks = 256
        locs = [host.data_ptr() + i * 32768 for i in range(blocks)]
        rems = [remote + i * 32768 for i in range(blocks)]
        assert e.batch_transfer_sync_write(seg, locs, rems, [32768] * blocks, "rdma") == 0, e.last_error
        assert peer_sha() == hashlib.sha256(host.numpy().tobytes()).hexdigest()
    finally:
        e.close()
        proc.kill()
        proc.wait()
