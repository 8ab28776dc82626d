"""One Transfer Engine per process, shared by every migration link, released with the last link.

Why: LMDeploy's own Mooncake backend creates a ``TransferEngine`` (a listening port, threads, its
own registration of the whole KV pool) per peer *and per connection attempt* -- the proxy retries
a failed connection 8 times -- and never closes one when a connection is dropped. Here a link
acquires the process's engine and releases it; the engine is closed when no link holds it, and a
memory region is registered once however many links advertise it (counted per address).

Uses only the public ``mooncake_core.engine.TransferEngine`` API. No LMDeploy import.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Sequence

from mooncake_core.engine import TransferEngine
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.lmdeploy")


class EngineStartError(RuntimeError):
    """The Transfer Engine could not start (the engine's reason included)."""


@dataclass(frozen=True)
class EngineTransport:
    """The ``protocol`` and ``device_name`` the engine is started with, and why."""

    protocol: str
    device_name: str
    why: str
    #: RDMA was asked and cannot be had here (said at start-up as a warning)
    fallback: bool = False


def engine_transport(migration_protocol: str, rank: int | None, device_override: str,
                     rdma_devices: Sequence[str]) -> EngineTransport:
    """What LMDeploy's ``--migration-protocol`` (``MigrationProtocol`` name) means for our engine.

    ``RDMA`` starts the engine with protocol ``rdma`` (one-sided over UCX) on ``device_override``
    as given, else, as LMDeploy's own backend picks, on the RDMA device at ``rank`` modulo their
    count. LMDeploy's proxy offers no protocol but RDMA, so on a host without RDMA devices and
    without an override it is no choice of the user's: LMDeploy's own backend refuses to start
    there, ours runs tcp and says so (``fallback``). ``TCP`` is tcp. ``NVLINK`` is tcp too: the
    engine itself moves GPU memory between processes of one host over CUDA IPC (NVLink where
    the GPUs have it), whatever the protocol."""
    name = migration_protocol.upper()
    if name == "RDMA":
        if device_override:
            return EngineTransport("rdma", device_override, "MOONCAKE_LMDEPLOY_DEVICE")
        if rdma_devices:
            dev = rdma_devices[(rank or 0) % len(rdma_devices)]
            return EngineTransport("rdma", dev, f"RDMA device {dev} of {len(rdma_devices)} for rank {rank or 0}")
        return EngineTransport("tcp", "", "migration protocol RDMA but this host has no RDMA device "
                               "(/sys/class/infiniband is empty): tcp; set MOONCAKE_LMDEPLOY_DEVICE to the NICs "
                               "to run one-sided over UCX on them", fallback=True)
    if name == "TCP":
        return EngineTransport("tcp", "", "migration protocol TCP")
    if name == "NVLINK":
        return EngineTransport("tcp", "", "migration protocol NVLINK: CUDA IPC on one host, tcp between hosts")
    raise ValueError(f"LMDeploy migration protocol {migration_protocol!r} is not one the Mooncake backend "
                     "knows (RDMA, TCP, NVLINK)")


class ProcessEngine:
    """Reference-counted holder of this process's engine and its memory registrations."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engine: TransferEngine | None = None
        self._pid = 0
        self._users = 0
        self._host = ""
        self._transport = EngineTransport("tcp", "", "default")
        self._regions: dict[int, list[int]] = {}  # addr -> [length, refcount]

    # ------------------------------------------------------------ engine lifetime
    def acquire(self, host: str, transport: EngineTransport | None = None) -> TransferEngine:
        """The process's engine (started on first use, listening on ``host`` with ``transport``'s
        protocol and devices); one more user. A later link asking for another address or
        transport gets the running engine, with a warning."""
        transport = transport or EngineTransport("tcp", "", "default")
        with self._lock:
            if self._engine is not None and self._pid != os.getpid():
                # forked child: the parent's engine (its sockets and threads) is not ours to use
                self._engine, self._users, self._regions = None, 0, {}
            if self._engine is None:
                eng = TransferEngine()
                if eng.initialize(host, "P2PHANDSHAKE", transport.protocol, transport.device_name) != 0:
                    raise EngineStartError(
                        f"Mooncake Transfer Engine failed to start on {host!r} (protocol {transport.protocol!r}, "
                        f"device_name {transport.device_name!r}: {transport.why}): {eng.last_error or 'see log'} "
                        "(set MOONCAKE_LOCAL_HOSTNAME to an address of this host that peers can reach; "
                        "MOONCAKE_LMDEPLOY_DEVICE to the NICs to use)")
                self._engine, self._pid, self._host, self._transport = eng, os.getpid(), host, transport
                if transport.fallback:
                    log.warning(transport.why, extra={"session_id": eng.get_local_segment_name()})
                log.info("lmdeploy migration engine started", extra={
                    "session_id": eng.get_local_segment_name(), "host": host, "pid": self._pid,
                    "protocol": transport.protocol, "device_name": transport.device_name,
                    "transports": eng.transport_names(), "why": transport.why})
            else:
                if host != self._host:
                    log.warning("migration engine already listens on another address; keeping it", extra={
                        "listening": self._host, "requested": host})
                if (transport.protocol, transport.device_name) != (self._transport.protocol,
                                                                    self._transport.device_name):
                    log.warning("migration engine already runs with another protocol / devices; keeping it",
                                extra={"running": f"{self._transport.protocol} {self._transport.device_name}",
                                       "requested": f"{transport.protocol} {transport.device_name}"})
            self._users += 1
            return self._engine

    def release(self) -> None:
        """One user fewer; the engine is closed (port and threads freed) when none is left."""
        with self._lock:
            if self._engine is None or self._pid != os.getpid():
                return
            self._users = max(0, self._users - 1)
            if self._users:
                return
            eng, self._engine, self._regions = self._engine, None, {}
        log.info("lmdeploy migration engine closed (no link left)",
                 extra={"session_id": eng.get_local_segment_name()})
        eng.close()

    @property
    def users(self) -> int:
        return self._users

    @property
    def engine(self) -> TransferEngine | None:
        return self._engine

    # ------------------------------------------------------------ memory
    def register(self, addr: int, length: int, location: str) -> None:
        """Register ``[addr, addr+length)`` once; later links advertising it only count it."""
        with self._lock:
            eng = self._engine
            if eng is None:
                raise RuntimeError("register before the migration engine started")
            have = self._regions.get(addr)
            if have is not None:
                if have[0] != length:
                    raise ValueError(f"memory region at {addr:#x} registered with {have[0]} bytes, now "
                                     f"advertised with {length}; the KV pool changed under a live link")
                have[1] += 1
                return
            if eng.register_memory(addr, length, location) != 0:
                raise RuntimeError(f"cannot register KV pool memory {addr:#x}+{length} ({location}): "
                                   f"{eng.last_error or 'see log'}")
            self._regions[addr] = [length, 1]

    def unregister(self, addr: int) -> None:
        """Drop one count of a region; unregistered from the engine at zero."""
        with self._lock:
            have = self._regions.get(addr)
            if have is None or self._engine is None:
                return
            have[1] -= 1
            if have[1] > 0:
                return
            del self._regions[addr]
            self._engine.unregister_memory(addr)

    def registered(self) -> dict[int, int]:
        """addr -> length of what is registered now (tests, diagnostics)."""
        with self._lock:
            return {a: v[0] for a, v in self._regions.items()}


#: the one holder of this process
PROCESS_ENGINE = ProcessEngine()
