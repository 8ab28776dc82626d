"""Pure logic: region table, slicing, wire encoding, descriptors, batch states (no sockets)."""

from __future__ import annotations

import pytest

from mooncake_core.transfer.base import TransferOpcode, TransferRequest, partition, split_slices
from mooncake_core.transfer.batch import BatchTable
from mooncake_core.transfer.descriptor import DescriptorError, SegmentDescriptor
from mooncake_core.transfer.memory import Region, RegionTable
from mooncake_core.transfer.wire import (MAGIC, REQ, Op, Request, Response, WireError, unpack_request,
                                         unpack_response)


def test_region_table_bounds():
    t = RegionTable()
    t.add(Region(1000, 100))
    t.add(Region(5000, 50, "cpu:0"))
    assert t.contains(1000, 100) and t.contains(1099, 1) and t.contains(5000, 0)
    assert not t.contains(999, 2) and not t.contains(1050, 51) and not t.contains(1100, 1)
    assert not t.contains(2000, 1) and not t.contains(0, 1) and not t.contains(5049, 2)
    with pytest.raises(ValueError, match="overlaps"):
        t.add(Region(1090, 20))
    with pytest.raises(ValueError, match="overlaps"):
        t.add(Region(990, 20))
    with pytest.raises(ValueError, match="positive"):
        t.add(Region(10, 0))
    assert t.remove(1000).length == 100 and t.remove(1000) is None
    assert not t.contains(1000, 1) and t.total_bytes() == 50


def test_split_and_partition():
    reqs = [TransferRequest(TransferOpcode.WRITE, 100, 200, 10), TransferRequest(TransferOpcode.READ, 0, 0, 25)]
    s = split_slices(reqs, 10)
    assert [(x.local_addr, x.remote_addr, x.length) for x in s] == [(100, 200, 10), (0, 0, 10), (10, 10, 10),
                                                                   (20, 20, 5)]
    assert sum(x.length for x in s) == 35
    with pytest.raises(ValueError):
        split_slices(reqs, 0)
    items = split_slices([TransferRequest(TransferOpcode.WRITE, 0, 0, 64 << 20)], 1 << 20)
    groups = partition(items, 2)
    assert len(groups) == 2 and [len(g) for g in groups] == [32, 32]
    assert partition(items[:1], 4) == [items[:1]]


def test_wire_roundtrip_and_garbage():
    r = Request(Op.WRITE, 7, 0xDEAD, 123, 4)
    got = unpack_request(r.pack())
    assert (got.op, got.req_id, got.addr, got.length, got.aux_len) == (Op.WRITE, 7, 0xDEAD, 123, 4)
    resp = unpack_response(Response(Op.READ, 9, -10, 3, 55).pack())
    assert (resp.req_id, resp.status, resp.aux_len, resp.length) == (9, -10, 3, 55)
    with pytest.raises(WireError, match="magic"):
        unpack_request(b"\0" * REQ.size)
    bad = bytearray(r.pack())
    bad[6] = 99  # unknown op
    with pytest.raises(WireError, match="op"):
        unpack_request(bytes(bad))
    assert MAGIC.to_bytes(4, "little") == r.pack()[:4]


def test_descriptor_roundtrip_and_version_skew():
    d = SegmentDescriptor("h:1", "127.0.0.1", 1, buffers=[Region(4096, 10, "cpu:0")], boot_id="b", pidns="p",
                          pid=5)
    back = SegmentDescriptor.from_json(d.to_json())
    assert back.buffers == d.buffers and back.host == "127.0.0.1" and back.same_host_as("b", "p")
    assert back.find_region(4096, 10) and not back.find_region(4090, 10)
    j = d.to_json()
    j["version"] = 7
    with pytest.raises(DescriptorError, match=r"version 7.*version 1"):
        SegmentDescriptor.from_json(j)
    with pytest.raises(DescriptorError, match="not a JSON object"):
        SegmentDescriptor.from_json([1, 2])
    with pytest.raises(DescriptorError, match="malformed"):
        SegmentDescriptor.from_json({"version": 1})


def test_batch_states():
    t = BatchTable()
    a = t.new(deadline=100.0, nbytes=1)
    b = t.new(deadline=100.0, nbytes=1)
    assert a.batch_id != b.batch_id and a.batch_id > 0
    assert a.status_code(now=50) == 0 and a.status_code(now=101) == -2
    a.finish(None)
    b.finish("boom")
    assert a.status_code(now=500) == 1 and b.status_code() == -1 and b.error == "boom"


def test_default_bind_follows_local_hostname():
    from mooncake_core.engine import _default_bind

    assert _default_bind("127.0.0.1") == "127.0.0.1"
    assert _default_bind("localhost") == "127.0.0.1"
    assert _default_bind("10.1.2.3") == "10.1.2.3"       # listen where peers are told to connect
    assert _default_bind("[::1]") == "::1"
    assert _default_bind("no-such-host.invalid") == "127.0.0.1"
