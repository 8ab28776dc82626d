"""Pooled connections to a peer's rpc port, shared by the tcp transport and the control channel.

Why a module of its own: the engine's control channel (descriptor fetch, notify, probe) and
the tcp transport both talk to a peer's rpc port with the same wire format, but they are
separate clients -- the control channel must work whatever transport moves the data. Both
build on these two classes: ``Conn`` (one socket, request ids, deadline-bound kernel
timeouts, control exchanges) and ``PeerPool`` (idle connections of one peer, stale-connection
retry, socket errors turned into ``TransferError`` naming the peer).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Generic, TypeVar

from mooncake_core import auth
from mooncake_core.errors import ErrorCode
from mooncake_core.transfer.base import TransferError
from mooncake_core.transfer.sockio import (PeerClosed, is_timeout, recv_exact, recv_into_exact, sendmsg_all,
                                           set_kernel_timeouts)
from mooncake_core.transfer.wire import RESP, Op, Request, Response, Status, WireError, unpack_response
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.te.conn")

POOL_IDLE_MAX = 60.0  # seconds a pooled connection may sit idle (targets close idle ones after 600 s)
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, drops unsent data


def _remaining(deadline: float, what: str) -> float:
    r = deadline - time.monotonic()
    if r <= 0:
        raise TransferError(f"{what}: deadline exceeded (MC_TRANSFER_TIMEOUT)")
    return r


class Conn:
    """One connection to a peer's rpc port; used by one thread at a time."""

    def __init__(self, host: str, port: int, deadline: float, peer: str):
        self.peer = peer
        timeout = min(_remaining(deadline, f"connect to {peer}"), 10.0)
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise TransferError(f"cannot connect to segment {peer} at {host}:{port}: {e}", peer_down=True) from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        set_kernel_timeouts(self.sock, timeout)
        self._rid = 0
        self.last_used = time.monotonic()
        self.uses = 0
        self._hdr = bytearray(RESP.size)
        self._hview = memoryview(self._hdr)
        self._timeout = timeout
        token = auth.resolve_token()
        if token:
            try:
                self._authenticate(token, deadline)
            except BaseException:
                self.close()
                raise

    def _authenticate(self, token: str, deadline: float) -> None:
        """Prove the shared secret (MOONCAKE_AUTH_TOKEN) before any other request: ask for a
        challenge, answer it. A target without a token answers the challenge with nothing."""
        try:
            status, nonce = self.control(Op.AUTH, b"", deadline)
            if status == Status.OK and nonce:
                status, reason = self.control(Op.AUTH, auth.prove(token, nonce, auth.TE_CONTEXT), deadline)
            else:
                reason = nonce
        except (OSError, WireError) as e:
            raise TransferError(f"segment {self.peer}: authentication exchange failed: {e} (a target of an "
                                f"older release without AUTH closes the connection)", peer_down=True) from None
        if status != Status.OK:
            raise TransferError(f"segment {self.peer} refused this engine: {reason.decode(errors='replace')}",
                                ErrorCode.TRANSFER_FAIL)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def abort(self) -> None:
        """Close with a reset: bytes still queued for the peer are discarded. A plain close
        keeps retransmitting them, so a write given up on (timeout across a partition) could
        land after the master handed its range to another put (found by bench/robustness/chaos.py)."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        except OSError:
            pass
        self.close()

    def kill(self) -> None:
        """From another thread: make a send/recv blocked on this connection fail at once (the
        thread using it then aborts it)."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _settimeout(self, deadline: float, what: str) -> None:
        t = _remaining(deadline, what)
        if abs(t - self._timeout) > 0.05:
            set_kernel_timeouts(self.sock, t)
            self._timeout = t

    def _read_resp(self, expect_rid: int) -> tuple[Response, bytes]:
        recv_into_exact(self.sock, self._hview)
        resp = unpack_response(self._hdr)
        if resp.req_id != expect_rid:
            raise WireError(f"response id {resp.req_id} does not match request {expect_rid}")
        aux = bytes(recv_exact(self.sock, resp.aux_len)) if resp.aux_len else b""
        return resp, aux

    def control(self, op: Op, aux: bytes, deadline: float) -> tuple[int, bytes]:
        self._settimeout(deadline, f"{op.name} to {self.peer}")
        self._rid += 1
        sendmsg_all(self.sock, [Request(op, self._rid, aux_len=len(aux)).pack(), aux])
        resp, raux = self._read_resp(self._rid)
        return resp.status, raux


C = TypeVar("C", bound=Conn)


