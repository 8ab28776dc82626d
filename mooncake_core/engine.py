"""``TransferEngine``: Mooncake's Python Transfer Engine API, implemented in Python.

A script written for ``from mooncake.engine import TransferEngine`` runs unchanged with
``from mooncake_core.engine import TransferEngine``: same method names, argument order and
integer return codes (0 ok, negative on failure; ``transfer_check_status`` 1 done / 0 pending
/ -1 failed / -2 timeout; ``allocate_managed_buffer`` 0 on failure).

How it works (see docs/transfer-engine.md):
* ``initialize`` binds the rpc/data port (MC_TCP_BIND_ADDRESS, default the host of local_hostname), publishes
  this process's segment descriptor (``mooncake/ram/<segment>``) and rpc endpoint
  (``mooncake/rpc_meta/<segment>``) to the metadata service -- or, with P2PHANDSHAKE, serves
  the descriptor on the rpc port itself;
* on first contact with a target segment the engine fetches its descriptor and picks one
  transport per peer, logged: ``local`` (memmove, same process), ``cma`` (process_vm_*v,
  same host) or ``tcp`` (anything else, or when MC_FORCE_TCP=1);
* every wait is bounded by MC_TRANSFER_TIMEOUT (default 30 s, plus 1 s per GiB) and every
  remote range is bounds-checked against the target's registered regions.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

from mooncake_core.errors import ErrorCode
from mooncake_core.transfer import metrics
from mooncake_core.transfer.base import TRANSPORTS, Transport, TransferError, TransferOpcode, TransferRequest
from mooncake_core.transfer.batch import BatchState, BatchTable
from mooncake_core.transfer.cma import CmaTransport
from mooncake_core.transfer.descriptor import (SegmentDescriptor, host_identity, process_start_time, ram_key,
                                               rpc_meta_key)
from mooncake_core.transfer.local import LocalTransport, local_engine, publish_local, unpublish_local
from mooncake_core.transfer.managed import ManagedPool
from mooncake_core.transfer.memory import WILDCARD_LOCATION, Region, RegionTable, memview
from mooncake_core.transfer.tcp import TcpTransport
from mooncake_core.transfer.tcp_server import TcpServer
from mooncake_core.transfer import vec
from mooncake_core.transfer.wire import Op, Status
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.net import parse_host_port

log = get_logger("mooncake.te")

P2PHANDSHAKE = "P2PHANDSHAKE"
SUPPORTED_PROTOCOLS = ("tcp", "rdma")
_HINTS = {"": None, "unspec": None, "tcp": "tcp", "shm": "cma", "cma": "cma", "local": "local"}

__all__ = ["TransferEngine", "TransferOpcode", "TransferNotify"]


class TransferNotify:
    """A notification delivered with a transfer (Mooncake's ``TransferNotify(name, msg)``)."""

    def __init__(self, name: str = "", msg: str = ""):
        self.name = name
        self.msg = msg

    def __repr__(self) -> str:
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TransferNotify) and (self.name, self.msg) == (other.name, other.msg)


def _timeout_s() -> float:
    v = os.environ.get("MC_TRANSFER_TIMEOUT", "30")
    try:
        t = float(v)
    except ValueError:
        log.warning("MC_TRANSFER_TIMEOUT is not a number, using 30", extra={"value": v})
        return 30.0
    return t if t > 0 else 30.0


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _check_hint(hint: str) -> None:
    """Mooncake raises invalid_argument for an unknown hint; so do we (a programming error)."""
    if hint not in _HINTS:
        raise ValueError(f"unknown transport_hint {hint!r} (valid: tcp, shm, local, or '' for automatic)")


def _rdma_devices() -> list[str]:
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []


@dataclass
class _Peer:
    name: str
    desc: SegmentDescriptor
    transport: Transport
    dispatch: ThreadPoolExecutor  # async batches to this peer only (per-peer isolation)


def _default_bind(host: str) -> str:
    """Where to listen when ``MC_TCP_BIND_ADDRESS`` is unset: the address peers are told to
    connect to (the host of ``local_hostname``), so a segment named ``10.0.0.1:port`` is
    reachable on 10.0.0.1 and nowhere else; loopback for "localhost" or an unresolvable name."""
    import ipaddress
    import socket

    h = host.strip().strip("[]")
    if not h or h == "localhost":
        return "127.0.0.1"
    try:
        ipaddress.ip_address(h)
        return h
    except ValueError:
        pass
    try:
        return socket.gethostbyname(h)
    except OSError:
        return "127.0.0.1"


