"""In-process transport: memmove when the target segment lives in this very process.

Why: never loop through TCP to yourself (docs/transfer-engine.md). Engines in one process find each
other through a process-wide registry keyed by segment name; the target's own region
table is consulted, so a local write is bounds-checked exactly like a remote one.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Protocol

from mooncake_core.transfer import device_memory
from mooncake_core.transfer.base import (DEVICE_KINDS, Capabilities, Transport, TransferError, TransferOpcode,
                                         TransferRequest)
from mooncake_core.transfer.descriptor import SegmentDescriptor
from mooncake_core.transfer.memory import RegionTable, memcopy

class LocalOwner(Protocol):
    """What an engine publishes in-process: its region table and its current descriptor."""

    regions: RegionTable

    def local_descriptor(self) -> SegmentDescriptor | None:
        """This segment's descriptor now, or None once closed."""


_LOCAL: "weakref.WeakValueDictionary[str, LocalOwner]" = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def publish_local(name: str, owner: LocalOwner) -> None:
    """Make ``owner`` reachable in-process under its segment name."""
    with _LOCK:
        _LOCAL[name] = owner


def unpublish_local(name: str, owner: LocalOwner) -> None:
    with _LOCK:
        if _LOCAL.get(name) is owner:
            del _LOCAL[name]


def local_owner(name: str) -> LocalOwner | None:
    """The engine published under ``name`` in this process, if any."""
    with _LOCK:
        return _LOCAL.get(name)


def local_regions(name: str) -> RegionTable | None:
    o = local_owner(name)
    return o.regions if o is not None else None


class LocalTransport(Transport):
    name = "local"
    priority = 100  # same process: a memmove beats everything
    #: device memory of either side through its copier (device_memory.copy_any: one call for any mix)
    capabilities = Capabilities(locations=frozenset({"cpu"}) | DEVICE_KINDS, local_device=True)

    def can_reach(self, desc: SegmentDescriptor) -> bool:
        return desc.pid == os.getpid() and local_regions(desc.name) is not None

    def transfer(self, desc: SegmentDescriptor, reqs: list[TransferRequest], deadline: float) -> None:
        table = local_regions(desc.name)
        if table is None:
            raise TransferError(f"segment {desc.name!r} is no longer open in this process")
        for r in reqs:
            if not table.contains(r.remote_addr, r.length):
                raise TransferError(f"{r.opcode.name.lower()} of {r.length} bytes at {r.remote_addr:#x} is "
                                    f"outside every region registered by segment {desc.name!r}")
        copy = device_memory.copy_any if device_memory.active() else memcopy
        for r in reqs:
            if r.opcode == TransferOpcode.WRITE:
                copy(r.remote_addr, r.local_addr, r.length)
            else:
                copy(r.local_addr, r.remote_addr, r.length)
