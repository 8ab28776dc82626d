"""This engine's own segment: the registered regions and the descriptor built from them.

Why a class of its own: registration touches three things that must stay consistent -- the
region table the rpc server checks every request against, the registration order and
generation peers see in the descriptor, and every transport's region hooks (an RDMA memory
region, a CUDA IPC handle). ``LocalSegment`` does all three, rolling back on a refusal, and
builds the descriptor (with each transport's versioned section) that the publisher sends out.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Sequence

from mooncake_core.transfer import device_memory
from mooncake_core.transfer.base import Transport, device_ordinal, location_kind
from mooncake_core.transfer.descriptor import SegmentDescriptor, host_identity, process_start_time
from mooncake_core.transfer.memory import WILDCARD_LOCATION, Region, RegionTable
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.te")

__all__ = ["LocalSegment"]


class LocalSegment:
    """Regions registered by one engine, and its descriptor (thread-safe)."""

    def __init__(self) -> None:
        self.regions = RegionTable()
        self._order: dict[int, Region] = {}  # registration order, published as-is
        self._lock = threading.RLock()
        self.generation = 0
        self.transports: Sequence[Transport] = ()
        self.name = ""
        self.host = ""
        self.port = 0
        self.protocol = "tcp"
        self.boot_id, self.pidns = host_identity()
        self.start_time = process_start_time()

    # ------------------------------------------------------------------ registration
    def add(self, addr: int, length: int, location: str) -> Region:
        """Register one region: table, order, every transport's hook. Raises ValueError /
        the transport's error, leaving nothing registered."""
        location = location or WILDCARD_LOCATION
        if location == WILDCARD_LOCATION and device_memory.copier_for("cuda") is not None:
            location = device_memory.locate(int(addr)) or location  # "*": a GPU pointer says so itself
        kind = location_kind(location)
        if not any(t.capabilities.serves(location) for t in self.transports) or (
                kind != "cpu" and device_memory.copier_for(kind) is None):
            raise ValueError(f"location {location!r}: no registered transport serves {kind!r} memory "
                             f"(transports: {', '.join(t.name for t in self.transports)})"
                             + ("; GPU memory needs the cuda plugin (cuda-python and a CUDA device: "
                                "docs/gpu.md)" if kind == "cuda" else "")
                             + "; register host memory (location 'cpu:0' or '*')")
        ordinal = device_ordinal(location) if kind != "cpu" else 0  # ValueError on "cuda:x" before anything is added
        r = Region(int(addr), int(length), location)
        self.regions.add(r)
        if kind != "cpu":
            device_memory.add_range(r.addr, r.length, kind, ordinal)
        hooked: list[Transport] = []
        try:
            for t in self.transports:
                t.register_region(r)
                hooked.append(t)
        except BaseException:
            for t in hooked:
                self._unhook(t, r)
            self.regions.remove(r.addr)
            if kind != "cpu":
                device_memory.remove_range(r.addr)
            raise
        with self._lock:
            self._order[r.addr] = r
            self.generation += 1
        return r

    def add_many(self, addrs: Sequence[int], lengths: Sequence[int], location: str) -> None:
        """All or nothing: on the first failure the ones already added are removed again."""
        if len(addrs) != len(lengths):
            raise ValueError(f"{len(addrs)} addresses but {len(lengths)} capacities")
        done: list[int] = []
        try:
            for a, n in zip(addrs, lengths):
                self.add(a, n, location)
                done.append(int(a))
        except BaseException:
            for a in done:
                self.remove(a)
            raise

    def remove(self, addr: int) -> Region | None:
        """Unregister the region starting at ``addr`` (None when there is none)."""
        r = self.regions.remove(int(addr))
        with self._lock:
            self._order.pop(int(addr), None)
            self.generation += 1
        if r is not None:
            for t in self.transports:
                self._unhook(t, r)
            if location_kind(r.location) != "cpu":
                device_memory.remove_range(r.addr)
        return r

    @staticmethod
    def _unhook(t: Transport, r: Region) -> None:
        try:
            t.unregister_region(r)
        except Exception as e:  # noqa: BLE001 - one transport's failure must not keep memory registered
            log.warning("transport failed to unregister a region", extra={"transport": t.name, "addr": r.addr,
                                                                           "error": str(e)})

    def forget_device_ranges(self) -> None:
        """Drop our device regions from the process-wide table (the engine closes; its memory
        may be freed and the addresses reused as host memory)."""
        for r in self.regions.regions():
            if location_kind(r.location) != "cpu":
                device_memory.remove_range(r.addr)

    def ordered(self) -> list[Region]:
        with self._lock:
            return list(self._order.values())

    def first_addr(self) -> int:
        regs = self.ordered()
        return regs[0].addr if regs else 0

    # ------------------------------------------------------------------ descriptor
    def descriptor(self) -> SegmentDescriptor:
        with self._lock:
            bufs = list(self._order.values())
            gen = self.generation
        return SegmentDescriptor(name=self.name, host=self.host, port=self.port, protocol=self.protocol,
                                 buffers=bufs, boot_id=self.boot_id, pidns=self.pidns, pid=os.getpid(),
                                 start_time=self.start_time, generation=gen, transports=self._sections())

    def _sections(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for t in self.transports:
            sec = t.descriptor_section()
            if sec is not None:
                out[t.name] = {**sec, "version": t.section_version}
        return out
