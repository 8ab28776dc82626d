"""``RealClientService``: a full store client run as a node's standing service.

The service owns one ``MooncakeDistributedStore`` (its segment, local buffer, SSD tier and
master connection: every object it stores lives there), and serves *dummy* clients -- engine
processes that called ``setup_dummy`` -- over a local Unix socket (abstract, named after the
service's port: ``dummy_wire.ipc_name``). Per connection it:

1. challenges the dummy (``Challenge``; with an auth token set, the dummy proves it knows it);
2. maps the memfd regions the dummy passes (``MapRegion`` + SCM_RIGHTS) and registers them with
   its store, so ``put_from``/``get_into`` on them are the store's own zero-copy path;
3. runs forwarded calls (``Call``) on its store after translating the dummy's addresses
   (``dummy_wire.translate_arguments``): nothing is copied through the socket but control.

Objects belong to the pool, not to the dummy: a dummy that dies (its connections close) only
takes its *mappings* with it -- unmapped once no call of it is still running.

The TCP ``--port`` is listened on as the original's is (scripts wait for it); it answers the
same protocol, without shared memory.
"""

from __future__ import annotations

import ctypes
import inspect
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from mooncake_core import auth
from mooncake_core.store import dummy_wire as wire
from mooncake_core.store.client import MooncakeDistributedStore
from mooncake_core.store.dummy_codec import Codec, Staged
from mooncake_core.store.shm import map_fd, recv_with_fds, unmap
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.net import bind_listener

__all__ = ["RealClientService", "ServiceConfig"]

log = get_logger("mooncake.store.real_client")

#: methods a dummy may not forward: its own lifecycle is local (setup_dummy/close), and the
#: service's store is not the dummy's to set up or close
_LOCAL_ONLY = frozenset({"setup", "setup_dummy", "close", "alloc_from_mem_pool", "free_to_mem_pool"})
_MAX_FRAME = 1 << 31
#: bytes asked for by the first read of a frame (most frames are far smaller)
_FIRST_READ = 64 * 1024


@dataclass
class ServiceConfig:
    host: str = "0.0.0.0"
    port: int = 50052
    auth_token: str | None = None


@dataclass
class _Mapping:
    size: int
    local: int
    fd: int
    window: bool
    users: int = 0
    dead: bool = False


@dataclass
class _Dummy:
    """What the service keeps for one dummy client (all its connections)."""
    client_id: str
    pid: int
    regions: wire.RegionMap = field(default_factory=wire.RegionMap)
    maps: dict[int, _Mapping] = field(default_factory=dict)
    connections: int = 0
    calls: int = 0


