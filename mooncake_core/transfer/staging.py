"""Device memory over transports that move host memory (tcp, cma): pinned host staging,
double-buffered so the device copy of one chunk overlaps the socket I/O of the other.

Why: across hosts there is no device-to-device path without RDMA (GPUDirect), so device bytes
go through host memory -- and a plain "copy it all to host, then send" would add the whole
device copy to the transfer's time. With two pinned buffers per transfer, chunk k+1 is copied
device->host on its own stream while chunk k is on the wire (a write), and chunk k is copied
host->device while chunk k+1 is being received (a read), so the slower of the two bounds the
time. The initiator stages here (:func:`run_staged`, from ``DataPath``); the target's rpc
server stages a request that lands in its device region (:func:`recv_to_device`,
:func:`send_from_device`). Buffer size: ``MC_DEVICE_STAGING_BYTES``.

:func:`pack` (pure) cuts requests into pieces that fit a buffer and packs small ones together
(a vLLM block set is thousands of 16 KiB blocks: one socket batch per buffer, not per block).
The copier is the small interface of ``device_memory``; CPU tests run all of this with its
host implementation.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

from mooncake_core import envs
from mooncake_core.transfer import device_memory
from mooncake_core.transfer.base import Transport, TransferError, TransferOpcode, TransferRequest
from mooncake_core.transfer.descriptor import SegmentDescriptor
from mooncake_core.transfer.memory import memview

__all__ = ["Piece", "pack", "run_staged", "split_by_memory", "recv_to_device", "send_from_device"]


class Piece(NamedTuple):
    """A request's slice that goes through one staging buffer at ``offset``."""

    opcode: TransferOpcode
    local_addr: int
    remote_addr: int
    length: int
    offset: int


def pack(reqs: Sequence[TransferRequest], size: int) -> list[list[Piece]]:
    """Batches of pieces, each batch filling at most ``size`` bytes of one buffer (pure; order kept)."""
    if size <= 0:
        raise ValueError(f"staging buffer size must be > 0, got {size}")
    batches: list[list[Piece]] = []
    cur: list[Piece] = []
    used = 0
    for r in reqs:
        off = 0
        while off < r.length:
            if used == size:
                batches.append(cur)
                cur, used = [], 0
            n = min(size - used, r.length - off)
            cur.append(Piece(r.opcode, r.local_addr + off, r.remote_addr + off, n, used))
            used += n
            off += n
    if cur:
        batches.append(cur)
    return batches


def split_by_memory(reqs: Sequence[TransferRequest]) -> tuple[list[TransferRequest], list[TransferRequest]]:
    """(requests on local host memory, requests on local device memory). TransferError when a
    local buffer starts in a device region and runs past its end (it cannot be staged or sent)."""
    host: list[TransferRequest] = []
    dev: list[TransferRequest] = []
    for r in reqs:
        if r.length and device_memory.find(r.local_addr, r.length) is not None:
            dev.append(r)
        elif r.length and device_memory.find(r.local_addr) is not None:
            raise TransferError(f"local buffer {r.local_addr:#x}+{r.length} runs past the end of its registered "
                                "device region")
        else:
            host.append(r)
    return host, dev


@dataclass
class _Slot:
    buf: int
    stream: Any


