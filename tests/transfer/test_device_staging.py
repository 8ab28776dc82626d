"""GPU memory's host side, on CPU: ``cuda:N`` regions with the host copier of
``device_memory`` (real memmoves), so the staging pipeline, the rpc server's staged path and the
in-process copies move real bytes over real sockets. The CUDA copier and CUDA IPC are tested on a
GPU machine (tests/gpu/, skipped here naming the missing GPU)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mooncake_core.transfer import device_memory, staging
from mooncake_core.transfer.base import TransferOpcode, TransferRequest

W, R = TransferOpcode.WRITE, TransferOpcode.READ


# ---------------------------------------------------------------------- pure packing
def test_pack_cuts_and_packs_within_the_buffer() -> None:
    reqs = [TransferRequest(W, 1000, 5000, 10), TransferRequest(W, 2000, 6000, 25), TransferRequest(W, 3000, 7000, 3)]
    batches = staging.pack(reqs, 16)
    assert [sum(p.length for p in b) for b in batches] == [16, 16, 6]
    for b in batches:  # pieces sit end to end in the buffer
        assert [p.offset for p in b] == list(np.cumsum([0] + [p.length for p in b[:-1]]))
    flat = [p for b in batches for p in b]
    # every byte of every request exactly once, in order, local and remote moving together
    assert [(p.local_addr, p.remote_addr, p.length) for p in flat] == [
        (1000, 5000, 10), (2000, 6000, 6), (2006, 6006, 16), (2022, 6022, 3), (3000, 7000, 3)]
    assert staging.pack([], 16) == [] and staging.pack([TransferRequest(W, 1, 1, 0)], 16) == []
    with pytest.raises(ValueError, match="size"):
        staging.pack(reqs, 0)


class FailingCopier(device_memory.HostCopier):
    """Copies until ``fail_after`` copies, then raises as a CUDA error would."""

    def __init__(self, fail_after: int) -> None:
        super().__init__("cuda")
        self.fail_after = fail_after

    def copy(self, dst: int, src: int, n: int) -> None:
        if self.copies >= self.fail_after:
            raise RuntimeError("cudaMemcpyAsync failed: an illegal memory access was encountered")
        super().copy(dst, src, n)


@pytest.fixture
def host_device():
    """The host copier installed for kind "cuda" (what the cuda plugin installs on a GPU)."""
    c = device_memory.HostCopier("cuda")
    device_memory.install_copier("cuda", c)
    yield c
    device_memory.uninstall_copier("cuda")


def test_staged_run_moves_every_byte_through_rotating_buffers(host_device, monkeypatch) -> None:
    # A host "transport" that records each batch: the staging buffers rotate and the bytes that
    # arrive are the device bytes, each at its own remote address.
    rng = np.random.default_rng(1)
    dev = rng.integers(0, 256, 1 << 16, dtype=np.uint8)
    remote = np.zeros_like(dev)
    device_memory.add_range(dev.ctypes.data, dev.nbytes, "cuda", 0)
    try:
        sizes = rng.integers(1, 3000, 40)
        offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        reqs = [TransferRequest(W, dev.ctypes.data + int(o), remote.ctypes.data + int(o), int(n))
                for o, n in zip(offs, sizes)]
        bufs: list[int] = []

        class Recorder:
            name = "rec"

            def transfer(self, desc, batch, deadline):
                bufs.append(min(r.local_addr for r in batch))
                for r in batch:
                    device_memory.copy_any(r.remote_addr, r.local_addr, r.length)  # host -> host here

        staging.run_staged(Recorder(), None, reqs, 0.0, size=4096)  # type: ignore[arg-type]
        end = int(offs[-1] + sizes[-1])
        assert np.array_equal(remote[:end], dev[:end])
        # one send per buffer's worth, through three buffers (two on the wire, one being filled)
        assert len(bufs) == -(-end // 4096) and len(set(bufs)) == staging.IN_FLIGHT + 1
        assert host_device.copies > 0
    finally:
        device_memory.remove_range(dev.ctypes.data)


# ---------------------------------------------------------------------- real engines, real sockets


def _engines(engine_factory, dev_bytes: int):
    """A target with a device region and an initiator with a device and a host buffer."""
    rng = np.random.default_rng(7)
    target = engine_factory("P2PHANDSHAKE")
    init = engine_factory("P2PHANDSHAKE")
    tdev = np.zeros(dev_bytes, dtype=np.uint8)
    idev = rng.integers(0, 256, dev_bytes, dtype=np.uint8)
    ihost = rng.integers(0, 256, dev_bytes, dtype=np.uint8)
    assert target.register_memory(tdev.ctypes.data, tdev.nbytes, "cuda:0") == 0, target.last_error
    assert init.register_memory(idev.ctypes.data, idev.nbytes, "cuda:0") == 0, init.last_error
    assert init.register_memory(ihost.ctypes.data, ihost.nbytes, "cpu:0") == 0, init.last_error
    return target, init, tdev, idev, ihost


@pytest.mark.integration
@pytest.mark.parametrize("hint", ["tcp", ""])
def test_device_regions_both_ends_byte_exact(host_device, engine_factory, monkeypatch, hint: str) -> None:
    # tcp: the initiator stages its device buffer, the target's rpc server stages into its device
    # region (several chunks each: 64 KiB buffers); "": the in-process transport copies directly.
    monkeypatch.setenv("MC_DEVICE_STAGING_BYTES", str(64 << 10))
    n = 1 << 20
    target, init, tdev, idev, ihost = _engines(engine_factory, n)
    seg = target.get_local_segment_name()
    assert init.transfer_sync_write(seg, idev.ctypes.data, tdev.ctypes.data, n, hint) == 0, init.last_error
    assert np.array_equal(tdev, idev)
    if hint == "tcp":
        assert init.transport_for(seg) in ("local", "tcp")
    before = host_device.copies
    back = np.zeros(n, dtype=np.uint8)
    assert init.register_memory(back.ctypes.data, n, "cuda:0") == 0
    assert init.transfer_sync_read(seg, back.ctypes.data, tdev.ctypes.data, n, hint) == 0, init.last_error
    assert np.array_equal(back, idev) and host_device.copies > before
    # a batch mixing host and device local buffers, many small blocks, writes then reads
    blocks = 300
    bs = n // blocks
    offs = [i * bs for i in range(blocks)]
    src = [(ihost if i % 3 else idev).ctypes.data + o for i, o in enumerate(offs)]
    assert init.batch_transfer_sync_write(seg, src, [tdev.ctypes.data + o for o in offs], [bs] * blocks, hint) == 0
    want = np.concatenate([(ihost if i % 3 else idev)[o:o + bs] for i, o in enumerate(offs)])
    assert np.array_equal(tdev[:blocks * bs], want)
    back[:] = 0
    assert init.batch_transfer_sync_read(seg, [back.ctypes.data + o for o in offs],
                                         [tdev.ctypes.data + o for o in offs], [bs] * blocks, hint) == 0
    assert np.array_equal(back[:blocks * bs], want)


@pytest.mark.integration
def test_async_batches_and_out_of_bounds_on_device_regions(host_device, engine_factory, monkeypatch) -> None:
    monkeypatch.setenv("MC_DEVICE_STAGING_BYTES", str(16 << 10))
    n = 256 << 10
    target, init, tdev, idev, _ = _engines(engine_factory, n)
    seg = target.get_local_segment_name()
    bid = init.batch_transfer_async_write(seg, [idev.ctypes.data], [tdev.ctypes.data], [n], "tcp")
    assert bid > 0
    rc = init.get_batch_transfer_status([bid])
    assert rc == 0 and np.array_equal(tdev, idev)
    # past the end of the target's device region: refused whole, target bytes untouched
    tdev[:] = 9
    assert init.transfer_sync_write(seg, idev.ctypes.data, tdev.ctypes.data + n - 10, 20, "tcp") < 0
    assert "outside" in init.last_error and (tdev == 9).all()


@pytest.mark.integration
def test_a_device_failure_at_the_target_is_an_error_not_a_hang(engine_factory, monkeypatch) -> None:
    # The target's copier fails mid-transfer: the initiator gets an error within its timeout, and
    # the target keeps serving (a later transfer with a working copier succeeds).
    import time

    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "5")
    monkeypatch.setenv("MC_DEVICE_STAGING_BYTES", str(16 << 10))
    bad = FailingCopier(fail_after=3)
    device_memory.install_copier("cuda", bad)
    try:
        n = 256 << 10
        target, init, tdev, idev, ihost = _engines(engine_factory, n)
        seg = target.get_local_segment_name()
        t0 = time.monotonic()
        rc = init.transfer_sync_write(seg, ihost.ctypes.data, tdev.ctypes.data, n, "tcp")
        assert rc < 0 and time.monotonic() - t0 < 5.0, init.last_error
        bad.fail_after = 10 ** 9
        done = threading.Event()
        rc2: list[int] = []
        threading.Thread(target=lambda: (rc2.append(init.transfer_sync_write(
            seg, ihost.ctypes.data, tdev.ctypes.data, n, "tcp")), done.set()), daemon=True).start()
        assert done.wait(10) and rc2 == [0], init.last_error
        assert np.array_equal(tdev, ihost)
    finally:
        device_memory.uninstall_copier("cuda")


@pytest.mark.integration
def test_device_ranges_leave_with_their_engine(host_device, engine_factory) -> None:
    target, init, tdev, idev, _ = _engines(engine_factory, 4096)
    assert device_memory.find(tdev.ctypes.data) is not None
    assert target.unregister_memory(tdev.ctypes.data) == 0
    assert device_memory.find(tdev.ctypes.data) is None
    init.close()
    assert device_memory.find(idev.ctypes.data) is None and not device_memory.active()


def test_device_memory_without_a_copier_is_refused_naming_the_plugin(engine_factory) -> None:
    eng = engine_factory("P2PHANDSHAKE")
    buf = np.ones(4096, dtype=np.uint8)
    assert eng.register_memory(buf.ctypes.data, 4096, "cuda:0") == -1
    assert "cuda plugin" in eng.last_error and not device_memory.active()


def test_a_bad_device_number_is_refused_and_nothing_stays_registered(host_device, engine_factory) -> None:
    eng = engine_factory("P2PHANDSHAKE")
    buf = np.ones(4096, dtype=np.uint8)
    assert eng.register_memory(buf.ctypes.data, 4096, "cuda:x") == -1
    assert "device number" in eng.last_error and not device_memory.active()
    assert eng.register_memory(buf.ctypes.data, 4096, "cuda:1") == 0  # the range was not left behind
    assert device_memory.find(buf.ctypes.data).device == 1
