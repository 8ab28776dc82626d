"""``DummyClient``: the backend of a ``MooncakeDistributedStore`` after ``setup_dummy``.

The engine process keeps no segment: every store call is forwarded to the node's
``mooncake_client`` (``RealClientService``) over a local Unix socket, and the bytes move
through shared memory both map:

* ``alloc_from_mem_pool(size)`` creates a memfd region and hands it to the service, which maps
  and registers it -- ``put_from``/``get_into``/batches on such buffers are the service store's
  own zero-copy path, addresses translated on the service side;
* each connection (one per calling thread) has a *staging window* of ``local_buffer_size``
  bytes, where ``put``'s value and ``get``'s answer travel;
* ``mem_pool_size`` bounds what ``alloc_from_mem_pool`` may hand out in total.

Objects belong to the pool: a dummy that dies loses nothing it stored. When the service goes
away, calls answer as a full client answers an unreachable service (-900, ``b''``, None...)
with one logged line naming the address; a ping thread notices within about a second and
re-attaches when the service is back, passing its regions again (their addresses do not
change, so buffers the engine holds stay valid).
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from typing import Any

import msgspec

from mooncake_core import auth
from mooncake_core.store import dummy_wire as wire
from mooncake_core.store.dummy_codec import STAGE_MIN, Codec
from mooncake_core.store.host_mem import HOST_REGIONS
from mooncake_core.store.protocol import ReplicaDesc
from mooncake_core.store.shm import Region, create_region, send_with_fd
from mooncake_core.transfer.sockio import set_kernel_timeouts
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.net import parse_host_port

__all__ = ["DummyClient", "ServiceUnavailable"]

log = get_logger("mooncake.store.dummy")

#: a call that gets no answer in this long fails (-900) instead of hanging the engine
CALL_TIMEOUT_S = 120.0
#: connect + handshake
CONNECT_TIMEOUT_S = 5.0
PING_INTERVAL_S = 1.0
#: the staging window of a connection is local_buffer_size, capped here (pages are only
#: committed as they are touched)
WINDOW_CAP = 1 << 30

_TYPED = {"get_replica_desc": list[ReplicaDesc], "batch_get_replica_desc": dict[str, list[ReplicaDesc]]}
#: calls whose bytes values always go through the staging window (the service then stores them
#: from there with its zero-copy put_from path)
_PUT_BYTES = frozenset({"put", "upsert", "put_batch", "upsert_batch", "put_parts", "upsert_parts"})
_RAISE = {"TypeError": TypeError, "ValueError": ValueError, "AttributeError": AttributeError,
          "KeyError": KeyError, "IndexError": IndexError, "OverflowError": OverflowError}


class ServiceUnavailable(ConnectionError):
    """The service could not be reached or dropped the connection."""


class _Conn:
    """One connection: its socket, codec and staging window."""

    #: replies up to this size are read with one recv into a buffer kept by the connection
    #: (bulk bytes travel through the window, so nearly every reply is this small)
    READ_BUF = 64 * 1024

    def __init__(self, sock: socket.socket, window: Region | None) -> None:
        self.sock = sock
        self.window = window
        self.codec = Codec((window.addr, window.size) if window else None, zero_copy_in=False)
        self._buf = bytearray(self.READ_BUF)
        self._view = memoryview(self._buf)

    def request(self, msg: wire.Message, fd: int | None = None) -> wire.Message:
        self.send(msg, fd)
        return self.read()

    def send(self, msg: wire.Message, fd: int | None = None) -> None:
        frame = wire.encode_frame(self.codec.enc, msg)
        if fd is None:
            self.sock.sendall(frame)
        else:
            send_with_fd(self.sock, frame, fd)

    def read(self) -> wire.Message:
        """The next frame's message. One ``recv`` usually brings header and body together: the
        service answers one request at a time, so nothing follows the frame on the socket."""
        view, got = self._view, 0
        while got < 4:
            r = self.sock.recv_into(view[got:])
            if not r:
                raise ServiceUnavailable("mooncake_client closed the connection")
            got += r
        (n,) = wire.HEADER.unpack_from(view)
        if 4 + n > len(view):
            return wire.decode(self.codec.dec, bytes(view[4:got]) + self._exact(4 + n - got))
        while got < 4 + n:
            r = self.sock.recv_into(view[got:4 + n])
            if not r:
                raise ServiceUnavailable("mooncake_client closed the connection")
            got += r
        if got > 4 + n:  # the service sent more than one frame: a protocol error, not data to guess at
            raise ServiceUnavailable(f"mooncake_client sent {got - 4 - n} bytes past the answer")
        return wire.decode(self.codec.dec, view[4:4 + n])

    def _exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            r = self.sock.recv_into(view[got:])
            if not r:
                raise ServiceUnavailable("mooncake_client closed the connection")
            got += r
        return bytes(buf)

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            if self.window is not None:
                self.window.close()
                self.window = None


class DummyClient:
    """Forwards store calls to a ``mooncake_client``; see the module docstring."""

    def __init__(self) -> None:
        self.client_id = uuid.uuid4().hex
        self._address = ""
        self._port = 0
        self._window_size = 0
        self._pool_limit = 0
        self._lock = threading.RLock()
        self._pool: dict[int, Region] = {}         # alloc_from_mem_pool regions by address
        self._registered: set[int] = set()        # of those, the ones register_buffer named
        #: MooncakeHostMemAllocator regions register_buffer passed to the service (the
        #: allocator owns them: close() does not free them)
        self._host: dict[int, Region] = {}
        self._service_id = ""
        self._segment_name = ""
        self._local = threading.local()
        self._conns: list[_Conn] = []
        self._stop = threading.Event()
        self._ping: threading.Thread | None = None
        self._lost_logged = False
        self.ready = False

    # ------------------------------------------------------------ lifecycle
    def setup(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """Attach to the service at ``server_address`` ("host:port" of a ``mooncake_client`` on
        this host). 0, or -1 with a logged reason (as the original)."""
        try:
            host, port = parse_host_port(server_address, what="setup_dummy: server_address")
        except ValueError as e:
            log.error("%s", e)
            return -1
        for name, v in (("mem_pool_size", mem_pool_size), ("local_buffer_size", local_buffer_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                log.error("setup_dummy: %s must be a non-negative integer (bytes), got %r", name, v)
                return -1
        self._address = f"{host}:{port}"
        self._port = port
        self._window_size = min(local_buffer_size, WINDOW_CAP)
        self._pool_limit = mem_pool_size
        try:
            self._conn()
        except (OSError, ServiceUnavailable) as e:
            log.error("setup_dummy: %s", e)
            return -1
        self.ready = True
        self._ping = threading.Thread(target=self._ping_loop, name="mc-dummy-ping", daemon=True)
        self._ping.start()
        return 0

    def close(self) -> int:
        self._stop.set()
        with self._lock:
            conns, self._conns = self._conns, []
            pool, self._pool = self._pool, {}
            self._host = {}
        for c in conns:
            c.close()
        for r in pool.values():
            r.close()
        self.ready = False
        return 0

    @property
    def segment_name(self) -> str:
        return self._segment_name

    # ------------------------------------------------------------ connections
    def _connect(self, with_window: bool = True) -> _Conn:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect(wire.ipc_name(self._port))
        except OSError as e:
            sock.close()
            raise ServiceUnavailable(self._unreachable(e)) from None
        conn = _Conn(sock, None)
        try:
            hello = conn.read()
            if not isinstance(hello, wire.Challenge):
                raise ServiceUnavailable(f"{self._address} did not greet as a mooncake-core mooncake_client")
            if hello.version != wire.WIRE_VERSION:
                raise ServiceUnavailable(f"mooncake_client at {self._address} speaks wire version {hello.version}, "
                                         f"this client {wire.WIRE_VERSION}: run matching mooncake-core versions")
            proof = b""
            if hello.auth_required:
                token = auth.resolve_token()
                if token is None:
                    raise ServiceUnavailable(f"mooncake_client at {self._address} requires an auth token: set "
                                             f"MOONCAKE_AUTH_TOKEN (or MOONCAKE_AUTH_TOKEN_FILE) as the service's")
                proof = auth.prove(token, hello.nonce, wire.AUTH_CONTEXT)
            reply = conn.request(wire.Attach(wire.WIRE_VERSION, self.client_id, os.getpid(), proof))
            if not isinstance(reply, wire.Attached):
                why = reply.message if isinstance(reply, wire.Ack) else type(reply).__name__
                raise ServiceUnavailable(f"mooncake_client at {self._address} refused this client: {why}")
            with self._lock:
                if reply.service_id != self._service_id:
                    # host regions the allocator freed meanwhile are not passed again
                    self._host = {b: r for b, r in self._host.items() if HOST_REGIONS.find(b, r.size) is r}
                    missing = [r for b, r in {**self._pool, **self._host}.items() if b not in reply.known_regions]
                    for r in missing:
                        self._send_region(conn, r, window=False)
                    if self._service_id:
                        log.warning("re-attached to mooncake_client at %s (a new service: %d shared regions "
                                    "passed again)", self._address, len(missing))
                    self._service_id = reply.service_id
                    self._lost_logged = False
            self._segment_name = reply.segment_name
            if with_window and self._window_size > 0:
                conn.window = create_region(self._window_size, "mooncake-dummy-window")
                conn.codec.window = (conn.window.addr, conn.window.size)
                self._send_region(conn, conn.window, window=True)
            set_kernel_timeouts(sock, CALL_TIMEOUT_S)  # no poll() before every recv, as settimeout does
            return conn
        except (OSError, msgspec.DecodeError) as e:
            conn.close()
            raise ServiceUnavailable(self._unreachable(e)) from None
        except BaseException:
            conn.close()
            raise

    def _send_region(self, conn: _Conn, r: Region, *, window: bool) -> None:
        ack = conn.request(wire.MapRegion(r.addr, r.size, window), fd=r.fd)
        if not isinstance(ack, wire.Ack) or ack.code != 0:
            why = ack.message if isinstance(ack, wire.Ack) else type(ack).__name__
            raise ServiceUnavailable(f"mooncake_client at {self._address} could not map shared memory: {why}")

    def _unreachable(self, e: BaseException) -> str:
        return (f"mooncake_client at {self._address} is not reachable over its local socket "
                f"({type(e).__name__}: {e}); start it on this host: mooncake_client --port={self._port} "
                f"--master_server_address=...")

    def _conn(self) -> _Conn:
        c: _Conn | None = getattr(self._local, "conn", None)
        if c is None:
            c = self._connect()
            self._local.conn = c
            with self._lock:
                self._conns.append(c)
        return c

    def _drop(self, c: _Conn) -> None:
        self._local.conn = None
        with self._lock:
            if c in self._conns:
                self._conns.remove(c)
        c.close()

    def _ping_loop(self) -> None:
        conn: _Conn | None = None
        while not self._stop.wait(PING_INTERVAL_S):
            try:
                if conn is None:
                    conn = self._connect(with_window=False)
                    set_kernel_timeouts(conn.sock, CONNECT_TIMEOUT_S)
                reply = conn.request(wire.Ping())
                if not isinstance(reply, wire.Pong):
                    raise ServiceUnavailable("unexpected ping answer")
            except (OSError, ServiceUnavailable, msgspec.DecodeError) as e:
                if conn is not None:
                    conn.close()
                    conn = None
                if not self._lost_logged:
                    self._lost_logged = True
                    log.error("mooncake_client at %s lost: %s; calls fail (-900) until it is back", self._address, e)
        if conn is not None:
            conn.close()

    # ------------------------------------------------------------ calls
    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``method`` on the service's store; its answer, shaped as a full client's."""
        if not self.ready:
            log.error("%s: the store is not set up (setup_dummy first)", method)
            return wire.failure_value(method, args, wire.ERR_INVALID)
        if method in _PUT_BYTES and self._window_size == 0:
            # as a full client set up with local_buffer_size=0 answers a bytes put
            log.warning("%s: no local buffer to stage the value (local_buffer_size=0 in setup_dummy); use "
                        "put_from on alloc_from_mem_pool memory, or set a local_buffer_size", method)
            return wire.failure_value(method, args, wire.ERR_INVALID)
        for attempt in (0, 1):
            try:
                c = self._conn()
            except ServiceUnavailable as e:
                self._log_lost(method, e)
                return wire.failure_value(method, args, wire.ERR_RPC)
            codec = c.codec
            codec.reset()
            minimum = 1 if method in _PUT_BYTES else STAGE_MIN
            msg = wire.Call(method, [self._stage(codec, a, minimum) for a in args],
                            {k: self._stage(codec, v, minimum) for k, v in kwargs.items()})
            try:
                c.send(msg)
            except OSError as e:
                # not delivered (the service restarted since this connection was made): safe to
                # send once more on a fresh connection, which re-attaches
                self._drop(c)
                if attempt == 0:
                    continue
                self._log_lost(method, e)
                return wire.failure_value(method, args, wire.ERR_RPC)
            try:
                reply = c.read()
            except (OSError, ServiceUnavailable, msgspec.DecodeError) as e:
                self._drop(c)  # delivered, answer lost: the call may have run, so it is not repeated
                self._log_lost(method, e)
                return wire.failure_value(method, args, wire.ERR_RPC)
            break
        if not isinstance(reply, wire.Reply):
            log.error("%s: unexpected answer %s from mooncake_client", method, type(reply).__name__)
            return wire.failure_value(method, args, wire.ERR_RPC)
        if reply.error is not None:
            exc = _RAISE.get(reply.error[0], RuntimeError)
            raise exc(reply.error[1])
        typed = _TYPED.get(method)
        if typed is not None:
            return msgspec.convert(reply.value, typed)
        return reply.value

    def forwarder(self, method: str) -> Any:
        """A callable that runs ``method`` on the service (bound on the façade by setup_dummy)."""
        call = self.call

        def forward(*args: Any, **kwargs: Any) -> Any:
            return call(method, args, kwargs)
        forward.__name__ = method
        return forward

    def get_hostname(self) -> str:
        """The service's segment name: where this client's objects live."""
        return self._segment_name

    @staticmethod
    def _stage(codec: Codec, value: Any, minimum: int) -> Any:
        if isinstance(value, (list, tuple)) and value and not isinstance(value[0], (int, str, list, tuple)):
            return [codec.stage_value(v, minimum) for v in value]
        return codec.stage_value(value, minimum)

    def _log_lost(self, method: str, e: BaseException) -> None:
        if not self._lost_logged:
            self._lost_logged = True
            log.error("%s: %s", method, e)

    # ------------------------------------------------------------ local: shared memory
    def alloc_from_mem_pool(self, size: int) -> int:
        """A buffer of ``size`` bytes both this process and the service map (0 on failure)."""
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            log.error("alloc_from_mem_pool: size must be a positive integer, got %r", size)
            return 0
        with self._lock:
            used = sum(r.size for r in self._pool.values())
        if self._pool_limit and used + size > self._pool_limit:
            log.error("alloc_from_mem_pool(%d): the pool holds %d of mem_pool_size=%d bytes; free buffers or "
                      "raise mem_pool_size in setup_dummy", size, used, self._pool_limit)
            return 0
        try:
            r = create_region(size, "mooncake-dummy-pool")
        except OSError as e:
            log.error("alloc_from_mem_pool(%d): %s", size, e)
            return 0
        try:
            self._send_region(self._conn(), r, window=False)
        except (OSError, ServiceUnavailable) as e:
            r.close()
            log.error("alloc_from_mem_pool(%d): %s", size, e)
            return 0
        with self._lock:
            self._pool[r.addr] = r
        return r.addr

    def free_to_mem_pool(self, addr: int) -> int:
        with self._lock:
            r = self._pool.pop(addr, None)
            self._registered.discard(addr)
        if r is None:
            log.error("free_to_mem_pool: 0x%x is not a buffer from alloc_from_mem_pool", addr)
            return wire.ERR_INVALID
        try:
            self._conn().request(wire.UnmapRegion(addr))
        except (OSError, ServiceUnavailable):
            pass  # the service is gone: its mapping went with it
        r.close()
        return 0

    def _pool_region(self, ptr: int, size: int) -> Region | None:
        with self._lock:
            for r in self._pool.values():
                if r.addr <= ptr and ptr + size <= r.addr + r.size:
                    return r
        return None

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Memory from ``alloc_from_mem_pool`` is shared with the service already: 0. Memory
        from ``MooncakeHostMemAllocator`` is passed to the service now (once): 0, or -900 when
        the service cannot be reached. Other memory cannot be reached by the service: -600,
        saying so."""
        if not isinstance(buffer_ptr, int) or not isinstance(size, int):
            raise TypeError("register_buffer(buffer_ptr: int, size: int)")
        if buffer_ptr == 0 or size <= 0:
            rc = wire.ERR_INVALID
        elif self._pool_region(buffer_ptr, size) is not None:
            rc = 0
        else:
            rc = self._share_host_region(buffer_ptr, size)
        if rc == wire.ERR_INVALID:
            log.error("register_buffer(0x%x, %d): a dummy client registers memory from alloc_from_mem_pool or "
                      "MooncakeHostMemAllocator (shared with mooncake_client); this range is in neither",
                      buffer_ptr, size)
        if rc != 0:
            return rc
        with self._lock:
            self._registered.add(buffer_ptr)
        return 0

    def _share_host_region(self, ptr: int, size: int) -> int:
        """Pass the MooncakeHostMemAllocator region holding ``[ptr, ptr + size)`` to the
        service unless it has it: 0; -600 when no such region holds the range."""
        r = HOST_REGIONS.find(ptr, size)
        if r is None:
            return wire.ERR_INVALID
        with self._lock:
            if r.addr in self._host:
                return 0
        try:
            self._send_region(self._conn(), r, window=False)
        except (OSError, ServiceUnavailable) as e:
            log.error("register_buffer(0x%x, %d): %s", ptr, size, e)
            return wire.ERR_RPC
        with self._lock:
            self._host[r.addr] = r
        return 0

    def unregister_buffer(self, buffer_ptr: int) -> int:
        with self._lock:
            if buffer_ptr in self._registered:
                self._registered.discard(buffer_ptr)
                return 0
        log.error("unregister_buffer(0x%x): not registered", buffer_ptr)
        return wire.ERR_INVALID

    def health_check(self) -> int:
        """0 healthy, 1 not set up, 2 service (or its master) unreachable."""
        if not self.ready:
            return 1
        try:
            reply = self._conn().request(wire.Ping())
        except (OSError, ServiceUnavailable, msgspec.DecodeError):
            self._local.conn = None
            return 2
        return 0 if isinstance(reply, wire.Pong) and reply.healthy == 0 else 2
