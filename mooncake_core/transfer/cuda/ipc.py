"""Same-host GPU to GPU through CUDA IPC: no host bounce, no socket.

Each registered ``cuda:N`` region's allocation is exported once (``cudaIpcGetMemHandle``: a
64-byte handle) into this transport's section of the segment descriptor, with the region's
offset in it. A peer on the same host opens each handle once (``cudaIpcOpenMemHandle``), keeps
the mapping, and moves every request with one ``cudaMemcpyAsync`` on its own stream -- device
to device, or to/from its own host memory (UVA: one call for any mix). Mappings of allocations
the peer no longer publishes are closed when its descriptor changes (unregistered memory), and
all of a peer's when it goes down.

Chosen (priority 90, above cma) for a same-host peer in another process whose memory is all on
GPUs -- the KV cache of a GPU deployment. A peer that mixes host and device memory is served by
tcp, whose rpc server stages its device memory (``staging.py``); an engine whose own memory is
on a GPU reaches host-only peers through tcp/cma with the engine's staging.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np

from mooncake_core.transfer import device_memory, vec
from mooncake_core.transfer.base import (Capabilities, Transport, TransferError, TransferOpcode, TransferRequest,
                                         TransportContext, device_ordinal, location_kind)
from mooncake_core.transfer.descriptor import SegmentDescriptor
from mooncake_core.transfer.memory import Region
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.te.cuda")

__all__ = ["CudaIpcTransport", "copier"]

_copier_lock = threading.Lock()
_copier: Any = None
_copier_error: str | None = None


def copier() -> Any:
    """The process's CudaCopier, installed for kind "cuda" on first use; None without CUDA."""
    global _copier, _copier_error
    with _copier_lock:
        if _copier is None and _copier_error is None:
            try:
                from mooncake_core.transfer.cuda.runtime import CudaCopier
                _copier = CudaCopier()
                device_memory.install_copier("cuda", _copier)
                log.info("cuda plugin: GPU memory registrable", extra={"devices": _copier.devices})
            except Exception as e:  # noqa: BLE001 - no usable CUDA: the plugin stays inert
                _copier_error = str(e)
                log.info("cuda plugin inactive (no usable CUDA device)", extra={"error": _copier_error})
        return _copier


