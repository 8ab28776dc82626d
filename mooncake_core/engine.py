"""``TransferEngine``: Mooncake's Python Transfer Engine API, implemented in Python.

A script written for ``from mooncake.engine import TransferEngine`` runs unchanged with
``from mooncake_core.engine import TransferEngine``: same method names, argument order and
integer return codes (0 ok, negative on failure; ``transfer_check_status`` 1 done / 0 pending
/ -1 failed / -2 timeout; ``allocate_managed_buffer`` 0 on failure).

This module is the thin API façade (docs/architecture.md); the work lives in
``mooncake_core/transfer/``:

* ``segment.py`` -- our registered regions, the transports' region hooks, our descriptor;
* ``publisher.py`` -- the descriptor (``mooncake/ram/<segment>``) and rpc endpoint
  (``mooncake/rpc_meta/<segment>``) kept published in the metadata service; with
  P2PHANDSHAKE the rpc server (``tcp_server.py``) hands the descriptor out itself;
* ``peers.py`` -- peers' descriptors and the transport chosen per peer: the registered
  transports (plugins, docs/plugins.md) by priority and capability, logged -- ``local``
  (memmove, same process), ``cma`` (process_vm_*v, same host), ``tcp`` (anything else, or
  when MC_FORCE_TCP=1);
* ``datapath.py`` -- how one call runs; ``control.py`` -- descriptor fetch, notify, probe.

Every wait is bounded by MC_TRANSFER_TIMEOUT (default 30 s, plus 1 s per GiB) and every
remote range is bounds-checked against the target's registered regions. Failures become
integer codes in one place, ``_fail``, which also records ``last_error`` and logs.
"""

from __future__ import annotations

import atexit
import json
import os
import time
import weakref
from typing import Any, Sequence

from mooncake_core import envs, plugins
from mooncake_core.errors import ErrorCode
from mooncake_core.metadata.base import MetadataBackend
from mooncake_core.transfer import metrics
from mooncake_core.transfer.base import TransferError, Transport, TransportContext, TransferOpcode
from mooncake_core.transfer.batch import BatchState, BatchTable
from mooncake_core.transfer.control import ControlChannel
from mooncake_core.transfer.datapath import DataPath, Plan
from mooncake_core.transfer.descriptor import SegmentDescriptor
from mooncake_core.transfer.local import publish_local, unpublish_local
from mooncake_core.transfer.managed import ManagedPool
from mooncake_core.transfer.memory import WILDCARD_LOCATION, memview
from mooncake_core.transfer.notify import NotifyInbox, TransferNotify
from mooncake_core.transfer.peers import PeerTable, check_hint, hint_table
from mooncake_core.transfer.publisher import DescriptorPublisher
from mooncake_core.transfer.segment import LocalSegment
from mooncake_core.transfer.tcp_server import TcpServer
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.net import loopback_warning, parse_host_port

log = get_logger("mooncake.te")

P2PHANDSHAKE = "P2PHANDSHAKE"
SUPPORTED_PROTOCOLS = ("tcp", "rdma")

__all__ = ["TransferEngine", "TransferOpcode", "TransferNotify"]

_Opcode = TransferOpcode  # for annotations inside the class (whose TransferOpcode attribute shadows it)


