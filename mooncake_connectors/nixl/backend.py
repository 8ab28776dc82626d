"""Python side of the NIXL ``MooncakeCore`` backend: what ``libplugin_MooncakeCore.so`` calls.

The C++ plugin (``csrc/``) answers NIXL's capability and bookkeeping calls itself and calls
this module only to register memory, move bytes and exchange notifications -- always with
the GIL held by the calling plugin thread, and always getting an int back (a NIXL status:
0 success, negative error), never an exception. One adapter (one ``TransferEngine``) per
NIXL agent backend; its segment name is the connection info NIXL ships to peers.

Notifications: NIXL messages are arbitrary bytes and each carries the sender's NIXL agent
name. They travel as the TE's ``TransferNotify(name=<agent>, msg=<bytes as latin-1 text>)``
(latin-1 maps every byte to one code point, so any message round-trips exactly); a message
that goes with a transfer is sent by the TE after the transfer's data, so the receiver never
sees the notification before the bytes.

Targets nixl 1.5.1's backend interface (see ``abi.py`` for the checks).
"""

from __future__ import annotations

import enum
import threading

import numpy as np

from mooncake_core.engine import TransferEngine, TransferNotify, TransferOpcode
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.net import local_ip
from mooncake_connectors.nixl.config import BackendConfig, parse_params

log = get_logger("mooncake.nixl")

#: version of the call contract between this module and the C++ plugin (kAdapterAbi there);
#: 2: ``register`` takes the NIXL device id (-1 for DRAM, the GPU ordinal for VRAM)
ADAPTER_ABI = 2

#: batches shorter than this are handed to the engine as lists (its per-request path);
#: longer ones as int64 arrays (its vectorised path)
_ARRAY_MIN = 64


class NixlStatus(enum.IntEnum):
    """NIXL status codes (nixl_status_t) this module returns."""

    SUCCESS = 0
    ERR_INVALID_PARAM = -2
    ERR_BACKEND = -3
    ERR_NOT_FOUND = -4


def _text(msg: bytes) -> str:
    return msg.decode("latin-1")


def _raw(msg: str) -> bytes:
    try:
        return msg.encode("latin-1")
    except UnicodeEncodeError:  # not from a NIXL peer (those send latin-1 text): keep it readable
        return msg.encode("utf-8")


