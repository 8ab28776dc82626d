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

from mooncake_core.engine import TransferEngine
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.lmdeploy")


class EngineStartError(RuntimeError):
    """The Transfer Engine could not start (the engine's reason included)."""


class ProcessEngine:
    """Reference-counted holder of this process's engine and its memory registrations."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engine: TransferEngine | None = None
        self._pid = 0
        self._users = 0
        self._host = ""
        self._regions: dict[int, list[int]] = {}  # addr -> [length, refcount]

    # ------------------------------------------------------------ engine lifetime
    def acquire(self, host: str) -> TransferEngine:
        """The process's engine (started on first use, listening on ``host``); one more user."""
        with self._lock:
            if self._engine is not None and self._pid != os.getpid():
                # forked child: the parent's engine (its sockets and threads) is not ours to use
                self._engine, self._users, self._regions = None, 0, {}
            if self._engine is None:
                eng = TransferEngine()
                if eng.initialize(host, "P2PHANDSHAKE", "tcp", "") != 0:
                    raise EngineStartError(f"Mooncake Transfer Engine failed to start on {host!r}: "
                                           f"{eng.last_error or 'see log'} (set MOONCAKE_LOCAL_HOSTNAME to an "
                                           "address of this host that peers can reach)")
                self._engine, self._pid, self._host = eng, os.getpid(), host
                log.info("lmdeploy migration engine started", extra={
                    "session_id": eng.get_local_segment_name(), "host": host, "pid": self._pid})
            elif host != self._host:
                log.warning("migration engine already listens on another address; keeping it", extra={
                    "listening": self._host, "requested": host})
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
