"""Torch tensors, managed buffers, notifications, descriptor refresh, metrics."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from mooncake_core.engine import TransferEngine, TransferNotify, TransferOpcode
from mooncake_core.utils.net import free_port
from mooncake_lab.te_helpers import sha

pytestmark = pytest.mark.integration

MB = 1 << 20


@pytest.mark.parametrize("hint", ["tcp", ""])
def test_torch_tensor_registration(hint, start_peer, engine_factory):
    torch = pytest.importorskip("torch")
    peer = start_peer("P2PHANDSHAKE", size=MB, seed=11)
    eng = engine_factory("P2PHANDSHAKE")
    g = torch.Generator().manual_seed(0)
    t = torch.randn(MB // 4, generator=g, dtype=torch.float32)  # 1 MiB of floats
    out = torch.zeros_like(t)
    for x in (t, out):
        assert eng.register_memory(x.data_ptr(), x.numel() * x.element_size(), "cpu:0") == 0
    assert eng.transfer_sync_write(peer.segment, t.data_ptr(), peer.addr, MB, hint) == 0
    assert peer.sha(0, MB) == sha(t.numpy())
    assert eng.transfer_sync_read(peer.segment, out.data_ptr(), peer.addr, MB, hint) == 0
    assert torch.equal(out, t)


def test_gpu_location_refused_cleanly(engine_factory):
    eng = engine_factory("P2PHANDSHAKE")
    buf = np.ones(4096, dtype=np.uint8)
    assert eng.register_memory(buf.ctypes.data, 4096, "cuda:0") == -1
    assert "cuda" in eng.last_error


def test_managed_buffers(start_peer, engine_factory, http_metadata):
    peer = start_peer("P2PHANDSHAKE", size=4 * MB, seed=12)
    eng = engine_factory("P2PHANDSHAKE")
    assert eng.allocate_managed_buffer(0) == 0
    addrs = [eng.allocate_managed_buffer(n) for n in (1000, 4096, 3 * MB)]
    assert all(a > 0 for a in addrs) and len(set(addrs)) == 3
    rng = np.random.default_rng(5)
    payloads = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (1000, 4096, 3 * MB)]
    for a, p in zip(addrs, payloads):
        assert eng.write_bytes_to_buffer(a, p, len(p)) == 0
        assert eng.read_bytes_from_buffer(a, len(p)) == p
    # managed buffers are registered: they move to a peer and back over every transport
    assert eng.batch_transfer_sync_write(peer.segment, addrs, [peer.addr, peer.addr + MB // 2, peer.addr + MB],
                                         [1000, 4096, 3 * MB], "tcp") == 0
    assert peer.sha(MB, 3 * MB) == sha(np.frombuffer(payloads[2], dtype=np.uint8))
    assert peer.sha(0, 1000) == sha(np.frombuffer(payloads[0], dtype=np.uint8))
    for a, n in zip(addrs, (1000, 4096, 3 * MB)):
        eng.write_bytes_to_buffer(a, b"\0" * n, n)
    assert eng.transfer_sync_read(peer.segment, addrs[2], peer.addr + MB, 3 * MB) == 0  # cma
    assert eng.read_bytes_from_buffer(addrs[2], 3 * MB) == payloads[2]
    # a big one gets its own chunk; freeing then allocating reuses space
    big = eng.allocate_managed_buffer(100 * MB)
    assert big > 0 and eng.free_managed_buffer(big, 100 * MB) == 0
    assert eng.free_managed_buffer(addrs[1], 4096) == 0
    again = eng.allocate_managed_buffer(4096)
    assert again == addrs[1]
    assert eng.free_managed_buffer(12345, 10) == -1
    # write_bytes_to_buffer refuses unregistered memory
    assert eng.write_bytes_to_buffer(12345, b"xx", 2) == -1


def test_notify_and_descriptor_refresh(start_peer, engine_factory):
    peer = start_peer("P2PHANDSHAKE", size=MB, seed=13)
    eng = engine_factory("P2PHANDSHAKE")
    buf = np.random.default_rng(6).integers(0, 256, 2 * MB, dtype=np.uint8)
    assert eng.register_memory(buf.ctypes.data, buf.nbytes) == 0
    assert eng.get_first_buffer_address(peer.segment) == peer.addr
    assert eng.transfer_sync(peer.segment, buf.ctypes.data, peer.addr, 4096, TransferOpcode.WRITE,
                             TransferNotify("kv-ready", "req-42")) == 0
    assert eng.batch_transfer_sync(peer.segment, [buf.ctypes.data], [peer.addr], [8],
                                   TransferEngine.TransferOpcode.Write, TransferNotify("b", "2")) == 0
    assert json.loads(peer.cmd("notifies")) == [["kv-ready", "req-42"], ["b", "2"]]
    assert json.loads(peer.cmd("notifies")) == []
    # the peer registers more memory after we cached its descriptor: cma refreshes on a miss
    assert eng.transport_for(peer.segment) == "cma"
    extra = int(peer.cmd(f"reg {2 * MB} 99"))
    assert extra > 0
    assert eng.transfer_sync_write(peer.segment, buf.ctypes.data, extra, 2 * MB) == 0
    assert eng.transfer_sync_read(peer.segment, buf.ctypes.data, peer.addr, MB) == 0
    assert sha(buf[:MB]) == peer.sha(0, MB)


def test_metrics_endpoint(engine_factory):
    port = free_port()
    a = TransferEngine()
    assert a.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "tcp", "", "p2p", metrics_port=port) == 0
    b = engine_factory("P2PHANDSHAKE")
    try:
        src = np.random.default_rng(1).integers(0, 256, MB, dtype=np.uint8)
        dst = np.zeros(MB, dtype=np.uint8)
        a.register_memory(src.ctypes.data, MB)
        b.register_memory(dst.ctypes.data, MB)
        assert a.transfer_sync_write(b.get_local_segment_name(), src.ctypes.data, dst.ctypes.data, MB, "tcp") == 0
        assert np.array_equal(src, dst)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        line = [ln for ln in text.splitlines()
                if ln.startswith('mooncake_te_bytes_total{op="write",transport="tcp"}')]
        assert line and float(line[0].split()[-1]) >= MB
        assert "mooncake_te_batch_seconds_bucket" in text
    finally:
        a.close()


def test_api_surface_matches_mooncake():
    names = ["initialize", "initialize_ext", "get_rpc_port", "allocate_managed_buffer", "free_managed_buffer",
             "transfer_sync_write", "transfer_sync_read", "batch_transfer_sync_write",
             "batch_transfer_sync_read", "batch_transfer_async_write", "batch_transfer_async_read",
             "transfer_sync", "batch_transfer_sync", "batch_transfer_async", "get_batch_transfer_status",
             "transfer_submit_write", "transfer_check_status", "write_bytes_to_buffer",
             "read_bytes_from_buffer", "register_memory", "unregister_memory", "batch_register_memory",
             "batch_unregister_memory", "get_local_topology", "get_first_buffer_address", "get_notifies",
             "send_probe"]
    missing = [n for n in names if not callable(getattr(TransferEngine, n, None))]
    assert not missing
    assert int(TransferOpcode.Read) == 0 and int(TransferOpcode.Write) == 1
    assert TransferEngine().transfer_check_status(987654) == -1


def test_metadata_keys_published_and_removed(redis_endpoint, start_peer):
    from mooncake_core.metadata import open_metadata
    md = "redis://" + redis_endpoint
    seg = f"127.0.0.1:{free_port()}"
    peer = start_peer(md, size=MB, seed=21, hostname=seg)
    assert peer.segment == seg
    meta = open_metadata(md)
    try:
        ram = meta.get(f"mooncake/ram/{seg}")
        rpc = meta.get(f"mooncake/rpc_meta/{seg}")
        assert rpc == {"ip_or_host_name": "127.0.0.1", "rpc_port": peer.rpc_port}
        assert ram["version"] == 1 and ram["port"] == peer.rpc_port and ram["pid"] == peer.pid
        assert [(b["addr"], b["length"], b["location"]) for b in ram["buffers"]] == [(peer.addr, MB, "cpu:0")]
        extra = int(peer.cmd(f"reg {MB} 3"))
        ram = meta.get(f"mooncake/ram/{seg}")
        assert [b["addr"] for b in ram["buffers"]] == [peer.addr, extra]
        peer.stop()
        assert meta.get(f"mooncake/ram/{seg}") is None and meta.get(f"mooncake/rpc_meta/{seg}") is None
    finally:
        meta.close()


def test_rdma_protocol_without_ucx_falls_back_loudly(caplog, monkeypatch):
    """No libucp to be had: initialize still works (tcp / same-host), and says why and how to
    get one. (With UCX: tests/transfer/test_ucx.py.)"""
    from mooncake_core.transfer.ucx import library
    monkeypatch.setattr(library, "_loaded", None)
    monkeypatch.setenv("MC_UCX_LIBRARY", "/nonexistent/libucp.so")
    eng = TransferEngine()
    with caplog.at_level("WARNING", logger="mooncake.te"):
        assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0
    try:
        msgs = [r.getMessage() for r in caplog.records if "rdma" in r.getMessage()]
        assert any("tcp" in m and "libucx-cu13" in m and "/nonexistent/libucp.so" in m for m in msgs), msgs
        assert eng.get_rpc_port() > 0 and "cpu:0" in json.loads(eng.get_local_topology())
        # the inert ucx transport is not reported as usable, and the doctor says rdma has no transport
        from mooncake_core.cli.doctor import check_transports
        from mooncake_core.cli.doctor_checks import FAIL
        assert "ucx" not in eng.transport_names() and "tcp" in eng.transport_names()
        got = check_transports(eng, "rdma")
        assert got.status == FAIL and "no RDMA transport" in got.detail, got
    finally:
        eng.close()
    monkeypatch.setattr(library, "_loaded", None)  # the next engine loads the real one again
