"""Where the original Mooncake answers with a return code (not an exception), so do we.

Each test is named for the behaviour a user of the original relies on (their code checks
``rc != 0``); the original's own test suite checks the same (see docs/upstream-test-suite.md).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from mooncake_core.store import MooncakeDistributedStore, ReplicateConfig, SoftPinAction
from mooncake_core.utils.net import SEGMENT_PORT_RANGE

INVALID = -600


def test_replicate_config_soft_pin_ttl_must_be_a_uint64_or_none() -> None:
    c = ReplicateConfig()
    assert c.soft_pin_ttl_ms is None
    c.soft_pin_ttl_ms = 1000
    assert c.soft_pin_ttl_ms == 1000
    c.soft_pin_ttl_ms = None
    for bad in (-1, 1 << 64, True, 2.5, "10"):
        with pytest.raises(TypeError, match="soft_pin_ttl_ms"):
            c.soft_pin_ttl_ms = bad
    assert c.soft_pin_ttl_ms is None


def test_setup_with_an_unparsable_size_returns_a_code() -> None:
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                    "global_segment_size": "50%", "local_buffer_size": "16MB",
                    "master_server_addr": "127.0.0.1:1"}) == INVALID
    with pytest.raises(TypeError):  # a call of the wrong shape is still a TypeError, as pybind's
        s.setup("127.0.0.1", "P2PHANDSHAKE", global_segment=1)  # type: ignore[call-arg]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_store_answers_bad_values_with_codes(master_factory, client_factory) -> None:
    m = master_factory(default_kv_lease_ttl=500)
    c = client_factory(m, segment=16 << 20)
    # the default segment name: localhost-style host plus a port from the original's range
    host, port = c.get_hostname().rsplit(":", 1)
    assert host == "127.0.0.1" and SEGMENT_PORT_RANGE[0] <= int(port) < SEGMENT_PORT_RANGE[1]

    # soft_pin_ttl_ms without SoftPinAction.ENABLE: -600 from put and upsert, nothing written
    ttl_only = ReplicateConfig()
    ttl_only.soft_pin_ttl_ms = 1000
    assert c.put("sp", b"v", ttl_only) == INVALID and c.is_exist("sp") == 0
    enable = ReplicateConfig()
    enable.soft_pin_action, enable.soft_pin_ttl_ms = SoftPinAction.ENABLE, 1000
    assert c.put("sp", b"v", enable) == 0
    disable = ReplicateConfig()
    disable.soft_pin_action, disable.soft_pin_ttl_ms = SoftPinAction.DISABLE, 1000
    assert c.upsert("sp", b"w", ttl_only) == INVALID and c.upsert("sp", b"w", disable) == INVALID
    assert c.get("sp") == b"v"
    disable.soft_pin_ttl_ms = None
    assert c.upsert("sp", b"w", disable) == 0 and c.get("sp") == b"w"

    # mismatched list lengths: a negative code per key, no exception
    buf = (ctypes.c_ubyte * 4096)()
    ptr = ctypes.addressof(buf)
    assert c.register_buffer(ptr, 4096) == 0
    assert c.batch_get_into(["sp", "x"], [ptr, ptr + 1024, ptr + 2048], [1024] * 3) == [INVALID, INVALID]
    assert c.batch_put_from(["a", "b"], [ptr, ptr + 1024, ptr + 2048], [16] * 3) == [INVALID, INVALID]
    assert c.batch_get_into([], [], []) == [] and c.batch_is_exist(["a", "b"]) == [0, 0]

    # batch_get_buffer: upstream's BufferHandle interface (size(), ptr(), buffer protocol)
    got = c.batch_get_buffer(["sp", "missing"])
    assert got[1] is None and got[0].size() == 1 and bytes(got[0]) == b"w"
    assert ctypes.string_at(got[0].ptr(), got[0].size()) == b"w" and bytes(memoryview(got[0])) == b"w"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_put_larger_than_the_local_buffer_fails_as_upstream(master_factory, client_factory) -> None:
    m = master_factory(default_kv_lease_ttl=500)
    c = client_factory(m, segment=16 << 20, local_buffer_size=0)
    assert c.put("zero", b"test_zero_buffer_value") == INVALID and c.is_exist("zero") == 0
    assert c.put_batch(["z1", "z2"], [b"a", b"b"]) == INVALID
    # a registered buffer needs no staging: put_from still works
    arr = np.frombuffer(bytearray(b"x" * 64), np.uint8)
    assert c.register_buffer(int(arr.ctypes.data), 64) == 0
    assert c.put_from("zero", int(arr.ctypes.data), 64) == 0 and c.get("zero") == b"x" * 64


def test_replica_descriptor_has_the_originals_accessors() -> None:
    from mooncake_core.store.protocol import ReplicaDesc

    mem = ReplicaDesc("h:12345", 4096, 10)
    assert mem.is_memory_replica() and not mem.is_disk_replica() and not mem.is_local_disk_replica()
    bd = mem.get_memory_descriptor().buffer_descriptor
    assert (bd.size, bd.buffer_address, bd.transport_endpoint) == (10, 4096, "h:12345")
    disk = ReplicaDesc("h:12345", 0, 10, kind="disk", path="ab/cd")
    assert disk.is_disk_replica() and (disk.get_disk_descriptor().file_path, disk.get_disk_descriptor().object_size) \
        == ("ab/cd", 10)
    with pytest.raises(RuntimeError, match="not a memory one"):
        disk.get_memory_descriptor()