class NixlAdapter:
    """One NIXL backend instance on one Transfer Engine (see module docstring)."""

    def __init__(self, agent_name: str, cfg: BackendConfig):
        self.agent_name = agent_name
        self.num_workers = cfg.num_workers
        self.engine = TransferEngine()
        rc = self.engine.initialize(cfg.local_hostname, cfg.metadata_server, cfg.protocol, cfg.device_name)
        if rc != 0:
            raise RuntimeError(f"MooncakeCore: Transfer Engine initialize({cfg.local_hostname!r}, "
                               f"{cfg.metadata_server!r}, {cfg.protocol!r}, {cfg.device_name!r}) failed: "
                               f"{self.engine.last_error}")
        self.conn_segment = self.engine.get_local_segment_name().encode()
        self._regs: dict[tuple[int, int], int] = {}  # (addr, length) -> registrations
        self._addr_len: dict[int, int] = {}
        self._lock = threading.Lock()
        log.info("NIXL MooncakeCore backend ready", extra={"agent": agent_name,
                                                           "segment": self.conn_segment.decode(),
                                                           "workers": cfg.num_workers,
                                                           "protocol": cfg.protocol,
                                                           "device_name": cfg.device_name,
                                                           "transports": self.engine.transport_names()})

    # ------------------------------------------------------------ memory
    def register(self, addr: int, length: int, device: int = -1) -> int:
        """Register [addr, addr+length) with the TE: DRAM (``device`` -1) as host memory, VRAM
        as ``cuda:<device>``. NIXL may register one range more than once (several descriptor
        lists naming the same buffer); the TE holds one region."""
        with self._lock:
            key = (addr, length)
            if key in self._regs:
                self._regs[key] += 1
                return NixlStatus.SUCCESS
            # DRAM as "*": a GPU pointer registered as DRAM is still found as cuda:N
            location = "*" if device < 0 else f"cuda:{device}"
            if self.engine.register_memory(addr, length, location) != 0:
                kind = "DRAM" if device < 0 else f"VRAM (GPU {device})"
                log.error(f"NIXL registerMem of {kind} failed: {self.engine.last_error}",
                          extra={"agent": self.agent_name, "addr": hex(addr), "length": length})
                return NixlStatus.ERR_BACKEND
            self._regs[key] = 1
            self._addr_len[addr] = length
            return NixlStatus.SUCCESS

    def deregister(self, addr: int) -> int:
        with self._lock:
            length = self._addr_len.get(addr)
            if length is None:
                return NixlStatus.ERR_NOT_FOUND
            key = (addr, length)
            self._regs[key] -= 1
            if self._regs[key] > 0:
                return NixlStatus.SUCCESS
            del self._regs[key], self._addr_len[addr]
            return NixlStatus.SUCCESS if self.engine.unregister_memory(addr) == 0 else NixlStatus.ERR_BACKEND

    # ------------------------------------------------------------ transfers
    def transfer(self, segment: bytes, write: int, words: bytes, count: int, notif: bytes | None) -> int:
        """Run one posted NIXL request to completion (called on a plugin worker thread).

        ``words`` holds ``count`` local addresses, then ``count`` remote addresses, then
        ``count`` lengths (native uint64). Returns 0 or a negative NIXL status."""
        try:
            cols = np.frombuffer(words, dtype=np.int64, count=3 * count).reshape(3, count)
            if count < _ARRAY_MIN:
                local, remote, length = cols.tolist()
            else:
                local, remote, length = cols[0], cols[1], cols[2]
            note = TransferNotify(self.agent_name, _text(notif)) if notif is not None else None
            op = TransferOpcode.WRITE if write else TransferOpcode.READ
            rc = self.engine.batch_transfer_sync(segment.decode(), local, remote, length, op, note)
        except Exception as e:  # the plugin must get a status, never an exception
            log.error("NIXL transfer failed", extra={"agent": self.agent_name, "error": repr(e)})
            return NixlStatus.ERR_BACKEND
        if rc != 0:
            log.error("NIXL transfer failed", extra={"agent": self.agent_name, "segment": segment.decode(),
                                                     "op": "WRITE" if write else "READ", "descriptors": count,
                                                     "error": self.engine.last_error})
            return NixlStatus.ERR_BACKEND
        return NixlStatus.SUCCESS

    # ------------------------------------------------------------ notifications
    def notify(self, segment: bytes, msg: bytes) -> int:
        """A notification not bound to a transfer (NIXL genNotif)."""
        try:
            rc = self.engine.batch_transfer_sync(segment.decode(), [], [], [], TransferOpcode.WRITE,
                                                 TransferNotify(self.agent_name, _text(msg)))
        except Exception as e:
            log.error("NIXL genNotif failed", extra={"agent": self.agent_name, "error": repr(e)})
            return NixlStatus.ERR_BACKEND
        if rc != 0:
            log.error("NIXL genNotif failed", extra={"agent": self.agent_name, "segment": segment.decode(),
                                                     "error": self.engine.last_error})
            return NixlStatus.ERR_BACKEND
        return NixlStatus.SUCCESS

    def drain_notifs(self) -> list[tuple[bytes, bytes]]:
        """Notifications received since the last call, as (sender agent, message) bytes."""
        return [(n.name.encode(), _raw(n.msg)) for n in self.engine.get_notifies()]

    def close(self) -> int:
        self.engine.close()
        return NixlStatus.SUCCESS


def create(agent_name: bytes, params: tuple[tuple[bytes, bytes], ...]) -> NixlAdapter:
    """Called by the plugin's create_engine (GIL held). Raises on bad params: the plugin
    prints the error and NIXL reports a backend initialization error."""
    cfg = parse_params({k.decode(): v.decode() for k, v in params}, default_host=local_ip())
    return NixlAdapter(agent_name.decode(), cfg)
