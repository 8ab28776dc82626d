"""The one small interface every transport implements, plus pure slicing logic.

A transport moves a list of ``TransferRequest``s (local address <-> address inside a remote
segment) to/from one peer described by a ``SegmentDescriptor``. ``can_reach`` says whether
it can serve that peer at all (same host? same process? RDMA NIC?), so the engine can pick
one per peer and log the choice. ``transfer`` blocks until every request is done or raises
``TransferError``; it must honour ``deadline`` (time.monotonic()) on every wait.

A transport is a plugin (``mooncake_transports`` hook, docs/plugins.md): its class declares a
``priority`` and :class:`Capabilities` (memory locations, array batches, notifications); the
engine iterates the registered transports, most preferred first, and picks per peer the
first that can reach it. Region hooks (``register_region``/``unregister_region``) and a
versioned per-transport section of the segment descriptor (``descriptor_section``) are where
RDMA memory keys or CUDA IPC handles go, so such a transport is an added module.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, NamedTuple

import numpy as np

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.transfer.descriptor import SegmentDescriptor
from mooncake_core.transfer.memory import Region, RegionTable


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


@dataclass(frozen=True)
class Capabilities:
    """What a transport can do, declared so the engine chooses by data instead of by name.

    ``locations``: the kinds of memory it moves ("cpu", "cuda", ...; a region's location
    "cuda:1" has kind "cuda", "cpu:0" and the wildcard "*" mean host memory, see
    :func:`location_kind`). ``array_batches``: it has
    ``transfer_arrays`` (a large batch as int64 arrays, no object per request).
    ``notifications``: it delivers ``notify`` itself, in order with its data (RDMA immediate
    data, say); otherwise the engine sends notifications over its control channel.
    ``local_device``: it reads and writes *local* device memory itself (a device copy, CUDA
    IPC); otherwise the engine stages requests on local device memory through pinned host
    buffers (``staging.run_staged``) -- how tcp and cma carry GPU memory.
    """

    locations: frozenset[str] = frozenset({"cpu"})
    array_batches: bool = False
    notifications: bool = False
    local_device: bool = False

    def serves(self, location: str) -> bool:
        return location_kind(location) in self.locations


#: memory-location kinds that are not host memory ("cuda:0" -> "cuda"); any other location
#: name ("cpu:0", "*", a NUMA label...) is host memory, kind "cpu"
DEVICE_KINDS = frozenset({"cuda", "npu", "hip", "xpu", "musa", "mlu"})


def location_kind(location: str) -> str:
    """"cuda:1" -> "cuda"; "cpu:0", "*", "" or any other host label -> "cpu"."""
    kind = location.split(":", 1)[0].strip().lower() if location else ""
    return kind if kind in DEVICE_KINDS else "cpu"


def device_ordinal(location: str) -> int:
    """"cuda:1" -> 1; "cuda" -> 0 (the original's default device). ValueError on "cuda:x"."""
    _, _, n = location.partition(":")
    try:
        return int(n) if n.strip() else 0
    except ValueError:
        raise ValueError(f"location {location!r}: expected 'kind:N' with a device number N") from None


@dataclass
class TransportContext:
    """What an engine tells each transport it builds: who we are and what we registered."""

    #: this engine's segment name (known only after the rpc port is bound: a callable)
    segment_name: Callable[[], str]
    #: the regions this engine registered (shared, live)
    regions: RegionTable
    #: (boot_id, pid namespace) of this host/process, see descriptor.host_identity()
    boot_id: str = ""
    pidns: str = ""
    #: ``initialize``'s protocol ("tcp", "rdma") and device_name ("mlx5_0,mlx5_1"): an RDMA
    #: transport stays inert unless asked, and uses only the devices named
    protocol: str = "tcp"
    device_name: str = ""
    #: the host part of ``initialize``'s local_hostname: which interface is this engine's own
    hostname: str = ""


class Transport(ABC):
    """A way to move bytes to one kind of peer.

    Class attributes describe it to the engine: ``name`` (also the ``transport_hint`` that
    forces it, plus any ``hints`` aliases), ``priority`` (higher is preferred among the
    transports that can reach a peer; built-ins: local 100, cma 80, tcp 10 -- leave room for
    rdma around 50), ``capabilities`` (see :class:`Capabilities`). Subclasses must implement
    ``can_reach`` and ``transfer``; everything else has a working default.
    """

    name: ClassVar[str] = "abstract"
    priority: ClassVar[int] = 0
    capabilities: ClassVar[Capabilities] = Capabilities()
    hints: ClassVar[tuple[str, ...]] = ()
    #: version of this transport's section of the segment descriptor (see ``descriptor_section``)
    section_version: ClassVar[int] = 1
    #: largest request ``transfer_one`` takes on its fast single-request path (0: none)
    single_max: int = 0

    def __init__(self, ctx: TransportContext | None = None) -> None:
        self.ctx = ctx

    @property
    def active(self) -> bool:
        """False for a transport that is registered but inert in this engine (an RDMA transport
        not asked for, or without its library): it reaches no peer, and the engine's
        ``transport_names`` (what ``mooncake_doctor`` reports) leaves it out."""
        return True

    @abstractmethod
    def can_reach(self, desc: SegmentDescriptor) -> bool:
        """True when this transport can serve the peer (checked once per peer and logged).
        A transport that needs the peer's section reads ``desc.section(self.name, ...)``."""

    @abstractmethod
    def transfer(self, desc: SegmentDescriptor, reqs: list[TransferRequest], deadline: float) -> None:
        """Execute all requests against the peer; raise TransferError on any failure. Every
        request was bounds-checked against ``desc`` by the engine; honour ``deadline``."""

    def transfer_one(self, desc: SegmentDescriptor, opcode: int, local: int, remote: int, length: int,
                     deadline: float) -> None:
        """One request of at most ``single_max`` bytes (the latency path; default: ``transfer``)."""
        self.transfer(desc, [TransferRequest(TransferOpcode(opcode), local, remote, length)], deadline)

    def transfer_arrays(self, desc: SegmentDescriptor, opcode: TransferOpcode, local: np.ndarray,
                        remote: np.ndarray, length: np.ndarray, deadline: float) -> None:
        """A large batch as int64 arrays, validated and bounds-checked by the engine. Called
        only when ``capabilities.array_batches``."""
        raise NotImplementedError(f"transport {self.name!r} declares no array batches")

    def notify(self, desc: SegmentDescriptor, name: str, msg: str, deadline: float) -> None:
        """Deliver a notification after this transport's data. Called only when
        ``capabilities.notifications``."""
        raise NotImplementedError(f"transport {self.name!r} declares no notifications")

    def register_region(self, region: Region) -> None:
        """A region was registered (an RDMA memory region, a CUDA IPC handle goes here).
        Raising refuses the registration; the engine then unregisters it everywhere."""

    def unregister_region(self, region: Region) -> None:
        """A region is being unregistered (release what ``register_region`` took)."""

    def descriptor_section(self) -> dict[str, Any] | None:
        """What peers need to reach us with this transport (keys, NIC ids, handles),
        published as ``descriptor["transports"][name]`` with ``"version": section_version``;
        None publishes nothing. Read after every (un)registration."""
        return None

    def drop_peer(self, desc: SegmentDescriptor) -> None:
        """Forget connections/state for a peer that went down (it may come back elsewhere)."""

    def close(self) -> None:
        """Release connections/threads."""