class RealClientService:
    """Serves dummies on top of ``store`` (already set up). ``start()`` binds, ``stop()`` ends."""

    def __init__(self, store: MooncakeDistributedStore, cfg: ServiceConfig, metrics: Any = None) -> None:
        self.store = store
        self.cfg = cfg
        self.service_id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._dummies: dict[str, _Dummy] = {}
        self._stop = threading.Event()
        self._listeners: list[socket.socket] = []
        self._methods = {n: getattr(store, n) for n in dir(type(store))
                         if not n.startswith("_") and n not in _LOCAL_ONLY and callable(getattr(type(store), n))}
        self._sigs = {n: inspect.signature(getattr(type(store), n)) for n in self._methods}
        self._metrics = metrics

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        ipc = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            ipc.bind(wire.ipc_name(self.cfg.port))
        except OSError as e:
            ipc.close()
            raise OSError(e.errno, f"mooncake_client: the local socket for --port={self.cfg.port} is taken "
                                   f"(another mooncake_client on this port?): {e.strerror}") from None
        ipc.listen(128)
        tcp = bind_listener(self.cfg.host, self.cfg.port, what="mooncake_client --port")
        self._listeners = [ipc, tcp]
        for s, kind in ((ipc, "ipc"), (tcp, "tcp")):
            threading.Thread(target=self._accept_loop, args=(s, kind), name=f"mc-client-accept-{kind}",
                             daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        for s in self._listeners:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"dummies": len(self._dummies),
                    "connections": sum(d.connections for d in self._dummies.values()),
                    "mapped_bytes": sum(m.size for d in self._dummies.values() for m in d.maps.values())}

    def _accept_loop(self, lsock: socket.socket, kind: str) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, kind), name="mc-client-conn", daemon=True).start()

    # ------------------------------------------------------------ one connection
    def _serve(self, conn: socket.socket, kind: str) -> None:
        dummy: _Dummy | None = None
        window: tuple[int, int] | None = None  # (dummy base, local address) of this connection's window
        codec = Codec(None, zero_copy_in=True, to_dummy=lambda a: self._to_dummy(dummy, a))
        try:
            if kind == "tcp":
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            dummy = self._handshake(conn, codec, kind)
            if dummy is None:
                return
            while True:
                got = self._recv(conn, kind == "ipc")
                if got is None:
                    return
                body, fds = got
                try:
                    msg = wire.decode(codec.dec, body) if not fds else wire.decode(_PLAIN_DEC, body)
                except (msgspec.DecodeError, ValueError) as e:
                    for fd in fds:
                        os.close(fd)
                    self._send(conn, codec, wire.Reply(error=("ValueError", f"malformed request: {e}")))
                    continue
                if isinstance(msg, wire.Call):
                    self._send(conn, codec, self._call(dummy, codec, msg))
                elif isinstance(msg, wire.MapRegion):
                    ack = self._map(dummy, msg, fds)
                    if ack.code == 0 and msg.window:
                        if window is not None:
                            self._unmap(dummy, window[0])
                        m = dummy.maps[msg.base]
                        window = (msg.base, m.local)
                        codec.window = (m.local, m.size)
                    self._send(conn, codec, ack)
                elif isinstance(msg, wire.UnmapRegion):
                    self._send(conn, codec, self._unmap(dummy, msg.base))
                elif isinstance(msg, wire.Ping):
                    self._send(conn, codec, wire.Pong(self.service_id, self.store.health_check()))
                else:
                    self._send(conn, codec, wire.Ack(wire.ERR_INVALID, f"unexpected {type(msg).__name__}"))
        except (ConnectionError, OSError) as e:
            if not self._stop.is_set():
                log.debug("dummy connection ended: %s", e)
        finally:
            conn.close()
            if dummy is not None:
                if window is not None:
                    self._unmap(dummy, window[0])
                self._drop_connection(dummy)

    def _handshake(self, conn: socket.socket, codec: Codec, kind: str) -> _Dummy | None:
        nonce = auth.new_nonce()
        token = self.cfg.auth_token
        self._send(conn, codec, wire.Challenge(wire.WIRE_VERSION, nonce, token is not None, self.service_id))
        conn.settimeout(30.0)  # a peer that connects and says nothing does not hold a thread forever
        got = self._recv(conn, False)
        conn.settimeout(None)
        if got is None:
            return None
        try:
            msg = wire.decode(_PLAIN_DEC, got[0])
        except (msgspec.DecodeError, ValueError):
            msg = None
        if not isinstance(msg, wire.Attach):
            self._send(conn, codec, wire.Ack(wire.ERR_INVALID, "expected Attach (is this a mooncake-core dummy?)"))
            return None
        if msg.version != wire.WIRE_VERSION:
            self._send(conn, codec, wire.Ack(wire.ERR_INVALID, f"wire version {msg.version} refused: this "
                                             f"mooncake_client speaks version {wire.WIRE_VERSION}"))
            return None
        if token is not None and not auth.verify(token, nonce, msg.proof, wire.AUTH_CONTEXT):
            log.warning("dummy pid %d refused: wrong or missing auth token", msg.pid)
            self._send(conn, codec, wire.Ack(-1, auth.refusal("mooncake_client", "wrong or missing auth token "
                                                              "(set MOONCAKE_AUTH_TOKEN as the service's)")))
            return None
        with self._lock:
            d = self._dummies.get(msg.client_id)
            if d is None:
                d = self._dummies[msg.client_id] = _Dummy(msg.client_id, msg.pid)
                log.info("dummy client attached: pid %d (%s)", msg.pid, kind)
            d.connections += 1
            known = d.regions.bases()
        self._send(conn, codec, wire.Attached(self.service_id, self.store.get_hostname(), known))
        return d

    def _drop_connection(self, d: _Dummy) -> None:
        with self._lock:
            d.connections -= 1
            if d.connections > 0:
                return
            self._dummies.pop(d.client_id, None)
            bases = d.regions.bases()
        for b in bases:
            self._unmap(d, b)
        log.info("dummy client gone: pid %d (its objects stay in the pool)", d.pid)

    # ------------------------------------------------------------ regions
    def _map(self, d: _Dummy, msg: wire.MapRegion, fds: list[int]) -> wire.Ack:
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            return wire.Ack(wire.ERR_INVALID, "MapRegion needs exactly one memfd over the local socket "
                                              "(shared memory cannot cross a TCP connection)")
        fd = fds[0]
        try:
            st = os.fstat(fd)
            if st.st_size < msg.size:
                raise ValueError(f"the memfd holds {st.st_size} bytes, the region claims {msg.size}")
            local = map_fd(fd, msg.size)
        except (OSError, ValueError) as e:
            os.close(fd)
            return wire.Ack(wire.ERR_INVALID, f"cannot map the region: {e}")
        with self._lock:
            try:
                d.regions.add(msg.base, msg.size, local)
            except ValueError as e:
                unmap(local, msg.size)
                os.close(fd)
                return wire.Ack(wire.ERR_INVALID, str(e))
            d.maps[msg.base] = _Mapping(msg.size, local, fd, msg.window)
        rc = self.store.register_buffer(local, msg.size)
        if rc != 0:
            log.warning("registering a dummy region of %d bytes with the store failed (%d): its calls "
                        "will copy", msg.size, rc)
        return wire.Ack(0)

    def _unmap(self, d: _Dummy, base: int) -> wire.Ack:
        with self._lock:
            m = d.maps.get(base)
            if m is None:
                return wire.Ack(wire.ERR_INVALID, f"no shared region at 0x{base:x}")
            d.regions.remove(base)
            m.dead = True
            if m.users:
                return wire.Ack(0)  # the last call using it unmaps it
            del d.maps[base]
        self._release(m)
        return wire.Ack(0)

    def _release(self, m: _Mapping) -> None:
        self.store.unregister_buffer(m.local)
        unmap(m.local, m.size)
        os.close(m.fd)

    def _to_dummy(self, d: _Dummy | None, local_addr: int) -> int | None:
        if d is None:
            return None
        with self._lock:
            return d.regions.to_dummy(local_addr)

    # ------------------------------------------------------------ calls
    def _call(self, d: _Dummy, codec: Codec, msg: wire.Call) -> wire.Reply:
        fn = self._methods.get(msg.method)
        if fn is None:
            return wire.Reply(error=("AttributeError", f"MooncakeDistributedStore has no method {msg.method!r} "
                                     f"a dummy client can call"))
        t0 = time.perf_counter()
        pinned: list[_Mapping] = []
        try:
            if msg.method == "get" and len(msg.args) == 1 and not msg.kwargs:
                # the hottest call, already in the shape get(key) takes: no signature binding
                return wire.Reply(value=self._get(codec, msg.args[0]))
            try:
                bound = self._sigs[msg.method].bind(None, *msg.args, **msg.kwargs)
            except TypeError as e:
                return wire.Reply(error=("TypeError", f"{msg.method}(): {e}"))
            if msg.method in wire.PTR_LAYOUTS:
                with self._lock:
                    try:
                        wire.translate_arguments(msg.method, bound.arguments,
                                                 lambda a, n: self._pin(d, a, n, pinned))
                    except wire.TranslateError as e:
                        log.error("dummy pid %d: %s", d.pid, e)
                        return wire.Reply(value=wire.failure_value(msg.method, msg.args, wire.ERR_INVALID))
            if msg.method == "get":
                return wire.Reply(value=self._get(codec, *bound.args[1:], **bound.kwargs))
            try:
                value = self._from_window(msg.method, bound.arguments)
                if value is None:
                    value = fn(*bound.args[1:], **bound.kwargs)
            except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError) as e:
                return wire.Reply(error=(type(e).__name__, str(e)))
            return wire.Reply(value=self._answer(codec, value))
        finally:
            if pinned:
                self._unpin(d, pinned)
            if self._metrics is not None:
                self._metrics.observe(msg.method, time.perf_counter() - t0)

    def _from_window(self, method: str, a: dict[str, Any]) -> int | None:
        """A put whose values the dummy staged in this connection's window (registered memory)
        runs as the store's put_from family on it: no copy. None when the call is not one."""
        if method in ("put", "upsert") and isinstance(a.get("value"), memoryview):
            mv = a["value"]
            one = self.store.put_from if method == "put" else self.store.upsert_from
            return one(a["key"], _addr(mv), mv.nbytes, a.get("config"))
        if method in ("put_batch", "upsert_batch"):
            vals = a.get("values")
            keys = a.get("keys")
            if (isinstance(vals, list) and vals and isinstance(keys, list) and len(keys) == len(vals)
                    and all(isinstance(v, memoryview) for v in vals)):
                many = self.store.batch_put_from if method == "put_batch" else self.store.batch_upsert_from
                rcs = many(keys, [_addr(v) for v in vals], [v.nbytes for v in vals], a.get("config"))
                return next((rc for rc in rcs if rc < 0), 0)
        return None

    def _pin(self, d: _Dummy, addr: int, size: int, pinned: list[_Mapping]) -> int:
        local = d.regions.to_local(addr, size)
        base = d.regions.find(addr)
        assert base is not None
        m = d.maps[base]
        m.users += 1
        pinned.append(m)
        return local

    def _unpin(self, d: _Dummy, pinned: list[_Mapping]) -> None:
        dead = []
        with self._lock:
            for m in pinned:
                m.users -= 1
                if m.dead and m.users == 0:
                    dead.append(m)
                    for b, mm in list(d.maps.items()):
                        if mm is m:
                            del d.maps[b]
        for m in dead:
            self._release(m)

    def _get(self, codec: Codec, key: Any) -> Any:
        """``get`` reads straight into the connection's window (one copy fewer than get + stage)."""
        codec.reset()
        free = codec.free
        if free > 0:
            slot = codec.reserve(free)
            assert slot is not None
            n = self.store.get_into(key, slot[1], free)
            if n >= 0:
                return Staged(slot[0], n) if n >= 64 else ctypes.string_at(slot[1], n)
            if n != wire.ERR_INVALID:
                return b""
            codec.reset()
        return self._answer(codec, self.store.get(key))  # larger than the window: inline

    def _answer(self, codec: Codec, value: Any) -> Any:
        """The call's value with large bytes staged in the window (lists of bytes too)."""
        codec.reset()
        if isinstance(value, bytes) and type(value) is bytes:
            return codec.stage_value(value)
        if isinstance(value, list) and value and all(type(v) is bytes for v in value):
            return [codec.stage_value(v) for v in value]
        return value

    def _send(self, conn: socket.socket, codec: Codec, msg: wire.Message) -> None:
        conn.sendall(wire.encode_frame(codec.enc, msg))

    @staticmethod
    def _recv(conn: socket.socket, with_fds: bool) -> tuple[bytes, list[int]] | None:
        """One frame (body, descriptors that came with it); None when the peer closed."""
        # the first read takes header and body together when the frame is small (nearly every
        # call: bulk bytes travel through the window); a dummy sends one request and waits for
        # its answer, so no second frame can follow on the socket
        fds: list[int] = []
        if with_fds:
            head, fds = recv_with_fds(conn, _FIRST_READ)
        else:
            head = conn.recv(_FIRST_READ)
        while 0 < len(head) < 4:
            more = conn.recv(4 - len(head))
            head = head + more if more else b""
        if not head:
            for fd in fds:
                os.close(fd)
            return None
        (n,) = wire.HEADER.unpack_from(head)
        if n > _MAX_FRAME or len(head) > 4 + n:
            for fd in fds:
                os.close(fd)
            raise ConnectionError(f"frame of {n} bytes refused" if n > _MAX_FRAME
                                  else "a second request before the answer to the first (one at a time)")
        if len(head) == 4 + n:
            return head[4:], fds
        body = bytearray(n)
        view = memoryview(body)
        got_n = len(head) - 4
        view[:got_n] = head[4:]
        while got_n < n:
            r = conn.recv_into(view[got_n:])
            if not r:
                for fd in fds:
                    os.close(fd)
                return None
            got_n += r
        return bytes(body), fds


def _addr(mv: memoryview) -> int:
    return int(np.frombuffer(mv, dtype=np.uint8).ctypes.data)


_PLAIN_DEC = msgspec.msgpack.Decoder(wire.Message)  # type: ignore[arg-type]
