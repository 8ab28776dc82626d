"""Two OS processes exchange random data, verified byte for byte, for every transport and
every metadata backend: single, batch of 100, async + status polling, write and read."""

from __future__ import annotations

import time

import numpy as np
import pytest

from mooncake_core.engine import TransferEngine
from mooncake_core.utils.net import free_port
from mooncake_lab.te_helpers import sha

pytestmark = pytest.mark.integration

PEER_SIZE = 4 << 20


def _exchange(eng: TransferEngine, target: str, peer_addr: int, size: int, expected: np.ndarray,
              remote_sha, hint: str) -> None:
    """Run every operation kind against ``target``; ``remote_sha(off, len)`` checks the target."""
    rng = np.random.default_rng(12345)
    model = expected.copy()  # what the target's memory must contain
    src = rng.integers(0, 256, size, dtype=np.uint8)
    dst = np.zeros(size, dtype=np.uint8)
    assert eng.register_memory(src.ctypes.data, size, "cpu:0") == 0
    assert eng.register_memory(dst.ctypes.data, size, "cpu:0") == 0
    try:
        # single read of the untouched target: equals the data the peer generated itself
        assert eng.transfer_sync_read(target, dst.ctypes.data, peer_addr, size, hint) == 0, eng.last_error
        assert np.array_equal(dst, model)

        # single write, unaligned, multi-slice; then read it back
        off, n = 1234, 3 * (1 << 20) + 77
        assert eng.transfer_sync_write(target, src.ctypes.data + off, peer_addr + off, n, hint) == 0, eng.last_error
        model[off:off + n] = src[off:off + n]
        assert remote_sha(off, n) == sha(src[off:off + n])
        dst[:] = 0
        assert eng.transfer_sync_read(target, dst.ctypes.data, peer_addr + off, n, hint) == 0
        assert np.array_equal(dst[:n], src[off:off + n])

        # batch of 100 scattered writes (4 KiB .. 12 KiB), then batch read into other places
        src[:] = rng.integers(0, 256, size, dtype=np.uint8)
        offs = [i * 40000 + int(rng.integers(0, 1000)) for i in range(100)]
        lens = [int(rng.integers(4096, 12288)) for _ in range(100)]
        assert eng.batch_transfer_sync_write(target, [src.ctypes.data + o for o in offs],
                                             [peer_addr + o for o in offs], lens, hint) == 0, eng.last_error
        for o, ln in zip(offs, lens):
            model[o:o + ln] = src[o:o + ln]
        assert remote_sha(0, size) == sha(model)
        dst[:] = 0
        assert eng.batch_transfer_sync_read(target, [dst.ctypes.data + o for o in offs],
                                            [peer_addr + o for o in offs], lens, hint) == 0
        for o, ln in zip(offs, lens):
            assert np.array_equal(dst[o:o + ln], model[o:o + ln])

        # async batch write + polling transfer_check_status
        src[:] = rng.integers(0, 256, size, dtype=np.uint8)
        bid = eng.batch_transfer_async_write(target, [src.ctypes.data + o for o in offs],
                                             [peer_addr + o for o in offs], lens, hint)
        assert bid > 0, eng.last_error
        deadline = time.monotonic() + 20
        while (st := eng.transfer_check_status(bid)) == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert st == 1
        for o, ln in zip(offs, lens):
            model[o:o + ln] = src[o:o + ln]
        assert remote_sha(0, size) == sha(model)

        # async batch read + get_batch_transfer_status, and transfer_submit_write
        dst[:] = 0
        b1 = eng.batch_transfer_async_read(target, [dst.ctypes.data + o for o in offs],
                                           [peer_addr + o for o in offs], lens, hint)
        b2 = eng.transfer_submit_write(target, src.ctypes.data, peer_addr + size - 5000, 5000, hint)
        assert b1 > 0 and b2 > 0
        assert eng.get_batch_transfer_status([b1]) == 0
        for o, ln in zip(offs, lens):
            assert np.array_equal(dst[o:o + ln], model[o:o + ln])
        deadline = time.monotonic() + 20
        while (st := eng.transfer_check_status(b2)) == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert st == 1
        model[size - 5000:] = src[:5000]
        assert remote_sha(0, size) == sha(model)
    finally:
        eng.unregister_memory(src.ctypes.data)
        eng.unregister_memory(dst.ctypes.data)


def _metadata(kind: str, request) -> str:
    if kind == "p2p":
        return "P2PHANDSHAKE"
    if kind == "http":
        return request.getfixturevalue("http_metadata")
    if kind == "etcd":
        return "etcd://" + request.getfixturevalue("etcd_endpoint")
    return "redis://" + request.getfixturevalue("redis_endpoint")


@pytest.mark.parametrize("transport", ["tcp", "cma"])
@pytest.mark.parametrize("backend", ["p2p", "http", "etcd", "redis"])
def test_two_processes(backend, transport, request, start_peer, engine_factory):
    md = _metadata(backend, request)
    host = "127.0.0.1" if backend == "p2p" else f"127.0.0.1:{free_port()}"
    peer = start_peer(md, size=PEER_SIZE, seed=hash((backend, transport)) & 0xFFFF, hostname=host)
    eng = engine_factory(md, "127.0.0.1" if backend == "p2p" else f"127.0.0.1:{free_port()}")
    auto = eng.transport_for(peer.segment)
    assert auto == "cma", "same-host peers must pick cross-memory attach automatically"
    hint = "tcp" if transport == "tcp" else ""
    _exchange(eng, peer.segment, peer.addr, peer.size, peer.expected(), peer.sha, hint)


def test_in_process(http_metadata):
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize(f"127.0.0.1:{free_port()}", http_metadata, "tcp", "") == 0
    assert b.initialize(f"127.0.0.1:{free_port()}", http_metadata, "tcp", "") == 0
    try:
        target = np.random.default_rng(3).integers(0, 256, PEER_SIZE, dtype=np.uint8)
        assert b.register_memory(target.ctypes.data, PEER_SIZE) == 0
        seg = b.get_local_segment_name()
        assert a.transport_for(seg) == "local"
        _exchange(a, seg, target.ctypes.data, PEER_SIZE, target.copy(),
                  lambda o, n: sha(target[o:o + n]), "")
    finally:
        a.close()
        b.close()


def test_force_tcp_env(monkeypatch, start_peer, engine_factory):
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    peer = start_peer("P2PHANDSHAKE", size=PEER_SIZE, seed=5)
    eng = engine_factory("P2PHANDSHAKE")
    assert eng.transport_for(peer.segment) == "tcp"
    _exchange(eng, peer.segment, peer.addr, peer.size, peer.expected(), peer.sha, "")