class ConnGroup:
    """The connections one transfer's threads are using. A transfer that fails (an error, or
    its deadline) cancels the group before it returns: threads still blocked in a send fail at
    once and reset their connections, and none starts another request. So when the caller
    hears "failed", no byte of it can still reach the peer -- the store then revokes the put,
    and the master may hand the range to another writer at once (bench/robustness/chaos.py found late
    bytes of a timed-out write overwriting the next object after a partition healed)."""

    __slots__ = ("conns", "lock", "cancelled")

    def __init__(self) -> None:
        self.conns: set[Conn] = set()
        self.lock = threading.Lock()
        self.cancelled = False

    def enter(self, c: Conn) -> None:
        with self.lock:
            if self.cancelled:
                raise TransferError("transfer cancelled: another part of it failed")
            self.conns.add(c)

    def leave(self, c: Conn) -> None:
        with self.lock:
            self.conns.discard(c)

    def cancel(self, futs: list[Future[Any]]) -> None:
        """Stop every part of the transfer and wait (bounded) until none is running."""
        with self.lock:
            self.cancelled = True
            conns = list(self.conns)
        for c in conns:
            c.kill()
        running = [f for f in futs if not f.cancel()]
        if running:
            wait(running, timeout=5.0)


class PeerPool(Generic[C]):
    """Connections and worker threads dedicated to one peer (per-peer isolation)."""

    def __init__(self, host: str, port: int, name: str, nconn: int, conn_cls: type[C]):
        self.host, self.port, self.name = host, port, name
        self.nconn = nconn
        self._conn_cls = conn_cls
        self._idle: deque[C] = deque()  # pop/append are atomic under the GIL: no lock on the hot path
        self.executor = ThreadPoolExecutor(max_workers=max(1, nconn - 1) if nconn > 1 else 1,
                                           thread_name_prefix=f"te-tcp-{port}")

    def checkout(self, deadline: float) -> C:
        while True:
            try:
                c = self._idle.pop()
            except IndexError:
                return self._conn_cls(self.host, self.port, deadline, self.name)
            if time.monotonic() - c.last_used < POOL_IDLE_MAX:
                return c
            c.close()  # idle too long: the target may have closed it (its idle timeout)

    def take_idle(self) -> C | None:
        """An idle connection as it is (the caller checks its age), or None: the latency path's
        lock-free fast take."""
        try:
            return self._idle.pop()
        except IndexError:
            return None

    def checkin(self, c: C) -> None:
        c.last_used = time.monotonic()
        c.uses += 1
        if len(self._idle) < 2 * self.nconn:
            self._idle.append(c)
        else:
            c.close()

    def stale(self, c: C, e: BaseException) -> bool:
        """A reused connection that the peer closed since (it restarted, or timed us out):
        the request never reached a live server, so one retry on a fresh connection is safe
        (WRITE and READ are idempotent) and the other idle connections are suspect too."""
        if c.uses == 0 or not isinstance(e, (PeerClosed, ConnectionResetError, BrokenPipeError)):
            return False
        while self._idle:
            try:
                self._idle.pop().close()
            except IndexError:
                break
        return True

    def failed(self, c: C, e: BaseException) -> BaseException:
        """Close a connection whose exchange failed; return the error to raise.

        A refused request or an I/O error leaves the stream in an unknown state, so the
        connection is never reused (and reset: nothing of it may reach the peer later);
        socket errors become TransferErrors naming the peer.
        """
        c.abort()
        if isinstance(e, TransferError):
            return e
        if isinstance(e, (OSError, WireError, PeerClosed)):
            if is_timeout(e):
                return TransferError(f"segment {self.name}: timed out waiting for peer (MC_TRANSFER_TIMEOUT)",
                                     peer_down=True)
            return TransferError(f"segment {self.name}: connection failed: {e}", peer_down=True)
        return e

    def use(self, fn: Callable[[C], Any], deadline: float, group: ConnGroup | None = None) -> Any:
        """``fn`` on a pooled connection; with ``group``, the connection is registered there so
        that a failing sibling can cancel it (see ``ConnGroup``)."""
        c = self.checkout(deadline)
        try:
            if group is not None:
                group.enter(c)
            out = fn(c)
        except BaseException as e:
            err = self.failed(c, e)
            if not self.stale(c, e) or (group is not None and group.cancelled):
                raise err from None
            log.info("pooled connection was closed by the peer; retrying on a new one",
                     extra={"segment": self.name})
            if group is not None:
                group.leave(c)
            c = self._conn_cls(self.host, self.port, deadline, self.name)
            try:
                if group is not None:
                    group.enter(c)
                out = fn(c)
            except BaseException as e2:
                raise self.failed(c, e2) from None
        finally:
            if group is not None:
                group.leave(c)
        self.checkin(c)
        return out

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        while self._idle:
            try:
                self._idle.pop().close()
            except IndexError:
                break