class _Pool:
    """Pinned buffers with a stream each, per (copier, device, size), reused across transfers.

    Keyed by the copier object itself (weakly): its buffers are its own memory, gone with it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: weakref.WeakKeyDictionary[Any, dict[tuple[int, int], list[_Slot]]] = weakref.WeakKeyDictionary()

    def take(self, copier: device_memory.DeviceCopier, device: int, size: int, n: int) -> list[_Slot]:
        with self._lock:
            free = self._free.setdefault(copier, {}).setdefault((device, size), [])
            got = [free.pop() for _ in range(min(n, len(free)))]
        while len(got) < n:
            got.append(_Slot(copier.alloc_pinned(size), copier.new_stream(device)))
        return got

    def give(self, copier: device_memory.DeviceCopier, device: int, size: int, slots: list[_Slot]) -> None:
        with self._lock:
            self._free.setdefault(copier, {}).setdefault((device, size), []).extend(slots)


_POOL = _Pool()


def _copier(r: device_memory.DeviceRange) -> device_memory.DeviceCopier:
    c = device_memory.copier_for(r.kind)
    if c is None:
        raise TransferError(f"{r.kind} memory at {r.addr:#x}: no copier installed (is the {r.kind} plugin loaded?)")
    return c


def run_staged(transport: Transport, desc: SegmentDescriptor, reqs: list[TransferRequest], deadline: float,
               size: int | None = None) -> None:
    """Run ``reqs`` on a host-memory ``transport``, staging those on local device memory."""
    host, dev = split_by_memory(reqs)
    if host:
        transport.transfer(desc, host, deadline)
    if not dev:
        return
    size = size or envs.MC_DEVICE_STAGING_BYTES
    r0 = device_memory.find(dev[0].local_addr, dev[0].length)
    assert r0 is not None
    copier = _copier(r0)
    slots = _POOL.take(copier, r0.device, size, IN_FLIGHT + 1)
    try:
        writes = [r for r in dev if r.opcode == TransferOpcode.WRITE]
        reads = [r for r in dev if r.opcode != TransferOpcode.WRITE]
        if writes:
            _writes(copier, slots, pack(writes, size), lambda b: transport.transfer(desc, b, deadline))
        if reads:
            _reads(copier, slots, pack(reads, size), lambda b: transport.transfer(desc, b, deadline))
    finally:
        _POOL.give(copier, r0.device, size, slots)


def _as_reqs(batch: list[Piece], buf: int) -> list[TransferRequest]:
    return [TransferRequest(p.opcode, buf + p.offset, p.remote_addr, p.length) for p in batch]


#: sends/receives of one staged transfer on the wire at once (three buffers: the third is being
#: copied to/from the device meanwhile). Why two: one transfer call returns only when every
#: connection's slices are acknowledged, and the gap until the next call cost a quarter of the
#: host path's throughput on an H200 host (BENCHMARKS.md, GPU memory).
IN_FLIGHT = 2
_WIRE = ThreadPoolExecutor(max_workers=8, thread_name_prefix="te-staging")


def _wait_all(inflight: deque[tuple[int, Future[None]]]) -> None:
    """Wait for every outstanding send/receive (their buffers go back to the pool next), then
    raise the first failure."""
    first: BaseException | None = None
    while inflight:
        try:
            inflight.popleft()[1].result()
        except BaseException as e:  # noqa: BLE001 - keep waiting: the buffers must be idle
            first = first or e
    if first is not None:
        raise first


def _writes(copier: device_memory.DeviceCopier, slots: list[_Slot], batches: list[list[Piece]],
            send: Callable[[list[TransferRequest]], None]) -> None:
    """Device -> buffer k (on its stream) while batches k-1 and k-2 are on the wire."""
    inflight: deque[tuple[int, Future[None]]] = deque()
    try:
        for k, b in enumerate(batches):
            s = slots[k % len(slots)]
            while inflight and inflight[0][0] <= k - len(slots):  # this buffer's last send is done
                inflight.popleft()[1].result()
            copier.copy_batch_async([s.buf + p.offset for p in b], [p.local_addr for p in b],
                                    [p.length for p in b], s.stream, device_only=True)  # pinned <- device
            copier.synchronize(s.stream)
            while len(inflight) >= IN_FLIGHT:
                inflight.popleft()[1].result()
            inflight.append((k, _WIRE.submit(send, _as_reqs(b, s.buf))))
    finally:
        _wait_all(inflight)


def _reads(copier: device_memory.DeviceCopier, slots: list[_Slot], batches: list[list[Piece]],
           recv: Callable[[list[TransferRequest]], None]) -> None:
    """Batches k and k+1 come in while buffer k-1 is copied to the device."""
    inflight: deque[tuple[int, Future[None]]] = deque()

    def to_device(j: int) -> None:
        s = slots[j % len(slots)]
        b = batches[j]
        copier.copy_batch_async([p.local_addr for p in b], [s.buf + p.offset for p in b], [p.length for p in b],
                                s.stream, device_only=True)

    try:
        for k, b in enumerate(batches):
            while len(inflight) >= IN_FLIGHT:
                j, fut = inflight.popleft()
                fut.result()
                to_device(j)
            s = slots[k % len(slots)]
            copier.synchronize(s.stream)  # batch k-3's copy out of this buffer is done
            inflight.append((k, _WIRE.submit(recv, _as_reqs(b, s.buf))))
        while inflight:
            j, fut = inflight.popleft()
            fut.result()
            to_device(j)
    finally:
        _wait_all(inflight)
        for s in slots:
            copier.synchronize(s.stream)


# ---------------------------------------------------------------------- the target's side
#: the target stages in chunks of at most this much, so that even one slice (the initiator cuts
#: requests into slices per connection) overlaps its device copy with the socket
SERVER_CHUNK = 4 << 20


def recv_to_device(recv_into: Callable[[memoryview], None], addr: int, n: int, r: device_memory.DeviceRange,
                   size: int | None = None) -> None:
    """Receive ``n`` bytes for device ``addr``: into pinned buffers, each copied to the device
    while the next one is received."""
    size = min(size or envs.MC_DEVICE_STAGING_BYTES, SERVER_CHUNK)
    copier = _copier(r)
    slots = _POOL.take(copier, r.device, size, 2)
    try:
        off = k = 0
        while off < n:
            s = slots[k % 2]
            c = min(size, n - off)
            copier.synchronize(s.stream)
            recv_into(memview(s.buf, c))
            copier.copy_async(addr + off, s.buf, c, s.stream)
            off += c
            k += 1
    finally:
        for s in slots:
            copier.synchronize(s.stream)
        _POOL.give(copier, r.device, size, slots)


def send_from_device(send: Callable[[list[bytes | memoryview]], None], head: bytes, addr: int, n: int,
                     r: device_memory.DeviceRange, size: int | None = None) -> None:
    """Send ``head`` then ``n`` bytes of device ``addr``: chunk k+1 is copied to a pinned buffer
    while chunk k is sent."""
    size = min(size or envs.MC_DEVICE_STAGING_BYTES, SERVER_CHUNK)
    copier = _copier(r)
    slots = _POOL.take(copier, r.device, size, 2)
    try:
        chunks = [(off, min(size, n - off)) for off in range(0, n, size)]
        if not chunks:
            send([head])
            return
        for k in range(min(2, len(chunks))):
            copier.copy_async(slots[k].buf, addr + chunks[k][0], chunks[k][1], slots[k].stream)
        for k, (_off, c) in enumerate(chunks):
            s = slots[k % 2]
            copier.synchronize(s.stream)
            send(([head] if k == 0 else []) + [memview(s.buf, c, writable=False)])
            if k + 2 < len(chunks):
                o2, c2 = chunks[k + 2]
                copier.copy_async(s.buf, addr + o2, c2, s.stream)
    finally:
        for s in slots:
            copier.synchronize(s.stream)
        _POOL.give(copier, r.device, size, slots)