class TransferEngine:
    """Mooncake-compatible Transfer Engine (see module docstring)."""

    TransferOpcode = TransferOpcode

    def __init__(self) -> None:
        self.regions = RegionTable()
        self._order: dict[int, Region] = {}  # registration order, published as-is
        self._lock = threading.RLock()
        self._peers: dict[str, _Peer] = {}
        self._peer_locks: dict[str, threading.Lock] = {}
        self._batches = BatchTable()
        self._notifies: list[TransferNotify] = []
        self._notify_lock = threading.Lock()
        self._server: TcpServer | None = None
        self._meta = None
        self._segment = ""
        self._generation = 0
        self._initialized = False
        self._closed = False
        self._stop = threading.Event()
        self._managed: ManagedPool | None = None
        self._tcp: TcpTransport | None = None
        self._cma: CmaTransport | None = None
        self._local: LocalTransport | None = None
        self._extra: dict[str, Transport] = {}
        self._protocol = "tcp"
        self._boot_id, self._pidns = host_identity()
        self._start_time = process_start_time()
        self.timeout = _timeout_s()
        self.last_error = ""

    # ================================================================== setup
    def initialize(self, local_hostname: str, metadata_server: str, protocol: str = "tcp",
                   device_name: str = "") -> int:
        """Start the engine. Returns 0 on success, -1 on failure (reason logged, ``last_error``)."""
        if metadata_server == P2PHANDSHAKE or metadata_server is None:
            return self.initialize_ext(local_hostname, P2PHANDSHAKE, protocol, device_name, "")
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, "")

    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str = "tcp",
                       device_name: str = "", metadata_type: str = "", *,
                       metrics_port: int | None = None) -> int:
        """Like ``initialize`` with an explicit metadata type ("etcd", "http", "redis", "p2p")."""
        try:
            self._init(local_hostname, metadata_server, protocol, device_name, metadata_type, metrics_port)
            return 0
        except Exception as e:  # the API contract is an int, never an exception
            self.last_error = str(e)
            log.error("transfer engine initialize failed", extra={"error": str(e),
                                                                   "local_hostname": local_hostname,
                                                                   "metadata_server": metadata_server})
            self._teardown()
            return -1

    def _init(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str,
              metadata_type: str, metrics_port: int | None) -> None:
        if self._initialized:
            raise RuntimeError("TransferEngine.initialize called twice on the same engine")
        if not isinstance(local_hostname, str) or not local_hostname.strip():
            raise ValueError(f"local_hostname must be 'host' or 'host:port', got {local_hostname!r}")
        protocol = (protocol or "tcp").lower()
        if protocol not in SUPPORTED_PROTOCOLS:
            raise ValueError(f"protocol {protocol!r} is not supported (supported: {', '.join(SUPPORTED_PROTOCOLS)})")
        if protocol == "rdma":
            devs = _rdma_devices()
            log.warning("protocol 'rdma' requested but this build has no RDMA transport"
                        + (f" (devices present: {devs})" if devs else " and no RDMA devices were found")
                        + "; using tcp / same-host transports instead", extra={"device_name": device_name})
        self._protocol = "tcp"

        conn = (metadata_server or "").strip()
        if metadata_type and metadata_type.lower() in ("p2p", "p2phandshake"):
            conn = P2PHANDSHAKE
        elif metadata_type and conn != P2PHANDSHAKE and "://" not in conn:
            conn = f"{metadata_type}://{conn}"
        from mooncake_core.metadata import open_metadata  # late: keeps import light
        self._meta = open_metadata(conn, timeout=min(10.0, self.timeout))
        p2p = self._meta is None

        host, port = parse_host_port(local_hostname, 0, what="local_hostname")
        bind = os.environ.get("MC_TCP_BIND_ADDRESS", "").strip() or _default_bind(host)
        try:
            self._server = TcpServer(bind, port, self.regions, self._descriptor_json, self._on_notify,
                                     lambda: self._segment)
        except OSError:
            if port == 0 or p2p:
                raise
            log.warning("rpc port from local_hostname is busy, picking a free one",
                        extra={"port": port, "segment": local_hostname})
            self._server = TcpServer(bind, 0, self.regions, self._descriptor_json, self._on_notify,
                                     lambda: self._segment)
        self._data_host = bind if bind not in ("0.0.0.0", "::", "") else host
        self._segment = f"{host}:{self._server.port}" if p2p else local_hostname.strip()

        self._tcp = TcpTransport()
        self._cma = CmaTransport()
        self._local = LocalTransport()
        self._managed = ManagedPool(self._register_quiet, self._unregister_quiet)
        self._initialized = True
        publish_local(self._segment, self)

        if not p2p:
            self._meta.set(rpc_meta_key(self._segment), {"ip_or_host_name": self._data_host,
                                                         "rpc_port": self._server.port})
            self._publish()
            threading.Thread(target=self._republish_loop, name="te-republish", daemon=True).start()

        port_m = metrics_port if metrics_port is not None else (
            int(os.environ["MC_METRICS_PORT"]) if os.environ.get("MC_METRICS_PORT") else None)
        if port_m is not None:
            metrics.serve_metrics(port_m)

        ref = weakref.ref(self)
        atexit.register(lambda: (lambda e: e and e.close())(ref()))
        log.info("transfer engine ready", extra={
            "segment": self._segment, "rpc_port": self._server.port, "bind": bind,
            "metadata": "P2PHANDSHAKE" if p2p else conn, "force_tcp": _truthy("MC_FORCE_TCP")})

    def get_rpc_port(self) -> int:
        return self._server.port if self._server else -1

    def get_engine(self) -> "TransferEngine":
        """The engine object itself: SGLang's wrapper hands it to ``store.setup`` so a
        HiCache store shares this engine, as with Mooncake's ``get_engine()``."""
        return self

    def get_local_segment_name(self) -> str:
        """This engine's segment name (``host:rpc_port`` under P2PHANDSHAKE)."""
        return self._segment

    def get_local_topology(self, device_name: str | None = None) -> str:
        """JSON text describing the devices this engine can use (CPU only here, plus RDMA NICs seen)."""
        return json.dumps({"cpu:0": {"preferred_hca": [], "avail_hca": _rdma_devices()},
                           "transports": sorted(set(TRANSPORTS))})

    # ================================================================== descriptor publishing
    def _descriptor(self) -> SegmentDescriptor:
        with self._lock:
            bufs = list(self._order.values())
            gen = self._generation
        return SegmentDescriptor(name=self._segment, host=self._data_host,
                                 port=self._server.port if self._server else 0, protocol=self._protocol,
                                 buffers=bufs, boot_id=self._boot_id, pidns=self._pidns, pid=os.getpid(),
                                 start_time=self._start_time, generation=gen)

    def _descriptor_json(self) -> dict:
        return self._descriptor().to_json()

    def _publish(self) -> None:
        if self._meta is not None and not self._closed:
            self._meta.set(ram_key(self._segment), self._descriptor_json())

    def _publish_soft(self) -> None:
        """Publish after a (un)registration; if the metadata service is down the local change
        stands and the republish loop catches up once it is back (DESIGN §6)."""
        try:
            self._publish()
        except Exception as e:
            log.warning("could not publish segment descriptor now; will re-publish when the metadata "
                        "service is reachable", extra={"segment": self._segment, "error": str(e)})

    def _republish_loop(self) -> None:
        """Re-publish when the key vanished (e.g. the HTTP metadata server restarted, DESIGN §6)."""
        period = float(os.environ.get("MC_METADATA_REFRESH_S", "2"))
        warned = False
        while not self._stop.wait(period):
            try:
                cur = self._meta.get(ram_key(self._segment))
                if cur is None or cur.get("generation") != self._generation or cur.get("pid") != os.getpid():
                    self._publish()
                    self._meta.set(rpc_meta_key(self._segment), {"ip_or_host_name": self._data_host,
                                                                 "rpc_port": self._server.port})
                    log.info("re-published segment descriptor", extra={"segment": self._segment})
                warned = False
            except Exception as e:
                if not warned:
                    log.warning("metadata service unreachable, will retry", extra={"error": str(e)})
                    warned = True

    def _on_notify(self, name: str, msg: str) -> None:
        with self._notify_lock:
            self._notifies.append(TransferNotify(name, msg))

    # ================================================================== memory registration
    def _check_ready(self) -> None:
        if not self._initialized or self._closed:
            raise RuntimeError("TransferEngine is not initialized (call initialize first)" if not self._closed
                               else "TransferEngine is closed")

    def _add_region(self, addr: int, length: int, location: str) -> None:
        location = location or WILDCARD_LOCATION
        if location.startswith("cuda") and "cuda" not in TRANSPORTS:
            raise ValueError(f"location {location!r}: GPU memory needs a cuda transport, which this build "
                             "does not have; register host memory (location 'cpu:0' or '*')")
        r = Region(int(addr), int(length), location)
        self.regions.add(r)
        with self._lock:
            self._order[r.addr] = r
            self._generation += 1

    def _register_quiet(self, addr: int, length: int) -> int:
        try:
            self._add_region(addr, length, "cpu:0")
            self._publish_soft()
            return 0
        except Exception as e:
            log.error("register managed pool failed", extra={"error": str(e)})
            return -1

    def _unregister_quiet(self, addr: int) -> int:
        return self.unregister_memory(addr)

    def register_memory(self, buffer_addr: int, capacity: int, location: str = WILDCARD_LOCATION) -> int:
        """Register [buffer_addr, buffer_addr+capacity) for remote access. 0 ok, -1 on failure."""
        try:
            self._check_ready()
            self._add_region(buffer_addr, capacity, location)
            self._publish_soft()
            return 0
        except Exception as e:
            self.last_error = str(e)
            log.error("register_memory failed", extra={"addr": buffer_addr, "length": capacity, "error": str(e)})
            return -1

    def unregister_memory(self, buffer_addr: int) -> int:
        try:
            self._check_ready()
            if self.regions.remove(int(buffer_addr)) is None:
                raise ValueError(f"address {int(buffer_addr):#x} is not the start of a registered region")
            with self._lock:
                self._order.pop(int(buffer_addr), None)
                self._generation += 1
            self._publish_soft()
            return 0
        except Exception as e:
            self.last_error = str(e)
            log.error("unregister_memory failed", extra={"addr": buffer_addr, "error": str(e)})
            return -1

    def batch_register_memory(self, buffer_addresses: Sequence[int], capacities: Sequence[int],
                              location: str = WILDCARD_LOCATION) -> int:
        try:
            self._check_ready()
            if len(buffer_addresses) != len(capacities):
                raise ValueError(f"{len(buffer_addresses)} addresses but {len(capacities)} capacities")
            done = []
            try:
                for a, n in zip(buffer_addresses, capacities):
                    self._add_region(a, n, location)
                    done.append(int(a))
            except Exception:
                for a in done:
                    self.regions.remove(a)
                    with self._lock:
                        self._order.pop(a, None)
                raise
            self._publish_soft()
            return 0
        except Exception as e:
            self.last_error = str(e)
            log.error("batch_register_memory failed", extra={"error": str(e)})
            return -1

    def batch_unregister_memory(self, buffer_addresses: Sequence[int]) -> int:
        rc = 0
        for a in buffer_addresses:
            if self.regions.remove(int(a)) is None:
                rc = -1
            with self._lock:
                self._order.pop(int(a), None)
                self._generation += 1
        self._publish_soft()
        return rc

    def allocate_managed_buffer(self, length: int) -> int:
        """Address of a registered buffer of ``length`` bytes from the managed pool; 0 on failure."""
        if not self._initialized or self._managed is None:
            return 0
        return self._managed.allocate(length)

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        if self._managed is None:
            return -1
        return self._managed.free(buffer_addr, length)

    def write_bytes_to_buffer(self, dest_address: int, src_ptr: bytes, length: int) -> int:
        """Copy ``length`` bytes of ``src_ptr`` to ``dest_address`` (must be registered memory)."""
        if length < 0 or length > len(src_ptr) or not self.regions.contains(dest_address, length):
            log.error("write_bytes_to_buffer: range not inside a registered buffer",
                      extra={"addr": dest_address, "length": length})
            return -1
        memview(dest_address, length)[:] = memoryview(src_ptr)[:length]
        return 0

    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        if length < 0 or not self.regions.contains(source_address, length):
            raise ValueError(f"read_bytes_from_buffer: {length} bytes at {source_address:#x} "
                             "are not inside a registered buffer")
        return bytes(memview(source_address, length, writable=False))

    # ================================================================== peers
    def _fetch_descriptor(self, name: str) -> SegmentDescriptor:
        if name == self._segment:  # never loop through a socket to ourselves
            return self._descriptor()
        other = local_engine(name)
        if other is not None and isinstance(other, TransferEngine) and not other._closed:
            return other._descriptor()  # another engine in this process: no metadata round trip
        deadline = time.monotonic() + min(self.timeout, 10.0)
        if self._meta is not None:
            d = self._meta.get(ram_key(name))
            if d is None:
                raise TransferError(f"segment {name!r} not found in the metadata service "
                                    f"(no key {ram_key(name)!r}); is the peer initialized?",
                                    ErrorCode.SEGMENT_NOT_FOUND)
            return SegmentDescriptor.from_json(d, expect_name=name)
        # P2PHANDSHAKE: ask the peer itself on its rpc port
        try:
            host, port = parse_host_port(name, what="target segment")
        except ValueError as e:
            raise TransferError(f"P2PHANDSHAKE target must be 'host:rpc_port': {e}",
                                ErrorCode.SEGMENT_NOT_FOUND) from None
        status, aux = self._tcp.control(host, port, name, Op.GET_DESC, b"", deadline)
        if status != Status.OK:
            raise TransferError(f"segment {name!r}: descriptor request refused: {aux.decode(errors='replace')}")
        desc = SegmentDescriptor.from_json(json.loads(aux), expect_name=name)
        if desc.name != name:  # name under which we reach it is authoritative
            desc.name = name
        return desc

    def _choose(self, desc: SegmentDescriptor) -> Transport:
        if _truthy("MC_FORCE_TCP"):
            return self._tcp
        if self._local.can_reach(desc):
            return self._local
        if self._cma.can_reach(desc):
            return self._cma
        if desc.boot_id and desc.boot_id == self._boot_id:
            # loud on purpose: a same-host peer silently on tcp is what users of the original
            # could not tell from a working setup (DESIGN.md §6)
            log.warning("peer on this host but cross-memory attach is unavailable (another pid "
                        "namespace, or attach not permitted); using tcp", extra={"segment": desc.name})
        return self._tcp

    def _peer(self, name: str, refresh: bool = False) -> _Peer:
        with self._lock:
            p = self._peers.get(name)
            if p is not None and not refresh:
                return p
            plock = self._peer_locks.setdefault(name, threading.Lock())
        with plock:
            with self._lock:
                p = self._peers.get(name)
            if p is not None and not refresh:
                return p
            desc = self._fetch_descriptor(name)
            transport = self._choose(desc)
            if p is not None:
                p.desc, p.transport = desc, transport
            else:
                p = _Peer(name, desc, transport,
                          ThreadPoolExecutor(max_workers=2, thread_name_prefix="te-peer"))
                log.info("transport selected for peer", extra={"segment": name, "transport": transport.name,
                                                               "host": desc.host, "port": desc.port})
            with self._lock:
                self._peers[name] = p
            return p

    def _forget_peer(self, name: str) -> None:
        with self._lock:
            p = self._peers.pop(name, None)
        if p is not None:
            p.dispatch.shutdown(wait=False)
            if self._tcp is not None:
                self._tcp.drop_peer(p.desc.host, p.desc.port)

    def _pick(self, peer: _Peer, hint: str) -> Transport:
        want = _HINTS[hint]
        if want is None:
            return peer.transport
        t = {"tcp": self._tcp, "cma": self._cma, "local": self._local}[want]
        if not t.can_reach(peer.desc):
            raise TransferError(f"transport {hint!r} cannot reach segment {peer.name!r}")
        return t

    def _check_bounds(self, peer: _Peer, reqs: list[TransferRequest]) -> None:
        """Initiator-side check against the published regions. Required for cma/local (the target
        is not involved); for tcp the target checks again, but checking here too means a batch
        with one bad entry is refused whole instead of half-executed."""
        for attempt in (0, 1):
            bad = next((r for r in reqs if peer.desc.find_region(r.remote_addr, r.length) is None), None)
            if bad is None:
                return
            if attempt == 0:  # the target may have registered more memory since we looked
                peer = self._peer(peer.name, refresh=True)
        raise TransferError(f"{bad.opcode.name.lower()} of {bad.length} bytes at {bad.remote_addr:#x} is outside "
                            f"every region registered by segment {peer.name!r}", ErrorCode.INVALID_PARAMS)

    def _check_local(self, reqs: list[TransferRequest]) -> None:
        for r in reqs:
            if r.length < 0 or r.local_addr <= 0 or r.remote_addr < 0:
                raise TransferError(f"invalid request: local={r.local_addr:#x} remote={r.remote_addr:#x} "
                                    f"length={r.length}", ErrorCode.INVALID_PARAMS)

    def _make_reqs(self, opcode, buffers, peers, lengths) -> list[TransferRequest]:
        if not (len(buffers) == len(peers) == len(lengths)):
            raise TransferError(f"buffers ({len(buffers)}), peer_buffer_addresses ({len(peers)}) and lengths "
                                f"({len(lengths)}) must have the same length", ErrorCode.INVALID_PARAMS)
        op = TransferOpcode(int(opcode))
        reqs = [TransferRequest(op, int(b), int(p), int(n)) for b, p, n in zip(buffers, peers, lengths)]
        self._check_local(reqs)
        return reqs

    def _deadline(self, nbytes: int) -> float:
        return time.monotonic() + self.timeout + nbytes / float(1 << 30)

    def _execute(self, peer: _Peer, transport: Transport, reqs: list[TransferRequest], deadline: float,
                 notify: TransferNotify | None) -> None:
        self._check_bounds(peer, reqs)  # refuse a bad batch as a whole, before any byte moves
        t0 = time.perf_counter()
        nbytes = sum(r.length for r in reqs)
        opname = reqs[0].opcode.name.lower() if reqs else "none"
        ok = False
        try:
            if reqs:
                transport.transfer(peer.desc, reqs, deadline)
            if notify is not None:
                self._send_notify(peer, notify, deadline)
            ok = True
        except TransferError as e:
            if e.peer_down:
                self._forget_peer(peer.name)  # peer may be gone or restarted: re-resolve next time
            raise
        finally:
            metrics.record(transport.name, opname, nbytes, len(reqs), time.perf_counter() - t0, ok)

    def _send_notify(self, peer: _Peer, notify: TransferNotify, deadline: float) -> None:
        aux = json.dumps({"name": notify.name, "msg": notify.msg}).encode()
        status, raux = self._tcp.control(peer.desc.host, peer.desc.port, peer.name, Op.NOTIFY, aux, deadline)
        if status != Status.OK:
            raise TransferError(f"segment {peer.name!r} refused notify: {raux.decode(errors='replace')}")

    def _sync1(self, target: str, opcode: TransferOpcode, local: int, remote: int, length: int, hint: str) -> int:
        """Single synchronous request: a short path for the common small tcp case, else ``_sync``.

        Same checks as the general path (bounds against the cached descriptor, deadline,
        per-peer connection handling), just without building batch structures.
        """
        peer = self._peers.get(target)
        tcp = self._tcp
        if (peer is None or (peer.transport is not tcp and hint != "tcp") or hint not in ("", "tcp")
                or not 0 < length <= tcp.slice_size or local <= 0 or self._closed
                or peer.desc.find_region(remote, length) is None):
            return self._sync(target, opcode, [local], [remote], [length], hint=hint)
        t0 = time.perf_counter()
        opname = "write" if opcode == 1 else "read"
        try:
            tcp.transfer_one(peer.desc, opcode, local, remote, length,
                             time.monotonic() + self.timeout + length / 1073741824.0)
        except TransferError as e:
            metrics.record("tcp", opname, length, 1, time.perf_counter() - t0, False)
            if e.peer_down:
                self._forget_peer(target)
            self.last_error = str(e)
            log.error("transfer failed", extra={"target": target, "error": str(e)})
            return -1
        metrics.record("tcp", opname, length, 1, time.perf_counter() - t0, True)
        return 0

    def _sync(self, target: str, opcode, buffers, peers, lengths, notify=None, hint: str = "") -> int:
        _check_hint(hint)
        if len(buffers) >= vec.VEC_MIN:
            rc = self._sync_vec(target, opcode, buffers, peers, lengths, notify, hint)
            if rc is not None:
                return rc
        try:
            self._check_ready()
            reqs = self._make_reqs(opcode, buffers, peers, lengths)
            peer = self._peer(target)
            transport = self._pick(peer, hint)
            self._execute(peer, transport, reqs, self._deadline(sum(r.length for r in reqs)), notify)
            return 0
        except Exception as e:
            self.last_error = str(e)
            log.error("transfer failed", extra={"target": target, "error": str(e)})
            return -1

    def _vec_batch(self, peer: _Peer, transport: Transport, opcode, buffers, peers, lengths):
        """(op, local, remote, length, move) for a large batch to a transport that takes arrays
        (cma): validated and bounds-checked with numpy, no per-request objects (transfer/vec.py).
        None -- take the general path, which reports the exact offending entry -- when the batch
        is short, not plain valid integers, outside the cached descriptor, or the transport has
        no array path."""
        move = getattr(transport, "transfer_arrays", None)
        if move is None or len(buffers) < vec.VEC_MIN:
            return None
        arrs = vec.as_arrays(buffers, peers, lengths)
        if arrs is None or not vec.locals_ok(*arrs) or not vec.in_bounds(peer.desc, arrs[1], arrs[2]):
            return None
        try:
            op = TransferOpcode(int(opcode))
        except (TypeError, ValueError):
            return None
        return op, arrs[0], arrs[1], arrs[2], move

    def _execute_vec(self, peer: _Peer, transport: Transport, plan, deadline: float,
                     notify: TransferNotify | None) -> None:
        op, local, remote, length, move = plan
        t0 = time.perf_counter()
        ok = False
        try:
            move(peer.desc, op, local, remote, length, deadline)
            if notify is not None:
                self._send_notify(peer, notify, deadline)
            ok = True
        except TransferError as e:
            if e.peer_down:
                self._forget_peer(peer.name)
            raise
        finally:
            metrics.record(transport.name, op.name.lower(), int(length.sum()), len(length),
                           time.perf_counter() - t0, ok)

    def _sync_vec(self, target: str, opcode, buffers, peers, lengths, notify, hint: str) -> int | None:
        """``_sync`` for a large batch (see ``_vec_batch``); None: use the general path."""
        try:
            self._check_ready()
            peer = self._peer(target)
            transport = self._pick(peer, hint)
            plan = self._vec_batch(peer, transport, opcode, buffers, peers, lengths)
            if plan is None:
                return None
            self._execute_vec(peer, transport, plan, self._deadline(int(plan[3].sum())), notify)
            return 0
        except Exception as e:
            self.last_error = str(e)
            log.error("transfer failed", extra={"target": target, "error": str(e)})
            return -1

    def _submit(self, target: str, opcode, buffers, peers, lengths, hint: str = "",
                open_fail: int = -1, other_fail: int = 0) -> int:
        _check_hint(hint)
        try:
            self._check_ready()
            peer = self._peer(target)
        except Exception as e:
            self.last_error = str(e)
            log.error("cannot open segment", extra={"target": target, "error": str(e)})
            return open_fail
        try:
            transport = self._pick(peer, hint)
            plan = self._vec_batch(peer, transport, opcode, buffers, peers, lengths)
            if plan is None:
                reqs = self._make_reqs(opcode, buffers, peers, lengths)
                nbytes = sum(r.length for r in reqs)
            else:
                reqs, nbytes = [], int(plan[3].sum())
        except Exception as e:
            self.last_error = str(e)
            log.error("transfer submit failed", extra={"target": target, "error": str(e)})
            return other_fail
        deadline = self._deadline(nbytes)
        b = self._batches.new(deadline, nbytes)

        def run(state: BatchState = b) -> None:
            try:
                if plan is not None:
                    self._execute_vec(peer, transport, plan, deadline, None)
                else:
                    self._execute(peer, transport, reqs, deadline, None)
                state.finish(None)
            except Exception as e:
                log.error("async transfer failed", extra={"target": target, "batch_id": state.batch_id,
                                                          "error": str(e)})
                state.finish(str(e) or type(e).__name__)

        try:
            peer.dispatch.submit(run)
        except RuntimeError as e:  # executor shut down (peer forgotten concurrently): resubmit fresh
            try:
                self._peer(target).dispatch.submit(run)
            except Exception:
                b.finish(str(e))
        return b.batch_id

    # ================================================================== transfers (Mooncake API)
    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                            transport_hint: str = "") -> int:
        return self._sync1(target_hostname, TransferOpcode.WRITE, buffer, peer_buffer_address, length,
                           transport_hint)

    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                           transport_hint: str = "") -> int:
        return self._sync1(target_hostname, TransferOpcode.READ, buffer, peer_buffer_address, length,
                           transport_hint)

    def transfer_sync(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                      opcode: TransferOpcode, notify: TransferNotify | None = None,
                      transport_hint: str = "") -> int:
        return self._sync(target_hostname, opcode, [buffer], [peer_buffer_address], [length], notify,
                          transport_hint)

    def batch_transfer_sync_write(self, target_hostname: str, buffers: Sequence[int],
                                  peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                                  transport_hint: str = "") -> int:
        return self._sync(target_hostname, TransferOpcode.WRITE, buffers, peer_buffer_addresses, lengths,
                          hint=transport_hint)

    def batch_transfer_sync_read(self, target_hostname: str, buffers: Sequence[int],
                                 peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                                 transport_hint: str = "") -> int:
        return self._sync(target_hostname, TransferOpcode.READ, buffers, peer_buffer_addresses, lengths,
                          hint=transport_hint)

    def batch_transfer_sync(self, target_hostname: str, buffers: Sequence[int],
                            peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                            opcode: TransferOpcode, notify: TransferNotify | None = None,
                            transport_hint: str = "") -> int:
        return self._sync(target_hostname, opcode, buffers, peer_buffer_addresses, lengths, notify,
                          transport_hint)

    def batch_transfer_async_write(self, target_hostname: str, buffers: Sequence[int],
                                   peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                                   transport_hint: str = "") -> int:
        """Submit a batch; returns a batch id (> 0), -1 if the segment cannot be opened, 0 otherwise."""
        return self._submit(target_hostname, TransferOpcode.WRITE, buffers, peer_buffer_addresses, lengths,
                            transport_hint)

    def batch_transfer_async_read(self, target_hostname: str, buffers: Sequence[int],
                                  peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                                  transport_hint: str = "") -> int:
        return self._submit(target_hostname, TransferOpcode.READ, buffers, peer_buffer_addresses, lengths,
                            transport_hint)

    def batch_transfer_async(self, target_hostname: str, buffers: Sequence[int],
                             peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                             opcode: TransferOpcode, transport_hint: str = "") -> int:
        return self._submit(target_hostname, opcode, buffers, peer_buffer_addresses, lengths, transport_hint)

    def transfer_submit_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                              transport_hint: str = "") -> int:
        """Async single write; batch id, or -1 on failure."""
        return self._submit(target_hostname, TransferOpcode.WRITE, [buffer], [peer_buffer_address], [length],
                            transport_hint, open_fail=-1, other_fail=-1)

    def transfer_check_status(self, batch_id: int) -> int:
        """1 completed, 0 pending, -1 failed (or unknown id), -2 timed out. Finished ids are freed."""
        b = self._batches.get(batch_id)
        if b is None:
            return -1
        code = b.status_code()
        if code in (1, -1):
            self._batches.pop(batch_id)
        return code

    def get_batch_transfer_status(self, batch_ids: Sequence[int]) -> int:
        """Wait for every batch: 0 when all completed, -1 when any failed or timed out."""
        rc = 0
        for bid in batch_ids:
            b = self._batches.get(bid)
            if b is None:
                rc = -1
                continue
            b.done_event.wait(max(0.0, b.deadline - time.monotonic()))
            if b.status_code() != 1:
                rc = -1
                if b.state != 0:
                    self._batches.pop(bid)
            else:
                self._batches.pop(bid)
        return rc

    # ================================================================== misc API
    def get_first_buffer_address(self, segment_name: str) -> int:
        """Address of the first registered buffer of ``segment_name`` (0 if none / unknown)."""
        try:
            if segment_name == self._segment:
                regs = list(self._order.values())
                return regs[0].addr if regs else 0
            p = self._peer(segment_name, refresh=True)
            return p.desc.buffers[0].addr if p.desc.buffers else 0
        except Exception as e:
            self.last_error = str(e)
            log.error("get_first_buffer_address failed", extra={"segment": segment_name, "error": str(e)})
            return 0

    def get_segment_buffers(self, segment_name: str) -> list[tuple[int, int, str]]:
        """(addr, length, location) of every buffer of a segment (extension, for tools/tests)."""
        p = self._peer(segment_name, refresh=True)
        return [(r.addr, r.length, r.location) for r in p.desc.buffers]

    def get_notifies(self) -> list[TransferNotify]:
        """Notifications received since the last call (drained)."""
        with self._notify_lock:
            out, self._notifies = self._notifies, []
        return out

    def send_probe(self, peer_server_name: str) -> int:
        """0 if the peer's engine answers on its rpc port within the timeout, -1 otherwise."""
        try:
            self._check_ready()
            deadline = time.monotonic() + min(self.timeout, 5.0)
            if self._meta is not None:
                d = self._meta.get(ram_key(peer_server_name))
                if d is None:
                    raise TransferError(f"segment {peer_server_name!r} not found")
                desc = SegmentDescriptor.from_json(d, expect_name=peer_server_name)
                host, port = desc.host, desc.port
            else:
                host, port = parse_host_port(peer_server_name, what="peer_server_name")
            status, _ = self._tcp.control(host, port, peer_server_name, Op.PROBE, b"", deadline)
            return 0 if status == Status.OK else -1
        except Exception as e:
            self.last_error = str(e)
            log.warning("probe failed", extra={"peer": peer_server_name, "error": str(e)})
            return -1

    def transport_for(self, segment_name: str) -> str:
        """Name of the transport chosen for a peer ("local", "cma", "tcp") -- for logs/tests/benches."""
        return self._peer(segment_name).transport.name

    # ================================================================== shutdown
    def _teardown(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.close()
            self._server = None
        for t in (self._tcp, self._cma):
            if t is not None:
                t.close()
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for p in peers:
            p.dispatch.shutdown(wait=False)

    def close(self) -> None:
        """Remove this segment from the metadata service and stop serving (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._initialized:
            unpublish_local(self._segment, self)
            if self._meta is not None:
                for key in (ram_key(self._segment), rpc_meta_key(self._segment)):
                    try:
                        self._meta.remove(key)
                    except Exception as e:
                        log.debug("could not remove metadata key on close", extra={"key": key, "error": str(e)})
        self._teardown()
        if self._managed is not None:
            try:
                self._managed.close()
            except Exception as e:
                log.debug("could not stop the embedded metadata server on close", extra={"error": str(e)})
        if self._meta is not None:
            try:
                self._meta.close()
            except Exception as e:
                log.debug("could not close the metadata client on close", extra={"error": str(e)})

    shutdown = close

    def __enter__(self) -> "TransferEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