class CudaIpcTransport(Transport):
    name = "cuda_ipc"
    hints = ("cuda", "nvlink_intra")
    priority = 90  # same host, device to device: above cma (80), below in-process (100)
    capabilities = Capabilities(locations=frozenset({"cuda"}), local_device=True, array_batches=True)
    section_version = 1

    def __init__(self, ctx: TransportContext | None = None) -> None:
        super().__init__(ctx)
        self.copier = copier()
        self._lock = threading.Lock()
        self._exports: dict[int, dict[str, Any]] = {}  # region addr -> published entry
        #: (peer segment, handle hex) -> (mapped base pointer, device); one open per allocation
        self._mapped: dict[tuple[str, str], tuple[int, int]] = {}
        self._seen_gen: dict[str, int] = {}
        self._streams = threading.local()

    # ------------------------------------------------------------------ our regions
    def register_region(self, region: Region) -> None:
        if self.copier is None or location_kind(region.location) != "cuda":
            return
        dev = device_ordinal(region.location)
        try:
            self.copier.set_device(dev)
            base, _size = self.copier.allocation_of(region.addr)
            handle = self.copier.ipc_export(base)
        except Exception as e:  # noqa: BLE001 - e.g. VMM/expandable allocations: no legacy IPC handle
            log.warning("cannot export a CUDA IPC handle for a region; same-host peers reach it over tcp "
                        "(staged)", extra={"addr": hex(region.addr), "error": str(e)})
            return
        with self._lock:
            self._exports[region.addr] = {"addr": region.addr, "handle": handle.hex(), "offset": region.addr - base,
                                          "device": dev}

    def unregister_region(self, region: Region) -> None:
        with self._lock:
            self._exports.pop(region.addr, None)

    def descriptor_section(self) -> dict[str, Any] | None:
        if self.copier is None:
            return None
        with self._lock:
            return {"regions": list(self._exports.values())}

    # ------------------------------------------------------------------ peers
    def can_reach(self, desc: SegmentDescriptor) -> bool:
        if self.copier is None or self.ctx is None or desc.pid == os.getpid():
            return False
        if not desc.boot_id or desc.boot_id != self.ctx.boot_id:
            return False
        sec = desc.section(self.name, self.section_version)
        if sec is None:
            return False
        exported = {int(e["addr"]) for e in sec.get("regions", [])}
        return bool(desc.buffers) and all(b.addr in exported for b in desc.buffers)

    def _entries(self, desc: SegmentDescriptor) -> dict[int, dict[str, Any]]:
        sec = desc.section(self.name, self.section_version) or {}
        return {int(e["addr"]): e for e in sec.get("regions", [])}

    def _map(self, desc: SegmentDescriptor, entry: dict[str, Any]) -> int:
        """The local pointer of the peer's region start (opening its allocation once)."""
        key = (desc.name, str(entry["handle"]))
        with self._lock:
            got = self._mapped.get(key)
        if got is None:
            try:
                ptr = self.copier.ipc_open(bytes.fromhex(str(entry["handle"])), int(entry.get("device", 0)))
            except Exception as e:  # noqa: BLE001 - name the peer and region
                raise TransferError(f"cannot open the CUDA IPC handle of segment {desc.name!r} region "
                                    f"{int(entry['addr']):#x}: {e}", peer_down=True) from None
            got = (ptr, int(entry.get("device", 0)))
            with self._lock:
                self._mapped[key] = got
        return got[0] + int(entry["offset"])

    def _prune(self, desc: SegmentDescriptor) -> None:
        """Close mappings of allocations the peer no longer publishes (it unregistered them)."""
        if self._seen_gen.get(desc.name) == desc.generation:
            return
        live = {str(e["handle"]) for e in self._entries(desc).values()}
        with self._lock:
            stale = [k for k in self._mapped if k[0] == desc.name and k[1] not in live]
            ptrs = [self._mapped.pop(k)[0] for k in stale]
        for p in ptrs:
            self._close(p)
        self._seen_gen[desc.name] = desc.generation

    def _close(self, ptr: int) -> None:
        try:
            self.copier.ipc_close(ptr)
        except Exception as e:  # noqa: BLE001 - closing must go on for the others
            log.warning("cudaIpcCloseMemHandle failed", extra={"ptr": hex(ptr), "error": str(e)})

    def open_handles(self, segment: str | None = None) -> int:
        """How many peer allocations are mapped (all, or one peer's) -- for tests and metrics."""
        with self._lock:
            return sum(1 for k in self._mapped if segment is None or k[0] == segment)

    def _stream(self, device: int) -> Any:
        streams = getattr(self._streams, "by_device", None)
        if streams is None:
            streams = self._streams.by_device = {}
        s = streams.get(device)
        if s is None:
            s = streams[device] = self.copier.new_stream(device)
        return s

    def transfer(self, desc: SegmentDescriptor, reqs: list[TransferRequest], deadline: float) -> None:
        if self.copier is None:
            raise TransferError("cuda_ipc: no CUDA device in this process")
        self._prune(desc)
        entries = self._entries(desc)
        streams: dict[int, Any] = {}
        run: list[Any] = []  # [dst, src, n, stream]: requests contiguous on both sides go as one copy
        queued: dict[int, tuple[list[int], list[int], list[int]]] = {}  # stream id -> one batch call

        def flush() -> None:
            if run:
                q = queued.setdefault(id(run[3]), ([], [], []))
                q[0].append(run[0])
                q[1].append(run[1])
                q[2].append(run[2])
                run.clear()

        for r in reqs:
            region = desc.find_region(r.remote_addr, r.length)
            entry = entries.get(region.addr) if region is not None else None
            if region is None or entry is None:
                raise TransferError(f"{r.opcode.name.lower()} of {r.length} bytes at {r.remote_addr:#x}: no CUDA IPC "
                                    f"region of segment {desc.name!r} holds it")
            dev = int(entry.get("device", 0))
            s = streams.get(dev) or streams.setdefault(dev, self._stream(dev))
            remote = self._map(desc, entry) + (r.remote_addr - region.addr)
            dst, src = (remote, r.local_addr) if r.opcode == TransferOpcode.WRITE else (r.local_addr, remote)
            if run and run[3] is s and run[0] + run[2] == dst and run[1] + run[2] == src:
                run[2] += r.length
                continue
            flush()
            run.extend((dst, src, r.length, s))
        flush()
        for s in streams.values():
            q = queued.get(id(s))
            if q is not None:
                self.copier.copy_batch_async(q[0], q[1], q[2], s,
                                             device_only=device_memory.all_device(
                                                 q[1] if reqs[0].opcode == TransferOpcode.WRITE else q[0], q[2]))
        for s in streams.values():
            self.copier.synchronize(s)
        if time.monotonic() > deadline:
            raise TransferError(f"cuda_ipc transfer to {desc.name!r} finished past its deadline")

    def transfer_arrays(self, desc: SegmentDescriptor, opcode: TransferOpcode, local: np.ndarray,
                        remote: np.ndarray, length: np.ndarray, deadline: float) -> None:
        """A large batch (a KV block list) without an object per request: regions looked up with
        numpy, runs contiguous on both sides merged, then one copy kernel launch where every local
        address is device memory (``copy_batch_async``)."""
        if self.copier is None:
            raise TransferError("cuda_ipc: no CUDA device in this process")
        self._prune(desc)
        local, remote, length = vec.coalesce(local, remote, length)
        if not len(length):
            return
        entries = self._entries(desc)
        starts, _ends = vec.region_arrays(desc)
        idx = np.searchsorted(starts, remote, side="right") - 1  # bounds were checked by the engine
        bases = np.zeros(len(starts), dtype=np.int64)
        devices: set[int] = set()
        for u in np.unique(idx).tolist():
            entry = entries.get(int(starts[u]))
            if entry is None:
                raise TransferError(f"region {int(starts[u]):#x} of segment {desc.name!r} has no CUDA IPC handle")
            bases[u] = self._map(desc, entry) - int(starts[u])
            devices.add(int(entry.get("device", 0)))
        if len(devices) != 1:  # several GPUs behind one segment: the per-request path keeps them apart
            self.transfer(desc, [TransferRequest(opcode, int(a), int(b), int(n))
                                 for a, b, n in zip(local.tolist(), remote.tolist(), length.tolist())], deadline)
            return
        mapped = remote + bases[idx]
        dsts, srcs = (mapped, local) if opcode == TransferOpcode.WRITE else (local, mapped)
        s = self._stream(devices.pop())
        if len(length) == 1:  # one contiguous run (big requests back to back): one copy, no kernel set-up
            self.copier.copy_async(int(dsts[0]), int(srcs[0]), int(length[0]), s)
        else:
            self.copier.copy_batch_async(dsts, srcs, length, s, device_only=device_memory.all_device(local, length))
        self.copier.synchronize(s)
        if time.monotonic() > deadline:
            raise TransferError(f"cuda_ipc transfer to {desc.name!r} finished past its deadline")

    def drop_peer(self, desc: SegmentDescriptor) -> None:
        with self._lock:
            stale = [k for k in self._mapped if k[0] == desc.name]
            ptrs = [self._mapped.pop(k)[0] for k in stale]
        self._seen_gen.pop(desc.name, None)
        for p in ptrs:
            self._close(p)

    def close(self) -> None:
        with self._lock:
            ptrs = [p for p, _ in self._mapped.values()]
            self._mapped.clear()
        for p in ptrs:
            self._close(p)
