"""The transport interface the engine offers plugins: priority and capability decide the
transport per peer, region hooks run on (un)registration (a refusal rolls back), each
transport's versioned descriptor section reaches peers, memory no transport serves is refused.

Two engines in this process exchange real bytes through a test transport registered as a
plugin; nothing of the engine is mocked."""

from __future__ import annotations

import os
from typing import Any, Iterator

import numpy as np
import pytest

from mooncake_core.engine import TransferEngine
from mooncake_core.plugins import get_plugin_manager, hookimpl
from mooncake_core.transfer.base import Capabilities, Transport, TransferError, TransferOpcode
from mooncake_core.transfer.local import local_regions
from mooncake_core.transfer.memory import memcopy
from mooncake_core.utils.net import free_port

EVENTS: list[tuple[str, Any]] = []


class Copier(Transport):
    """In-process memmove (like the built-in local transport), preferred over everything."""

    name = "copier"
    priority = 150
    capabilities = Capabilities(locations=frozenset({"cpu"}))

    def can_reach(self, desc: Any) -> bool:
        return desc.pid == os.getpid() and desc.section(self.name, 2) is not None

    def transfer(self, desc: Any, reqs: Any, deadline: float) -> None:
        table = local_regions(desc.name)
        if table is None:
            raise TransferError(f"{desc.name} gone")
        for r in reqs:
            if r.opcode == TransferOpcode.WRITE:
                memcopy(r.remote_addr, r.local_addr, r.length)
            else:
                memcopy(r.local_addr, r.remote_addr, r.length)
        EVENTS.append(("transfer", len(reqs)))

    section_version = 2

    def register_region(self, region: Any) -> None:
        if region.length == 4096 * 3:  # the test's way of asking for a refusal
            raise RuntimeError("copier refuses 12 KiB regions")
        EVENTS.append(("register", region.addr))

    def unregister_region(self, region: Any) -> None:
        EVENTS.append(("unregister", region.addr))

    def descriptor_section(self) -> dict[str, Any]:
        return {"hello": "peer"}


class GpuOnly(Copier):
    """Even more preferred, but serves only GPU memory: must not be chosen for host memory."""

    name = "gpuonly"
    priority = 200
    capabilities = Capabilities(locations=frozenset({"cuda"}))

    def can_reach(self, desc: Any) -> bool:
        return desc.pid == os.getpid()  # reaches the peer: only its capabilities rule it out

    def register_region(self, region: Any) -> None:
        EVENTS.append(("gpu-register", region.location))

    def descriptor_section(self) -> None:
        return None


class Plugin:
    @hookimpl
    def mooncake_transports(self) -> list[type[Transport]]:
        return [Copier, GpuOnly]


@pytest.fixture
def engines() -> Iterator[tuple[TransferEngine, TransferEngine]]:
    pm = get_plugin_manager()
    plugin = Plugin()
    pm.register(plugin, name="test-copier")
    EVENTS.clear()
    a, b = TransferEngine(), TransferEngine()
    try:
        for e in (a, b):
            assert e.initialize(f"127.0.0.1:{free_port()}", "P2PHANDSHAKE", "tcp", "") == 0, e.last_error
        yield a, b
    finally:
        a.close()
        b.close()
        pm.unregister(plugin)


def test_priority_and_capability_choose_the_transport(engines) -> None:
    a, b = engines
    src = np.arange(8192, dtype=np.uint8)
    dst = np.zeros(8192, dtype=np.uint8)
    assert a.register_memory(src.ctypes.data, src.nbytes, "cpu:0") == 0
    assert b.register_memory(dst.ctypes.data, dst.nbytes, "cpu:0") == 0
    peer = b.get_local_segment_name()
    assert a.transport_for(peer) == "copier"  # gpuonly (200) cannot serve cpu memory; copier (150) can
    assert a.transfer_sync_write(peer, src.ctypes.data, dst.ctypes.data, 8192) == 0
    assert np.array_equal(src, dst) and ("transfer", 1) in EVENTS
    assert a.transfer_sync_read(peer, src.ctypes.data, dst.ctypes.data, 16, transport_hint="local") == 0


def test_region_hooks_sections_and_rollback(engines) -> None:
    a, _ = engines
    buf = np.zeros(4096 * 4, dtype=np.uint8)
    assert a.register_memory(buf.ctypes.data, 4096) == 0
    assert ("register", buf.ctypes.data) in EVENTS
    d = a.local_descriptor()
    assert d is not None and d.transports == {"copier": {"hello": "peer", "version": 2}}
    assert d.section("copier", 2) == {"hello": "peer", "version": 2} and d.section("copier", 1) is None
    # a refusing hook: register_memory fails and nothing stays registered, in any transport
    base = buf.ctypes.data + 4096
    assert a.register_memory(base, 4096 * 3) == -1 and "refuses" in a.last_error
    assert not a.regions.contains(base, 1) and ("gpu-register", "*") in EVENTS
    assert a.unregister_memory(buf.ctypes.data) == 0
    assert ("unregister", buf.ctypes.data) in EVENTS


def test_memory_no_transport_serves_is_refused() -> None:
    e = TransferEngine()
    assert e.initialize(f"127.0.0.1:{free_port()}", "P2PHANDSHAKE", "tcp", "") == 0
    try:
        buf = np.zeros(4096, dtype=np.uint8)
        assert e.register_memory(buf.ctypes.data, 4096, "cuda:0") == -1
        assert "no registered transport serves 'cuda' memory" in e.last_error and "cuda plugin" in e.last_error
        assert e.register_memory(buf.ctypes.data, 4096, "cpu:1") == 0
    finally:
        e.close()
