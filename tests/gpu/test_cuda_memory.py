"""GPU memory in the Transfer Engine, on a real GPU (skipped elsewhere, naming the missing GPU).

Two processes on one GPU (CUDA IPC), the tcp path with device memory on both ends (pinned
staging on both sides), the in-process transport, registration (``cuda:0`` and ``*``
auto-detect), out-of-bounds refusals, a peer killed mid-transfer, IPC mappings closed when the
peer unregisters, and a vLLM-style layer set (32 layers x K/V x 512 blocks x 16 KiB) moved byte-exact.
Run: ``python -m pytest tests/gpu -q`` on a machine with a CUDA GPU and cuda-python.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from mooncake_core.transfer.cuda.runtime import available

pytestmark = [pytest.mark.gpu, pytest.mark.integration,
              pytest.mark.skipif(not available(), reason="needs a CUDA GPU (cuda-python sees none here); "
                                 "run tests/gpu on a GPU machine (docs/gpu.md)")]

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from mooncake_lab.line_peer import LinePeer, spawn_line_peer  # noqa: E402

from gpu_peer import region_bytes  # noqa: E402

MB = 1 << 20


@dataclass
class GpuPeer(LinePeer):
    what: ClassVar[str] = "gpu peer"
    proc: object
    segment: str
    addrs: list[int]
    size: int
    pid: int
    location: str

    def sha(self, i: int, off: int, n: int) -> str:
        return self.cmd(f"sha {i} {off} {n}")


@pytest.fixture
def gpu_peer():
    made: list[GpuPeer] = []

    def start(regions: int = 1, size: int = 4 * MB, seed: int = 7, host: bool = False, zero: bool = False) -> GpuPeer:
        argv = [sys.executable, os.path.join(HERE, "gpu_peer.py"), "--regions", str(regions), "--size", str(size),
                "--seed", str(seed)] + (["--host"] if host else []) + (["--zero"] if zero else [])
        proc, info = spawn_line_peer(argv, GpuPeer.what, env=dict(os.environ))
        p = GpuPeer(proc, info["segment"], info["addrs"], info["size"], info["pid"], info["location"])
        made.append(p)
        return p

    yield start
    for p in made:
        if p.proc.poll() is None:  # type: ignore[attr-defined]
            p.proc.kill()  # type: ignore[attr-defined]
            p.proc.wait()  # type: ignore[attr-defined]


@pytest.fixture
def engine():
    from mooncake_core.engine import TransferEngine
    made = []

    def make():
        e = TransferEngine()
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, e.last_error
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def _torch():
    return pytest.importorskip("torch")


def sha_dev(t) -> str:
    return hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()


def dev_random(n: int, seed: int):
    torch = _torch()
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)).cuda()


def reg(e, t, loc: str = "cuda:0") -> None:
    assert e.register_memory(t.data_ptr(), t.numel() * t.element_size(), loc) == 0, e.last_error


def test_cuda_regions_register_with_their_location_and_star_autodetects(engine) -> None:
    torch = _torch()
    e = engine()
    a = torch.zeros(MB, dtype=torch.uint8, device="cuda")
    b = torch.zeros(MB, dtype=torch.uint8, device="cuda")
    reg(e, a, "cuda:0")
    reg(e, b, "*")
    locs = {addr: loc for addr, _n, loc in e.get_segment_buffers(e.get_local_segment_name())}
    assert locs[a.data_ptr()] == "cuda:0" and locs[b.data_ptr()] == "cuda:0", locs
    assert e.unregister_memory(b.data_ptr()) == 0


def test_in_process_copies_between_host_and_device_any_mix(engine) -> None:
    torch = _torch()
    e1, e2 = engine(), engine()
    src = dev_random(4 * MB, 1)
    host = torch.zeros(4 * MB, dtype=torch.uint8)
    dst = torch.zeros(4 * MB, dtype=torch.uint8, device="cuda")
    reg(e1, src)
    reg(e1, host, "cpu:0")
    reg(e2, dst)
    seg = e2.get_local_segment_name()
    assert e1.transport_for(seg) == "local"
    assert e1.transfer_sync_write(seg, src.data_ptr(), dst.data_ptr(), 4 * MB) == 0, e1.last_error
    assert torch.equal(dst, src)  # on the device
    assert e1.transfer_sync_read(seg, host.data_ptr(), dst.data_ptr(), 4 * MB) == 0, e1.last_error
    assert torch.equal(host, src.cpu())
    host.copy_(torch.from_numpy(np.random.default_rng(2).integers(0, 256, 4 * MB, dtype=np.uint8)))
    assert e1.transfer_sync_write(seg, host.data_ptr(), dst.data_ptr(), 4 * MB) == 0, e1.last_error
    assert torch.equal(dst.cpu(), host)


@pytest.mark.parametrize("hint", ["", "tcp"])
def test_two_processes_single_batch_async_and_bounds(engine, gpu_peer, hint: str) -> None:
    torch = _torch()
    peer = gpu_peer(regions=2, size=4 * MB)
    assert peer.location == "cuda:0"
    e = engine()
    seg = peer.segment
    out = torch.zeros(4 * MB, dtype=torch.uint8, device="cuda")
    src = dev_random(4 * MB, 99)
    reg(e, out)
    reg(e, src)
    if hint == "":
        assert e.transport_for(seg) == "cuda_ipc"
    # single read of region 0, byte-exact against what the peer put there
    assert e.transfer_sync_read(seg, out.data_ptr(), peer.addrs[0], 4 * MB, hint) == 0, e.last_error
    assert torch.equal(out.cpu(), torch.from_numpy(region_bytes(7, 0, 4 * MB)))
    # single write into region 1
    assert e.transfer_sync_write(seg, src.data_ptr(), peer.addrs[1], 4 * MB, hint) == 0, e.last_error
    assert peer.sha(1, 0, 4 * MB) == sha_dev(src)
    # a batch of 64 blocks of 64 KiB, written in reverse order, then read back asynchronously
    bs, nb = 64 << 10, 64
    locs = [src.data_ptr() + i * bs for i in range(nb)]
    rems = [peer.addrs[1] + (nb - 1 - i) * bs for i in range(nb)]
    assert e.batch_transfer_sync_write(seg, locs, rems, [bs] * nb, hint) == 0, e.last_error
    want = torch.cat([src[i * bs:(i + 1) * bs] for i in reversed(range(nb))])
    assert peer.sha(1, 0, nb * bs) == sha_dev(want)
    out.zero_()
    bid = e.batch_transfer_async_read(seg, [out.data_ptr() + i * bs for i in range(nb)], rems, [bs] * nb, hint)
    assert bid > 0 and e.get_batch_transfer_status([bid]) == 0, e.last_error
    assert torch.equal(out[:nb * bs], src[:nb * bs])
    # out of bounds: refused whole, nothing written
    before = peer.sha(1, 0, 4 * MB)
    assert e.transfer_sync_write(seg, src.data_ptr(), peer.addrs[1] + 4 * MB - 16, 32, hint) < 0
    assert "outside" in e.last_error and peer.sha(1, 0, 4 * MB) == before


def test_host_memory_to_a_gpu_peer_and_gpu_memory_to_a_host_peer(engine, gpu_peer) -> None:
    torch = _torch()
    gpu = gpu_peer(regions=1, size=4 * MB, seed=3)
    host_peer = gpu_peer(regions=1, size=4 * MB, seed=5, host=True)
    e = engine()
    h = torch.from_numpy(np.random.default_rng(4).integers(0, 256, 4 * MB, dtype=np.uint8))
    d = dev_random(4 * MB, 6)
    reg(e, h, "cpu:0")
    reg(e, d)
    # our host memory into its GPU (cuda_ipc: cudaMemcpy from pageable host)
    assert e.transfer_sync_write(gpu.segment, h.data_ptr(), gpu.addrs[0], 4 * MB) == 0, e.last_error
    assert gpu.sha(0, 0, 4 * MB) == hashlib.sha256(h.numpy().tobytes()).hexdigest()
    # our GPU memory into a host-only peer (cma or tcp, staged here)
    assert e.transfer_sync_write(host_peer.segment, d.data_ptr(), host_peer.addrs[0], 4 * MB) == 0, e.last_error
    assert host_peer.sha(0, 0, 4 * MB) == sha_dev(d)
    d.zero_()
    assert e.transfer_sync_read(host_peer.segment, d.data_ptr(), host_peer.addrs[0], 4 * MB) == 0, e.last_error
    assert host_peer.sha(0, 0, 4 * MB) == sha_dev(d)


def test_ipc_mappings_are_closed_when_the_peer_unregisters(engine, gpu_peer) -> None:
    torch = _torch()
    peer = gpu_peer(regions=2, size=MB)
    e = engine()
    out = torch.zeros(MB, dtype=torch.uint8, device="cuda")
    reg(e, out)
    for i in (0, 1):
        assert e.transfer_sync_read(peer.segment, out.data_ptr(), peer.addrs[i], MB) == 0, e.last_error
    ipc = next(t for t in e._transports if t.name == "cuda_ipc")
    assert ipc.open_handles(peer.segment) == 2
    assert peer.cmd("unregister 1") == "0"
    # like an RDMA key, a mapping is one-sided: the initiator learns of the unregistration when it
    # re-reads the peer's descriptor (here explicitly; the engine does on a bounds miss or a peer error)
    assert [a for a, _n, _loc in e.get_segment_buffers(peer.segment)] == peer.addrs[:1]
    assert e.transfer_sync_read(peer.segment, out.data_ptr(), peer.addrs[1], MB) < 0  # gone: refused
    assert e.transfer_sync_read(peer.segment, out.data_ptr(), peer.addrs[0], MB) == 0, e.last_error
    assert ipc.open_handles(peer.segment) == 1


def test_a_peer_killed_mid_transfer_is_an_error_within_the_timeout(engine, gpu_peer, monkeypatch) -> None:
    torch = _torch()
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "5")
    n = 1 << 30
    peer = gpu_peer(regions=1, size=n, zero=True)
    e = engine()
    src = torch.zeros(n, dtype=torch.uint8, device="cuda")
    reg(e, src)
    bs = 4 * MB
    bid = e.batch_transfer_async_write(peer.segment, [src.data_ptr() + o for o in range(0, n, bs)],
                                       [peer.addrs[0] + o for o in range(0, n, bs)], [bs] * (n // bs), "tcp")
    assert bid > 0
    time.sleep(0.05)
    peer.proc.kill()  # type: ignore[attr-defined]
    t0 = time.monotonic()
    done = threading.Event()
    rc: list[int] = []
    threading.Thread(target=lambda: (rc.append(e.get_batch_transfer_status([bid])), done.set()), daemon=True).start()
    assert done.wait(30), "the transfer hung after its peer was killed"
    assert time.monotonic() - t0 < 5 + n / (1 << 30) + 5
    assert rc and rc[0] != 0  # an error (unless it had finished before the kill)


@pytest.mark.parametrize("hint", ["", "tcp"])
def test_vllm_style_layer_set_byte_exact(engine, gpu_peer, hint: str) -> None:
    # 32 layers x (K, V) x 512 blocks x 16 KiB = 512 MiB; the peer's 64 layer tensors are separate
    # allocations, blocks go to a shuffled set of block slots (one batch of 32,768 requests)
    torch = _torch()
    layers, blocks, bs = 64, 512, 16 << 10
    size = blocks * bs
    peer = gpu_peer(regions=layers, size=size, zero=True)
    e = engine()
    local = [dev_random(size, 1000 + i) for i in range(layers)]
    for t in local:
        reg(e, t)
    perm = np.random.default_rng(0).permutation(blocks)
    locs, rems = [], []
    for i, t in enumerate(local):
        for b in range(blocks):
            locs.append(t.data_ptr() + b * bs)
            rems.append(peer.addrs[i] + int(perm[b]) * bs)
    t0 = time.perf_counter()
    assert e.batch_transfer_sync_write(peer.segment, locs, rems, [bs] * len(locs), hint) == 0, e.last_error
    dt = time.perf_counter() - t0
    inv = torch.from_numpy(np.argsort(perm)).cuda()
    for i in (0, 17, layers - 1):
        want = local[i].view(blocks, bs)[inv].reshape(-1)
        assert peer.sha(i, 0, size) == sha_dev(want), f"layer tensor {i}"
    print(f"layer set {layers * size / MB:.0f} MiB via {hint or 'auto'}: {dt * 1e3:.1f} ms")
