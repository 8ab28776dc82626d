"""The one small interface every transport implements, plus pure slicing logic.

A transport moves a list of ``TransferRequest``s (local address <-> address inside a remote
segment) to/from one peer described by a ``SegmentDescriptor``. ``can_reach`` says whether
it can serve that peer at all (same host? same process? RDMA NIC?), so the engine can pick
one per peer and log the choice. ``transfer`` blocks until every request is done or raises
``TransferError``; it must honour ``deadline`` (time.monotonic()) on every wait. Regions carry
a ``location`` ("cpu:0", "cuda:N", "*"), so a GPU-aware transport (CUDA IPC, staging through
pinned buffers) is an added class in ``TRANSPORTS``, not a rewrite.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from typing import Callable, Iterable, NamedTuple

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.transfer.descriptor import SegmentDescriptor


class TransferOpcode(enum.IntEnum):
    """Same values as Mooncake's ``TransferOpcode`` (READ=0, WRITE=1)."""

    READ = 0
    WRITE = 1
    Read = 0  # pybind spelling used by Mooncake's Python module
    Write = 1


class TransferRequest(NamedTuple):
    """One entry of a batch (a NamedTuple: cheap to build on the 4 KiB hot path)."""

    opcode: TransferOpcode
    local_addr: int
    remote_addr: int
    length: int


class TransferError(MooncakeError):
    """A failed transfer. ``peer_down`` marks failures of the peer itself (refused
    connection, reset, timeout) as opposed to a refused request, so the engine drops its
    cached descriptor and connections and re-resolves the peer next time (it may have
    restarted elsewhere)."""

    def __init__(self, message: str, code: int = ErrorCode.TRANSFER_FAIL, *, peer_down: bool = False):
        super().__init__(code, message)
        self.peer_down = peer_down


def split_slices(reqs: Iterable[TransferRequest], slice_size: int) -> list[TransferRequest]:
    """Cut requests into slices of at most ``slice_size`` bytes (pure; order preserved).

    Why: big requests are spread over several connections / threads and pipelined, and a
    slice is the unit that is retried, bounds-checked and accounted for.
    """
    if slice_size <= 0:
        raise ValueError(f"slice_size must be > 0, got {slice_size}")
    out: list[TransferRequest] = []
    for r in reqs:
        if r.length <= slice_size:
            out.append(r)
            continue
        off = 0
        while off < r.length:
            n = min(slice_size, r.length - off)
            out.append(TransferRequest(r.opcode, r.local_addr + off, r.remote_addr + off, n))
            off += n
    return out


def partition(items: list, parts: int) -> list[list]:
    """Split into ``parts`` contiguous groups of near-equal byte size (pure)."""
    parts = max(1, min(parts, len(items)))
    if parts == 1:
        return [items]
    total = sum(getattr(i, "length", 1) for i in items) or 1
    target = total / parts
    groups: list[list] = [[]]
    acc = 0.0
    for it in items:
        if acc >= target * len(groups) and len(groups) < parts:
            groups.append([])
        groups[-1].append(it)
        acc += getattr(it, "length", 1)
    return [g for g in groups if g]


class Transport(ABC):
    """A way to move bytes to one kind of peer."""

    name: str = "abstract"

    @abstractmethod
    def can_reach(self, desc: SegmentDescriptor) -> bool:
        """True when this transport can serve the peer (checked once per peer and logged)."""

    @abstractmethod
    def transfer(self, desc: SegmentDescriptor, reqs: list[TransferRequest], deadline: float) -> None:
        """Execute all requests against the peer; raise TransferError on any failure."""

    def close(self) -> None:  # pragma: no cover - default no-op
        """Release connections/threads."""


# Registry by name so rdma / cuda transports can be added without touching the engine.
TRANSPORTS: dict[str, Callable[..., Transport]] = {}


def register_transport(name: str):
    def deco(factory):
        TRANSPORTS[name] = factory
        return factory
    return deco
