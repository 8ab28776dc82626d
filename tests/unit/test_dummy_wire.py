"""The dummy <-> mooncake_client protocol: address translation, failure shapes, frames, staging."""

from __future__ import annotations

import ctypes

import msgspec
import pytest

from mooncake_core.store import dummy_wire as wire
from mooncake_core.store.dummy_codec import Codec, Staged
from mooncake_core.store.types import BufferHandle, QueryTaskResponse, ReplicateConfig, SoftPinAction, TaskStatus


def _regions() -> wire.RegionMap:
    r = wire.RegionMap()
    r.add(0x10000, 0x1000, 0x900000)
    r.add(0x20000, 0x2000, 0x700000)
    return r


def test_region_map_translates_inside_one_region_only() -> None:
    r = _regions()
    assert r.to_local(0x10000, 0x1000) == 0x900000
    assert r.to_local(0x20010, 16) == 0x700010
    assert r.to_dummy(0x700010) == 0x20010
    assert r.to_dummy(0x123) is None
    with pytest.raises(wire.TranslateError, match="runs past the end"):
        r.to_local(0x10ff0, 0x20)
    with pytest.raises(wire.TranslateError, match="not in memory shared"):
        r.to_local(0x15000, 1)
    with pytest.raises(wire.TranslateError, match="non-negative"):
        r.to_local(0x10000, -1)
    with pytest.raises(ValueError, match="overlaps"):
        r.add(0x10800, 0x1000, 0x1)
    assert r.remove(0x10000) == (0x1000, 0x900000)
    with pytest.raises(wire.TranslateError):
        r.to_local(0x10000, 1)


def test_translate_every_layout() -> None:
    r = _regions()
    a = {"key": "k", "buffer_ptr": 0x10010, "size": 16}
    wire.translate_arguments("put_from", a, r.to_local)
    assert a["buffer_ptr"] == 0x900010

    a = {"keys": ["a", "b"], "buffer_ptrs": [0x10000, 0x20000], "sizes": [8, 0x2000]}
    wire.translate_arguments("batch_get_into", a, r.to_local)
    assert a["buffer_ptrs"] == [0x900000, 0x700000]

    a = {"keys": ["a"], "all_buffer_ptrs": [[0x10000, 0x20100]], "all_sizes": [[4, 4]]}
    wire.translate_arguments("batch_put_from_multi_buffers", a, r.to_local)
    assert a["all_buffer_ptrs"] == [[0x900000, 0x700100]]

    # get_into_ranges: the buffer's extent is its furthest dst + size
    a = {"buffer_ptrs": [0x10000], "all_keys": [["a", "b"]], "all_dst_offsets": [[[0, 0xff0], [8]]],
         "all_src_offsets": [[[0, 0], [0]]], "all_sizes": [[[4, 0x10], [4]]]}
    wire.translate_arguments("get_into_ranges", a, r.to_local)
    assert a["buffer_ptrs"] == [0x900000]
    a["buffer_ptrs"] = [0x10000]
    a["all_dst_offsets"] = [[[0, 0xff8], [8]]]
    with pytest.raises(wire.TranslateError, match=r"buffer_ptrs\[0\].*past the end"):
        wire.translate_arguments("get_into_ranges", a, r.to_local)


def test_translate_refuses_what_would_touch_unshared_memory() -> None:
    r = _regions()
    with pytest.raises(wire.TranslateError, match="put_from: buffer_ptr"):
        wire.translate_arguments("put_from", {"buffer_ptr": 0x30000, "size": 1}, r.to_local)
    with pytest.raises(wire.TranslateError, match="2 entries"):
        wire.translate_arguments("batch_put_from", {"buffer_ptrs": [0x10000, 0x10010], "sizes": [1]}, r.to_local)
    with pytest.raises(wire.TranslateError, match="expected a list"):
        wire.translate_arguments("batch_put_from", {"buffer_ptrs": 5, "sizes": [1]}, r.to_local)
    # methods without addresses are left alone
    a = {"key": "k", "value": b"x"}
    wire.translate_arguments("put", a, r.to_local)
    assert a == {"key": "k", "value": b"x"}


def test_failure_values_have_the_full_clients_shapes() -> None:
    assert wire.failure_value("put", ("k", b"v"), -900) == -900
    assert wire.failure_value("get", ("k",), -900) == b""
    assert wire.failure_value("batch_get_into", (["a", "b"], [1, 2], [3, 4]), -900) == [-900, -900]
    assert wire.failure_value("get_batch", (["a", "b", "c"],), -900) == [b""] * 3
    assert wire.failure_value("batch_get_tensor", (["a"],), -900) == [None]
    assert wire.failure_value("put_batch", (["a"], [b"x"]), -900) == -900
    assert wire.failure_value("batch_get_replica_desc", (["a"],), -900) == {}
    assert wire.failure_value("get_into_ranges", ([1], [["a", "b"]], [], [], [[[0, 1], [2]]]), -600) == \
        [[[-600, -600], [-600]]]