def _rdma_devices() -> list[str]:
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []


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
        self._seg = LocalSegment()
        self.regions = self._seg.regions  # what the rpc server and in-process peers check against
        self._batches = BatchTable()
        self._inbox = NotifyInbox()
        self._control = ControlChannel()
        self._server: TcpServer | None = None
        self._meta: MetadataBackend | None = None
        self._publisher: DescriptorPublisher | None = None
        self._transports: list[Transport] = []
        self._peers: PeerTable | None = None
        self._data: DataPath | None = None
        self._managed: ManagedPool | None = None
        self._initialized = False
        self._closed = False
        self.timeout = envs.MC_TRANSFER_TIMEOUT
        self.last_error = ""
        self._device_name = ""
        #: segment name -> monotonic time its last transfer failed because the peer itself was
        #: unreachable (see unreachable_since)
        self._unreachable: dict[str, float] = {}

    # ================================================================== the one error boundary
    def _fail(self, what: str, e: BaseException, rc: int = -1, level: str = "error", **extra: Any) -> int:
        """Every failure of the API ends here: ``last_error``, one log line, the integer code
        (the API contract is an int, never an exception)."""
        self.last_error = str(e)
        # the reason in the message itself: a script that configured no logging sees only that
        getattr(log, level)("%s failed: %s", what, e, extra=extra)
        return rc

    def _note_failure(self, target: str, e: BaseException) -> None:
        """Remember ``target`` as unreachable when ``e`` was a failure of the peer itself
        (refused, reset, timed out, gone from the metadata), not of the request (bounds,
        auth): a writer then places the put elsewhere (``unreachable_since``)."""
        if isinstance(e, TransferError) and (e.peer_down or e.code == ErrorCode.SEGMENT_NOT_FOUND):
            now = time.monotonic()
            if len(self._unreachable) >= 1024:  # a bound: forget the ones seen long ago
                self._unreachable = {n: t for n, t in self._unreachable.items() if now - t < 60.0}
            self._unreachable[target] = now

    def unreachable_since(self, t0: float) -> set[str]:
        """The segments whose transfer failed since ``t0`` (monotonic) because the peer was
        unreachable (refused connection, reset, timeout, not in the metadata any more)."""
        return {n for n, t in list(self._unreachable.items()) if t >= t0}

    def _ready(self) -> tuple[PeerTable, DataPath]:
        if not self._initialized or self._closed or self._peers is None or self._data is None:
            raise RuntimeError("TransferEngine is closed" if self._closed
                               else "TransferEngine is not initialized (call initialize first)")
        return self._peers, self._data

    # ================================================================== setup
    def initialize(self, local_hostname: str, metadata_server: str, protocol: str = "tcp",
                   device_name: str = "") -> int:
        """Start the engine. Returns 0 on success, -1 on failure (reason logged, ``last_error``)."""
        return self.initialize_ext(local_hostname, P2PHANDSHAKE if metadata_server is None else metadata_server,
                                   protocol, device_name, "")

    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str = "tcp",
                       device_name: str = "", metadata_type: str = "", *,
                       metrics_port: int | None = None) -> int:
        """Like ``initialize`` with an explicit metadata type ("etcd", "http", "redis", "p2p")."""
        try:
            self._init(local_hostname, metadata_server, protocol, device_name, metadata_type, metrics_port)
            return 0
        except Exception as e:
            self._teardown()
            return self._fail("transfer engine initialize", e, local_hostname=local_hostname,
                              metadata_server=metadata_server)

    def _init(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str,
              metadata_type: str, metrics_port: int | None) -> None:
        if self._initialized:
            raise RuntimeError("TransferEngine.initialize called twice on the same engine")
        if not isinstance(local_hostname, str) or not local_hostname.strip():
            raise ValueError(f"local_hostname must be 'host' or 'host:port', got {local_hostname!r}")
        protocol = (protocol or "tcp").lower()
        self._device_name = device_name or ""
        if protocol not in SUPPORTED_PROTOCOLS:
            raise ValueError(f"protocol {protocol!r} is not supported (supported: {', '.join(SUPPORTED_PROTOCOLS)})")
        host, port = parse_host_port(local_hostname, 0, what="local_hostname")
        for cls in plugins.transport_classes():  # one by one: a refusal (unknown device) leaves the built ones to close
            self._transports.append(cls(TransportContext(lambda: self._seg.name, self.regions, self._seg.boot_id,
                                                         self._seg.pidns, protocol, device_name or "", host)))
        if protocol == "rdma" and not any("rdma" in (t.name, *t.hints) for t in self._transports):
            devs = _rdma_devices()
            log.warning("protocol 'rdma' requested but no RDMA transport is registered"
                        + (f" (devices present: {devs})" if devs else " and no RDMA devices were found")
                        + "; using tcp / same-host transports instead", extra={"device_name": device_name})
        if not any(t.name == "tcp" for t in self._transports):
            raise RuntimeError("no 'tcp' transport is registered (is the built-in plugin blocked?)")
        self._seg.transports = self._transports

        conn = (metadata_server or "").strip()
        if metadata_type and metadata_type.lower() in ("p2p", "p2phandshake"):
            conn = P2PHANDSHAKE
        elif metadata_type and conn != P2PHANDSHAKE and "://" not in conn:
            conn = f"{metadata_type}://{conn}"
        from mooncake_core.metadata import open_metadata  # late: keeps import light
        self._meta = open_metadata(conn, timeout=min(10.0, self.timeout))
        p2p = self._meta is None

        bind = envs.MC_TCP_BIND_ADDRESS or _default_bind(host)
        self._server = self._listen(bind, port, retry_free=not (port == 0 or p2p), segment=local_hostname)
        seg = self._seg
        seg.host = bind if bind not in ("0.0.0.0", "::", "") else host
        seg.port = self._server.port
        seg.name = f"{host}:{self._server.port}" if p2p else local_hostname.strip()

        self._peers = PeerTable(seg, self._transports, self._meta, self._control, lambda: self.timeout)
        self._data = DataPath(self._peers, self._control, lambda: self.timeout)
        self._managed = ManagedPool(self._register_quiet, self.unregister_memory)
        self._initialized = True
        publish_local(seg.name, self)
        if self._meta is not None:
            warning = loopback_warning(seg.name, conn, what="transfer engine")
            if warning:  # said now, not as a transfer timeout on a remote peer later
                log.warning(warning, extra={"segment": seg.name, "metadata": conn})
            self._publisher = DescriptorPublisher(self._meta, seg.name, seg.host, seg.port, seg.descriptor)
            self._publisher.start()

        port_m = metrics_port if metrics_port is not None else envs.MC_METRICS_PORT
        if port_m is not None:
            metrics.serve_metrics(port_m)

        ref = weakref.ref(self)

        def close_at_exit() -> None:
            e = ref()
            if e is not None:
                e.close()
        atexit.register(close_at_exit)
        log.info("transfer engine ready", extra={
            "segment": seg.name, "rpc_port": seg.port, "bind": bind,
            "metadata": "P2PHANDSHAKE" if p2p else conn, "force_tcp": envs.MC_FORCE_TCP,
            "transports": [f"{t.name}:{t.priority}" for t in self._transports]})

    def _listen(self, bind: str, port: int, retry_free: bool, segment: str) -> TcpServer:
        """The rpc/data listener; a busy port from local_hostname falls back to a free one
        (not under P2PHANDSHAKE, where the port is part of the segment name)."""
        def serve(p: int) -> TcpServer:
            return TcpServer(bind, p, self.regions, lambda: self._seg.descriptor().to_json(), self._inbox.put,
                             lambda: self._seg.name)
        try:
            return serve(port)
        except OSError:
            if not retry_free:
                raise
            log.warning("rpc port from local_hostname is busy, picking a free one",
                        extra={"port": port, "segment": segment})
            return serve(0)

    def get_rpc_port(self) -> int:
        return self._server.port if self._server else -1

    def get_engine(self) -> "TransferEngine":
        """The engine object itself: SGLang's wrapper hands it to ``store.setup`` so a
        HiCache store shares this engine, as with Mooncake's ``get_engine()``."""
        return self

    def get_local_segment_name(self) -> str:
        """This engine's segment name (``host:rpc_port`` under P2PHANDSHAKE)."""
        return self._seg.name

    def get_local_topology(self, device_name: str | None = None) -> str:
        """JSON in the original's shape, ``{"cpu:0": [[preferred NICs], [other NICs]], "cuda:0": ...}``:
        per memory location (NUMA node, GPU) the NICs it prefers, from sysfs or
        ``MC_CUSTOM_TOPO_JSON`` (``transfer/topology.py``)."""
        from mooncake_core.transfer import topology
        return json.dumps(topology.local(device_name if device_name is not None else self._device_name,
                                         envs.MC_CUSTOM_TOPO_JSON))

    def local_descriptor(self) -> SegmentDescriptor | None:
        """This segment's descriptor now (None once closed): how another engine in this
        process reaches us without a metadata round trip (transfer/local.py)."""
        return None if self._closed or not self._initialized else self._seg.descriptor()

    # ================================================================== memory registration
    def _published(self) -> None:
        if self._publisher is not None and not self._closed:
            self._publisher.publish_soft()

    def _register_quiet(self, addr: int, length: int) -> int:
        try:
            self._seg.add(addr, length, "cpu:0")
        except Exception as e:
            return self._fail("register managed pool", e)
        self._published()
        return 0

    def register_memory(self, buffer_addr: int, capacity: int, location: str = WILDCARD_LOCATION) -> int:
        """Register [buffer_addr, buffer_addr+capacity) for remote access. 0 ok, -1 on failure."""
        try:
            self._ready()
            self._seg.add(buffer_addr, capacity, location)
        except Exception as e:
            return self._fail("register_memory", e, addr=buffer_addr, length=capacity)
        self._published()
        return 0

    def unregister_memory(self, buffer_addr: int) -> int:
        try:
            self._ready()
            if self._seg.remove(int(buffer_addr)) is None:
                raise ValueError(f"address {int(buffer_addr):#x} is not the start of a registered region")
        except Exception as e:
            return self._fail("unregister_memory", e, addr=buffer_addr)
        self._published()
        return 0

    def batch_register_memory(self, buffer_addresses: Sequence[int], capacities: Sequence[int],
                              location: str = WILDCARD_LOCATION) -> int:
        try:
            self._ready()
            self._seg.add_many(buffer_addresses, capacities, location)
        except Exception as e:
            return self._fail("batch_register_memory", e)
        self._published()
        return 0

    def batch_unregister_memory(self, buffer_addresses: Sequence[int]) -> int:
        rc = 0
        for a in buffer_addresses:
            if self._seg.remove(int(a)) is None:
                rc = -1
        self._published()
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

    # ================================================================== transfers: plumbing
    def _check_hint(self, hint: str) -> None:
        """ValueError for an unknown hint, as Mooncake's invalid_argument (a programming error)."""
        check_hint(hint, self._peers.hints if self._peers is not None else hint_table(plugins.transport_classes()))

    def _sync1(self, target: str, opcode: int, local: int, remote: int, length: int, hint: str) -> int:
        """One synchronous request (the 4 KiB latency path: as few steps as possible)."""
        if hint:
            self._check_hint(hint)
        data = self._data
        try:
            (data if data is not None and not self._closed else self._ready()[1]).sync_one(
                target, opcode, local, remote, length, hint)
            return 0
        except Exception as e:
            self._note_failure(target, e)
            return self._fail("transfer", e, target=target)

    def _sync(self, target: str, opcode: Any, buffers: Sequence[int], remotes: Sequence[int],
              lengths: Sequence[int], notify: TransferNotify | None = None, hint: str = "") -> int:
        self._check_hint(hint)
        try:
            self._ready()[1].sync(target, opcode, buffers, remotes, lengths, notify, hint)
            return 0
        except Exception as e:
            self._note_failure(target, e)
            return self._fail("transfer", e, target=target)

    def _submit(self, target: str, opcode: Any, buffers: Sequence[int], remotes: Sequence[int],
                lengths: Sequence[int], hint: str = "") -> int:
        """Start an asynchronous batch: its id (> 0), or 0 when it cannot be (upstream casts
        its -1 through the unsigned batch id type no more: 0 is the one failure sentinel)."""
        self._check_hint(hint)
        try:
            peers, data = self._ready()
            peer = peers.get(target)
        except Exception as e:
            return self._fail("open_segment", e, 0, target=target)
        try:
            plan = data.plan(peer, opcode, buffers, remotes, lengths, hint)
        except Exception as e:
            return self._fail("transfer submit", e, 0, target=target)
        deadline = data.deadline(plan.nbytes)
        b = self._batches.new(deadline, plan.nbytes)

        def run(state: BatchState = b, plan: Plan = plan) -> None:
            try:
                data.run(plan, deadline, None)
                state.finish(None)
            except Exception as e:
                log.error("async transfer failed", extra={"target": target, "batch_id": state.batch_id,
                                                          "error": str(e)})
                state.finish(str(e) or type(e).__name__)
            self._inbox.poke()  # wakes wait_notifies: a waiting event loop checks its batches

        try:
            peer.dispatch.submit(run)
        except RuntimeError as e:  # executor shut down (peer forgotten concurrently): resubmit fresh
            try:
                peers.get(target).dispatch.submit(run)
            except Exception:
                b.finish(str(e))
                self._inbox.poke()
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
                      opcode: _Opcode, notify: TransferNotify | None = None,
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
                            opcode: _Opcode, notify: TransferNotify | None = None,
                            transport_hint: str = "") -> int:
        return self._sync(target_hostname, opcode, buffers, peer_buffer_addresses, lengths, notify,
                          transport_hint)

    def batch_transfer_async_write(self, target_hostname: str, buffers: Sequence[int],
                                   peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                                   transport_hint: str = "") -> int:
        """Submit a batch; returns a batch id (> 0), or 0 when it cannot be submitted (the
        segment cannot be opened, or the request is invalid): upstream's failure sentinel, so
        ``batch_id != 0`` is the success check."""
        return self._submit(target_hostname, TransferOpcode.WRITE, buffers, peer_buffer_addresses, lengths,
                            transport_hint)

    def batch_transfer_async_read(self, target_hostname: str, buffers: Sequence[int],
                                  peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                                  transport_hint: str = "") -> int:
        return self._submit(target_hostname, TransferOpcode.READ, buffers, peer_buffer_addresses, lengths,
                            transport_hint)

    def batch_transfer_async(self, target_hostname: str, buffers: Sequence[int],
                             peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                             opcode: _Opcode, transport_hint: str = "") -> int:
        return self._submit(target_hostname, opcode, buffers, peer_buffer_addresses, lengths, transport_hint)

    def transfer_submit_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                              transport_hint: str = "") -> int:
        """Async single write; batch id, or 0 on failure (as ``batch_transfer_async_write``)."""
        return self._submit(target_hostname, TransferOpcode.WRITE, [buffer], [peer_buffer_address], [length],
                            transport_hint)

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
            if segment_name == self._seg.name:
                return self._seg.first_addr()
            p = self._ready()[0].get(segment_name, refresh=True)
            return p.desc.buffers[0].addr if p.desc.buffers else 0
        except Exception as e:
            return self._fail("get_first_buffer_address", e, 0, segment=segment_name)

    def get_segment_buffers(self, segment_name: str) -> list[tuple[int, int, str]]:
        """(addr, length, location) of every buffer of a segment (extension, for tools/tests)."""
        p = self._ready()[0].get(segment_name, refresh=True)
        return [(r.addr, r.length, r.location) for r in p.desc.buffers]

    def get_notifies(self) -> list[TransferNotify]:
        """Notifications received since the last call (drained)."""
        return self._inbox.drain()

    def notify_events(self) -> int:
        """Count of notifications received and asynchronous batches finished so far (extension;
        the ``since`` of ``wait_notifies``)."""
        return self._inbox.events()

    def wait_notifies(self, since: int, timeout_s: float) -> bool:
        """Sleep until a notification arrives or an asynchronous batch finishes after the count
        ``since`` (``notify_events``) was taken -- True -- or ``timeout_s`` passes -- False
        (extension). Lets an event loop with nothing to do but wait for peers sleep instead of
        polling ``get_notifies`` / ``transfer_check_status`` (see ``NotifyInbox``)."""
        return self._inbox.wait(since, timeout_s)

    def send_probe(self, peer_server_name: str) -> int:
        """0 if the peer's engine answers on its rpc port within the timeout, -1 otherwise."""
        try:
            deadline = time.monotonic() + min(self.timeout, 5.0)
            host, port = self._ready()[0].endpoint(peer_server_name)
            return 0 if self._control.probe(host, port, peer_server_name, deadline) else -1
        except Exception as e:
            return self._fail("probe", e, level="warning", peer=peer_server_name)

    def transport_names(self) -> list[str]:
        """Names of the transports this engine can use, highest priority first (e.g.
        ``["local", "cma", "ucx", "tcp"]``; a registered transport that is inert here, as
        ``ucx`` without ``protocol="rdma"`` or without a libucp, is left out): what
        ``mooncake_doctor`` reports."""
        return [t.name for t in self._transports if t.active]

    def transport_for(self, segment_name: str) -> str:
        """Name of the transport chosen for a peer ("local", "cma", "tcp") -- for logs/tests/benches."""
        return self._ready()[0].get(segment_name).transport.name

    # ================================================================== shutdown
    def _teardown(self) -> None:
        if self._publisher is not None:
            self._publisher.stop(remove=False)
        if self._server is not None:
            self._server.close()
            self._server = None
        for t in self._transports:
            t.close()
        self._seg.forget_device_ranges()  # process-wide: a freed GPU buffer must not stay "device" here
        self._control.close()
        if self._peers is not None:
            self._peers.close()

    def close(self) -> None:
        """Remove this segment from the metadata service and stop serving (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._initialized:
            unpublish_local(self._seg.name, self)
            if self._publisher is not None:
                self._publisher.stop(remove=True)
        self._teardown()
        for what, closer in (("stop the embedded metadata server", self._managed),
                             ("close the metadata client", self._meta)):
            if closer is not None:
                try:
                    closer.close()
                except Exception as e:
                    log.debug(f"could not {what} on close", extra={"error": str(e)})

    shutdown = close

    def __enter__(self) -> "TransferEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

