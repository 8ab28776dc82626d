"""How one transfer call runs: requests validated, bounds-checked, handed to a transport.

Three shapes, chosen per call:

* a single small request to a peer already known (``sync_one``): the transport's
  ``transfer_one`` latency path, no batch structures (the 4 KiB case);
* a large batch (``vec.VEC_MIN``+ entries) to a transport with ``array_batches``: the address
  lists become int64 arrays once, validated and bounds-checked with numpy, and go to
  ``transfer_arrays`` -- no object per request;
* anything else: a list of ``TransferRequest``, bounds-checked as a whole before any byte moves.

A notification goes after the data: by the transport itself when it declares
``notifications`` (in order with its data), else over the control channel. A failure of the
peer itself (``peer_down``) makes the peer table forget it, so the next call re-resolves it.
Errors are raised; the engine façade turns them into Mooncake's integer codes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from mooncake_core.errors import ErrorCode
from mooncake_core.transfer import device_memory, metrics, staging, vec
from mooncake_core.transfer.base import Transport, TransferError, TransferOpcode, TransferRequest
from mooncake_core.transfer.control import ControlChannel
from mooncake_core.transfer.notify import TransferNotify
from mooncake_core.transfer.peers import Peer, PeerTable

__all__ = ["DataPath", "Plan"]


@dataclass
class Plan:
    """What one call will move: a request list, or arrays for ``transfer_arrays``."""

    peer: Peer
    transport: Transport
    nbytes: int
    reqs: list[TransferRequest] | None = None
    arrays: tuple[TransferOpcode, np.ndarray, np.ndarray, np.ndarray] | None = None


def make_reqs(opcode: Any, buffers: Sequence[int], peers: Sequence[int],
              lengths: Sequence[int]) -> list[TransferRequest]:
    """Validated request list (INVALID_PARAMS naming the bad entry)."""
    if not (len(buffers) == len(peers) == len(lengths)):
        raise TransferError(f"buffers ({len(buffers)}), peer_buffer_addresses ({len(peers)}) and lengths "
                            f"({len(lengths)}) must have the same length", ErrorCode.INVALID_PARAMS)
    op = TransferOpcode(int(opcode))
    reqs = [TransferRequest(op, int(b), int(p), int(n)) for b, p, n in zip(buffers, peers, lengths)]
    for r in reqs:
        if r.length < 0 or r.local_addr <= 0 or r.remote_addr < 0:
            raise TransferError(f"invalid request: local={r.local_addr:#x} remote={r.remote_addr:#x} "
                                f"length={r.length}", ErrorCode.INVALID_PARAMS)
    return reqs


class DataPath:
    def __init__(self, peers: PeerTable, control: ControlChannel, timeout: Callable[[], float]) -> None:
        self.peers = peers
        self.control = control
        self._timeout = timeout

    def deadline(self, nbytes: int) -> float:
        """MC_TRANSFER_TIMEOUT plus one second per GiB."""
        return time.monotonic() + self._timeout() + nbytes / float(1 << 30)

    # ------------------------------------------------------------------ planning
    def plan(self, peer: Peer, opcode: Any, buffers: Sequence[int], remotes: Sequence[int],
             lengths: Sequence[int], hint: str) -> Plan:
        transport = self.peers.pick(peer, hint)
        arrays = self._arrays(peer, transport, opcode, buffers, remotes, lengths)
        if arrays is not None:
            return Plan(peer, transport, int(arrays[3].sum()), arrays=arrays)
        reqs = make_reqs(opcode, buffers, remotes, lengths)
        return Plan(peer, transport, sum(r.length for r in reqs), reqs=reqs)

    @staticmethod
    def _arrays(peer: Peer, transport: Transport, opcode: Any, buffers: Sequence[int], remotes: Sequence[int],
                lengths: Sequence[int]) -> tuple[TransferOpcode, np.ndarray, np.ndarray, np.ndarray] | None:
        """(op, local, remote, length) for a large batch to a transport that takes arrays,
        validated and bounds-checked with numpy (transfer/vec.py). None -- take the request
        path, which reports the exact offending entry -- when the batch is short, not plain
        valid integers, outside the cached descriptor, or the transport has no array path."""
        if not transport.capabilities.array_batches or len(buffers) < vec.VEC_MIN or (
                device_memory.active() and not transport.capabilities.local_device):
            return None  # local device memory on a host transport: the request path, which stages it
        arrs = vec.as_arrays(buffers, remotes, lengths)
        if arrs is None or not vec.locals_ok(*arrs) or not vec.in_bounds(peer.desc, arrs[1], arrs[2]):
            return None
        try:
            op = TransferOpcode(int(opcode))
        except (TypeError, ValueError):
            return None
        return op, arrs[0], arrs[1], arrs[2]

    # ------------------------------------------------------------------ running
    def run(self, plan: Plan, deadline: float, notify: TransferNotify | None) -> None:
        peer, transport = plan.peer, plan.transport
        if plan.reqs is not None:
            self.peers.check_bounds(peer, plan.reqs)  # refuse a bad batch as a whole, before any byte moves
            count = len(plan.reqs)
            opname = plan.reqs[0].opcode.name.lower() if plan.reqs else "none"
        else:
            assert plan.arrays is not None
            count = len(plan.arrays[3])
            opname = plan.arrays[0].name.lower()
        t0 = time.perf_counter()
        ok = False
        try:
            if plan.arrays is not None:
                op, local, remote, length = plan.arrays
                transport.transfer_arrays(peer.desc, op, local, remote, length, deadline)
            elif plan.reqs:
                if device_memory.active() and not transport.capabilities.local_device:
                    staging.run_staged(transport, peer.desc, plan.reqs, deadline)  # local GPU memory via pinned host
                else:
                    transport.transfer(peer.desc, plan.reqs, deadline)
            if notify is not None:
                self._notify(peer, transport, notify, deadline)
            ok = True
        except TransferError as e:
            if e.peer_down:
                self.peers.forget(peer.name)  # peer may be gone or restarted: re-resolve next time
            raise
        finally:
            metrics.record(transport.name, opname, plan.nbytes, count, time.perf_counter() - t0, ok)

    def sync(self, target: str, opcode: Any, buffers: Sequence[int], remotes: Sequence[int],
             lengths: Sequence[int], notify: TransferNotify | None, hint: str) -> None:
        plan = self.plan(self.peers.get(target), opcode, buffers, remotes, lengths, hint)
        self.run(plan, self.deadline(plan.nbytes), notify)

    def sync_one(self, target: str, opcode: int, local: int, remote: int, length: int, hint: str) -> None:
        """Single synchronous request: the transport's latency path when the peer is known
        and the request small, else ``sync``. Same checks either way (bounds against the
        cached descriptor, deadline, per-peer connection handling)."""
        peer = self.peers.cached(target)
        t = None if peer is None else peer.transport if hint == "" else peer.hinted.get(hint)
        if (t is None or peer is None or not 0 < length <= t.single_max or local <= 0
                or peer.desc.find_region(remote, length) is None
                or (device_memory.active() and device_memory.find(local) is not None)):
            self.sync(target, opcode, [local], [remote], [length], None, hint)
            return
        t0 = time.perf_counter()
        ok = False
        try:
            t.transfer_one(peer.desc, opcode, local, remote, length,
                           time.monotonic() + self._timeout() + length / 1073741824.0)
            ok = True
        except TransferError as e:
            if e.peer_down:
                self.peers.forget(target)
            raise
        finally:
            metrics.record(t.name, "write" if opcode == 1 else "read", length, 1, time.perf_counter() - t0, ok)

    def _notify(self, peer: Peer, transport: Transport, notify: TransferNotify, deadline: float) -> None:
        if transport.capabilities.notifications:
            transport.notify(peer.desc, notify.name, notify.msg, deadline)
        else:
            self.control.notify(peer.desc.host, peer.desc.port, peer.name, notify.name, notify.msg, deadline)