def test_frames_round_trip_and_unknown_versions_are_visible() -> None:
    enc = msgspec.msgpack.Encoder()
    dec = msgspec.msgpack.Decoder(wire.Message)  # type: ignore[arg-type]
    for msg in (wire.Challenge(wire.WIRE_VERSION, b"n" * 16, True, "sid"), wire.Attach(2, "c", 7),
                wire.Call("put_from", ["k", 1, 2], {"config": None}), wire.Reply(error=("TypeError", "x"))):
        frame = wire.encode_frame(enc, msg)
        (n,) = wire.HEADER.unpack(frame[:4])
        assert n == len(frame) - 4
        assert wire.decode(dec, frame[4:]) == msg
    assert wire.ipc_name(50052).startswith("\0") and "50052" in wire.ipc_name(50052)


def test_codec_stages_large_values_and_round_trips_types() -> None:
    win = (ctypes.c_char * (1 << 20))()
    sender = Codec((ctypes.addressof(win), len(win)), zero_copy_in=False)
    receiver = Codec((ctypes.addressof(win), len(win)), zero_copy_in=True)
    big = bytes(range(256)) * 1024  # 256 KiB: staged
    small = b"abc"
    staged = sender.stage_value(big)
    assert isinstance(staged, Staged) and staged.length == len(big)
    assert sender.stage_value(small) is small
    assert isinstance(sender.stage_value(small, minimum=1), Staged)
    too_big = bytes(1 << 20)
    assert sender.stage_value(too_big) is too_big  # does not fit what is left: inline
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    cfg.soft_pin_action = SoftPinAction.ENABLE
    msg = wire.Call("put", ["k", staged], {"config": cfg, "h": BufferHandle(b"xyz")})
    got = receiver.dec.decode(sender.enc.encode(msg))
    assert bytes(got.args[1]) == big and isinstance(got.args[1], memoryview)
    assert got.kwargs["config"].replica_num == 2 and got.kwargs["config"].soft_pin_action == SoftPinAction.ENABLE
    assert isinstance(got.kwargs["h"], BufferHandle) and bytes(got.kwargs["h"]) == b"xyz"
    task = QueryTaskResponse((3, 9), 1, 2, 1000, 2000, "client-a", "no room")  # query_task's answer
    back = receiver.dec.decode(sender.enc.encode(wire.Reply((task, 0)))).value
    assert isinstance(back[0], QueryTaskResponse) and back[1] == 0
    assert (back[0].id, back[0].status, back[0].assigned_client, back[0].message) == \
        ((3, 9), TaskStatus.FAILED, "client-a", "no room")


def test_codec_tensors_by_value_and_as_views() -> None:
    torch = pytest.importorskip("torch")
    win = (ctypes.c_char * (1 << 20))()
    a = Codec((ctypes.addressof(win), len(win)), zero_copy_in=False)
    t = torch.arange(64 * 1024, dtype=torch.float32).reshape(256, 256)  # 256 KiB: staged
    out = a.dec.decode(a.enc.encode(wire.Reply(value=[t, torch.ones(3, dtype=torch.bfloat16)])))
    assert torch.equal(out.value[0], t) and out.value[1].dtype == torch.bfloat16
    # a tensor over memory the service maps from the dummy comes back over the dummy's memory
    mem = (ctypes.c_ubyte * 64)()
    local = torch.frombuffer(mem, dtype=torch.float32)
    service = Codec(None, zero_copy_in=True, to_dummy=lambda addr: addr)  # identity: same process here
    view = a.dec.decode(service.enc.encode(wire.Reply(value=local))).value
    assert view.data_ptr() == ctypes.addressof(mem)


def test_both_ends_read_frames_whole_however_they_arrive() -> None:
    """The dummy's reader and the service's (one recv for a small frame, then the rest):
    a frame split anywhere, one larger than the first read, and two requests sent at once
    (refused: a dummy waits for each answer)."""
    import socket
    import threading

    from mooncake_core.store.dummy_client import ServiceUnavailable, _Conn
    from mooncake_core.store.real_client import RealClientService

    enc = msgspec.msgpack.Encoder()
    small = wire.encode_frame(enc, wire.Reply(value="x" * 100))
    large = wire.encode_frame(enc, wire.Reply(value=b"y" * (200 << 10)))
    for with_fds in (False, True):
        a, b = socket.socketpair()
        try:
            a.sendall(small[:2])  # the header split too
            threading.Timer(0.05, a.sendall, (small[2:9],)).start()
            threading.Timer(0.1, a.sendall, (small[9:],)).start()
            assert RealClientService._recv(b, with_fds) == (small[4:], [])
            t = threading.Thread(target=lambda: (a.sendall(large[:70_000]), a.sendall(large[70_000:])))
            t.start()
            body, fds = RealClientService._recv(b, with_fds)  # type: ignore[misc]
            t.join()
            assert (bytes(body), fds) == (large[4:], [])
            a.sendall(small + small)
            with pytest.raises(ConnectionError, match="one at a time"):
                RealClientService._recv(b, with_fds)
            a.close()
            assert RealClientService._recv(b, with_fds) is None  # the peer closed
        finally:
            a.close()
            b.close()
    a, b = socket.socketpair()
    conn = _Conn(b, None)
    try:
        a.sendall(small[:3])
        threading.Timer(0.05, a.sendall, (small[3:],)).start()
        assert conn.read() == wire.Reply(value="x" * 100)
        a.sendall(large)
        assert conn.read() == wire.Reply(value=b"y" * (200 << 10))
        a.sendall(small + small)
        with pytest.raises(ServiceUnavailable, match="past the answer"):
            conn.read()
        a.close()
        with pytest.raises(ServiceUnavailable, match="closed"):
            conn.read()
    finally:
        conn.close()
