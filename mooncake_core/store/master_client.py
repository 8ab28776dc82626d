"""Synchronous, thread-safe RPC stub for the store master.

Every call has a deadline (``timeout``, default 5 s); when the master cannot be reached in
time the call raises ``MooncakeError(-900)`` instead of hanging. Master-side errors raise
``MooncakeError`` with the master's Mooncake code (-704 not found, -705 exists, ...).

Concurrency: the stub keeps a small pool of blocking TCP connections; a call borrows one, so
threads issue RPCs in parallel without sharing a socket. A connection whose call failed or
timed out is closed, never reused (a late reply must not answer the next call); replies also
carry the request id and stale ones are dropped. A dead or restarting master shows up as a
refused connection or EOF: the stub reconnects and retries until the call's deadline.

``master_addr``: ``"host:port"``, or ``"etcd://h:p[;h2:p]"`` / ``"redis://h:p[/db]"`` (HA). In HA
mode the leader's address is read from etcd or Redis; when a call cannot reach it (or a former leader refuses to
serve), the stub re-reads etcd and retries on the new leader within the same deadline, so
callers follow a failover transparently.
"""

from __future__ import annotations

import itertools
import socket
import struct
import threading
import time
from typing import Any

from mooncake_core import auth
from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store import protocol as P
from mooncake_core.store.packing import I64, U64, expand_gets, expand_placements, pack, unpack
from mooncake_core.store.protocol import (
    GetReply, HeartbeatReply, MasterInfo, MountReply, ReplicaDesc, ReplicateConfigMsg,
)
from mooncake_core.utils.busypoll import POLL_MAX_REQUEST, Poller, env_busy_poll_s
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.net import parse_host_port

log = get_logger("mooncake.store.master_client")

#: how long to wait for a TCP connection to the master before trying another address
CONNECT_WAIT_S = 1.0
#: after sending a request, poll for the reply without sleeping this long (microseconds) before
#: blocking: a master reply takes ~10-30 us of work, a thread woken from recv ~40 us or more on
#: a VM. ``MC_MASTER_BUSY_POLL_US`` overrides (0 = always block); back-off and rationale in
#: ``mooncake_core.utils.busypoll``.
DEFAULT_BUSY_POLL_US = 50  # the default of MC_MASTER_BUSY_POLL_US (envs.py)


#: bytes of a connection's reply buffer (a larger reply is gathered past it)
RECV_BUFFER = 65536
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets, drops unsent bytes


def refused_message(addr: str) -> str:
    """What a refused first contact says: which address, what is wrong, how to fix it."""
    return (f"master {addr}: connection refused (no mooncake_master listens there): start one "
            f"(mooncake_master --port {addr.rsplit(':', 1)[-1]}) or set master_server_address to the "
            f"host:port it listens on")


class _Conn:
    """A pooled connection and the kernel send/receive timeout currently set on it."""

    __slots__ = ("buf", "poller", "sock", "timeout", "view")

    def __init__(self, sock: socket.socket, spin: float):
        self.sock = sock
        self.timeout = 0.0
        self.poller = Poller(spin)
        # replies land in this buffer: ``recv(65536)`` would malloc and shrink a 64 KiB bytes
        # object per call (CPU, and heap trims that take the process's mmap lock)
        self.buf = bytearray(RECV_BUFFER)
        self.view = memoryview(self.buf)

    def set_timeout(self, seconds: float) -> None:
        seconds = max(seconds, 0.001)
        tv = struct.pack("ll", int(seconds), int((seconds % 1) * 1_000_000))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        self.timeout = seconds

    def abort(self) -> None:
        """Close after a failed or abandoned call with a reset: a plain close keeps
        retransmitting the unsent request, which could reach the master long after the
        caller gave up (a late heartbeat consumed the master's need_remount answer: found by
        bench/robustness/chaos.py)."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        except OSError:
            pass
        self.sock.close()


class MasterClient:
    """RPC stub for ``mooncake_master`` (see module docstring)."""

    def __init__(self, master_addr: str, *, timeout: float = 5.0) -> None:
        if not isinstance(master_addr, str) or not master_addr.strip():
            raise ValueError(f"master_addr: expected 'host:port', 'etcd://h:p' or 'redis://h:p', got {master_addr!r}")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout: expected a positive number of seconds, got {timeout!r}")
        self.master_addr = master_addr.strip()
        self.timeout = float(timeout)
        from mooncake_core.store.ha import leader_resolver

        #: HA (etcd:// or redis://): reads the leader's address; None for a plain host:port
        self._leader = leader_resolver(self.master_addr)
        self._addr: str | None = None
        if self._leader is None:
            host, port = parse_host_port(self.master_addr, what="master_server_addr")
            self._addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._lock = threading.Lock()
        self._pool: list[tuple[str, _Conn]] = []
        self._ids = itertools.count(1)
        self._closed = False
        self._spin = env_busy_poll_s("MC_MASTER_BUSY_POLL_US")
        # calls waiting for a reply right now: only a lone caller busy-polls. With several in
        # flight the wake-ups overlap anyway, and spinners would fight over the GIL.
        self._waiting = 0
        self._waiting_lock = threading.Lock()

    # ------------------------------------------------------------------ plumbing
    @property
    def address(self) -> str | None:
        """The master address calls currently go to (the leader in HA mode)."""
        return self._addr

    def _resolve(self, deadline: float) -> str:
        if self._leader is None:
            assert self._addr is not None
            return self._addr
        last_err = "no leader registered"
        while True:
            try:
                addr = self._leader(max(0.2, min(2.0, deadline - time.monotonic())))
                if addr:
                    with self._lock:
                        if addr != self._addr:
                            if self._addr is not None:
                                log.info("master leader changed", extra={"old": self._addr, "new": addr})
                            self._addr = addr
                            self._drop_pool_locked()
                    return addr
            except ConnectionError as e:
                last_err = str(e)
            if time.monotonic() + 0.2 >= deadline:
                raise MooncakeError(ErrorCode.RPC_FAIL, f"cannot find the master leader via "
                                    f"{self.master_addr}: {last_err}")
            time.sleep(0.2)

    def _drop_pool_locked(self) -> None:
        for _, c in self._pool:
            c.sock.close()
        self._pool.clear()

    def _borrow(self, addr: str, deadline: float) -> "_Conn":
        """A pooled connection to ``addr`` or a new one (OSError if it cannot connect)."""
        with self._lock:
            if self._closed:
                raise MooncakeError(ErrorCode.RPC_FAIL, "MasterClient is closed")
            while self._pool:
                a, c = self._pool.pop()
                if a == addr:
                    return c
                c.sock.close()
        host, port = parse_host_port(addr, what="master address")
        wait = max(0.05, min(CONNECT_WAIT_S, deadline - time.monotonic()))
        sock = socket.create_connection((host, port), timeout=wait)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        # blocking socket + kernel timeouts: Python's settimeout() would add a poll() syscall
        # before every send and recv (measurable at tens of thousands of calls per second)
        sock.settimeout(None)
        c = _Conn(sock, self._spin)
        c.set_timeout(self.timeout)
        token = auth.resolve_token()
        if token:
            try:
                self._authenticate(c, addr, token, deadline)
            except BaseException:
                sock.close()
                raise
        return c

    def _authenticate(self, c: "_Conn", addr: str, token: str, deadline: float) -> None:
        """Prove MOONCAKE_AUTH_TOKEN on a new connection (challenge, answer). A refusal raises
        MooncakeError naming it; a lost connection OSError (the caller retries)."""
        nonce = self._auth_call(c, addr, P.AuthChallengeReq(), deadline)
        if nonce:  # empty: this master requires no token
            self._auth_call(c, addr, P.AuthReq(auth.prove(token, nonce, auth.MASTER_CONTEXT)), deadline)

    def _auth_call(self, c: "_Conn", addr: str, req: Any, deadline: float) -> Any:
        got = self._exchange(c, next(self._ids), P.request_encoder.encode(req), deadline)
        if got is None:
            raise ConnectionError(f"master {addr}: connection lost during authentication")
        code, payload, _ = got
        if code != 0:
            raise MooncakeError(code, bytes(payload).decode("utf-8", "replace"))
        return P.result_decoders[type(req)].decode(payload)

    def _give_back(self, addr: str, c: "_Conn") -> None:
        with self._lock:
            if self._closed or addr != self._addr:
                c.sock.close()
            else:
                self._pool.append((addr, c))

    def _exchange(self, c: "_Conn", rid: int, body: bytes, deadline: float) -> tuple[int, Any, bool] | None:
        """Send one request and read its reply: (status, payload, connection_clean) or None
        when the connection broke / the reply did not come in time (OSError also possible)."""
        sock = c.sock
        sock.sendall(P.request_frame(rid, body))
        got: int | None = None
        if self._spin and len(body) <= POLL_MAX_REQUEST:  # small calls, the lone one in flight (see __init__)
            with self._waiting_lock:
                self._waiting += 1
                alone = self._waiting == 1
            try:
                got = c.poller.recv_into(sock, c.view, RECV_BUFFER) if alone else None
                if got is None:
                    got = sock.recv_into(c.view, RECV_BUFFER)
            finally:
                with self._waiting_lock:
                    self._waiting -= 1
        else:
            got = sock.recv_into(c.view, RECV_BUFFER)
        if got >= 4:
            n = P.unpack_len(c.buf)
            if got == 4 + n:  # the whole reply, and nothing else: parse it in place
                try:
                    _, rid_got, code, payload = P.parse_reply(c.view[4:got])
                except ValueError:
                    return None
                if rid_got == rid:
                    return code, payload, True
        buf: bytes = bytes(c.view[:got])
        while True:
            if not buf:
                return None  # master closed the connection (restart / crash)
            while len(buf) < 4:
                chunk = sock.recv(65536)
                if not chunk:
                    return None
                buf += chunk
            n = P.unpack_len(buf)
            if n > P.MAX_FRAME:
                return None
            if len(buf) < 4 + n:  # a large reply: gather the rest, checking the deadline
                parts = [buf]
                have = len(buf)
                while have < 4 + n:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    c.set_timeout(left)
                    chunk = sock.recv(max(65536, min(4 + n - have, 16 << 20)))
                    if not chunk:
                        return None
                    parts.append(chunk)
                    have += len(chunk)
                buf = b"".join(parts)
            try:
                _, got, code, payload = P.parse_reply(memoryview(buf)[4:4 + n])
            except ValueError:
                return None
            rest = buf[4 + n:]
            if got == rid:
                return code, payload, not rest
            buf = rest or sock.recv(65536)  # reply to a request given up on earlier: drop it

    def _attempt(self, addr: str, req: Any, body: bytes, deadline: float,
                 refused_is_final: bool = False) -> tuple[bool, Any]:
        """One try against ``addr``. Returns (reached, result); raises MooncakeError for a
        master-side error. reached=False: cannot connect, connection lost, no reply before
        the deadline, or refused by a former HA leader -- the caller may retry.
        ``refused_is_final``: a refused connection (or a host name that does not resolve)
        raises at once (see ``ping``)."""
        try:
            c = self._borrow(addr, deadline)
        except (ConnectionRefusedError, socket.gaierror) as e:
            if refused_is_final and self._leader is None:
                why = (refused_message(addr) if isinstance(e, ConnectionRefusedError) else
                       f"master {addr}: cannot resolve its host name ({e.strerror or e}): set "
                       f"master_server_address to a host:port this machine can resolve")
                raise MooncakeError(ErrorCode.RPC_FAIL, why) from e
            log.debug("cannot connect to master", extra={"addr": addr, "error": str(e)})
            return False, None
        except OSError as e:
            log.debug("cannot connect to master", extra={"addr": addr, "error": str(e)})
            return False, None
        ok = False
        try:
            left = deadline - time.monotonic()
            if left <= 0:
                return False, None
            if not 0.8 * c.timeout <= left <= c.timeout:
                c.set_timeout(left)
            got = self._exchange(c, next(self._ids), body, deadline)
            if got is None:
                return False, None
            code, payload, ok = got
            return self._result(addr, req, code, payload)
        except OSError as e:  # includes a kernel receive timeout (EAGAIN)
            log.debug("master call failed", extra={"addr": addr, "error": str(e)})
            ok = False
            return False, None
        finally:
            if ok:
                self._give_back(addr, c)
            else:
                c.abort()

    def _result(self, addr: str, req: Any, code: int, payload: Any) -> tuple[bool, Any]:
        if code == 0:
            return True, P.result_decoders[type(req)].decode(payload)
        if code == ErrorCode.RPC_FAIL and self._leader is not None:
            # a former HA leader refusing to serve: find the current one
            log.info("master refused as non-leader", extra={"addr": addr})
            return False, None
        raise MooncakeError(code, bytes(payload).decode("utf-8", "replace"))

    def _call(self, req: Any, timeout: float | None = None, refused_is_final: bool = False) -> Any:
        body = P.request_encoder.encode(req)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        if timeout is None and self._pool and not refused_is_final:
            # fast path: a pooled connection to the current master, kernel timeouts already set
            try:
                addr, c = self._pool.pop()
            except IndexError:
                pass
            else:
                if addr == self._addr and not self._closed and c.timeout == self.timeout:
                    ok = False
                    try:
                        got = self._exchange(c, next(self._ids), body, deadline)
                        if got is not None:
                            code, payload, ok = got
                            reached, result = self._result(addr, req, code, payload)
                            if reached:
                                return result
                            ok = False
                    except OSError:
                        ok = False
                    finally:
                        if ok:
                            self._pool.append((addr, c))
                        else:
                            c.abort()
                else:
                    c.sock.close()
        return self._call_slow(req, body, timeout, deadline, refused_is_final)

    def _call_slow(self, req: Any, body: bytes, timeout: float | None, deadline: float,
                   refused_is_final: bool = False) -> Any:
        tried: list[str] = []
        while True:
            addr = self._addr if self._addr is not None else self._resolve(deadline)
            reached, result = self._attempt(addr, req, body, deadline, refused_is_final)
            if reached:
                return result
            if addr in tried:  # second miss on the same address: do not spin
                time.sleep(max(0.0, min(0.1, deadline - time.monotonic())))
            else:
                tried.append(addr)
            if time.monotonic() >= deadline:
                break
            if self._leader is None:
                continue  # master restarting / not up yet: keep trying until the deadline
            # HA: the leader may have changed -- re-read it (etcd/Redis) and retry within the deadline
            with self._lock:
                self._addr = None
                self._drop_pool_locked()
            try:
                self._resolve(deadline)
            except MooncakeError:
                break
        method = type(req).__struct_config__.tag
        raise MooncakeError(ErrorCode.RPC_FAIL,
                            f"master {self.master_addr} unreachable: {method} got no reply within "
                            f"{self.timeout if timeout is None else timeout:.1f}s (tried {', '.join(tried)}; "
                            f"is mooncake_master running there?)")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop_pool_locked()

    def __enter__(self) -> "MasterClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ API
    def ping(self, timeout: float | None = None, *, refused_is_final: bool = False) -> MasterInfo:
        """The master's info. ``refused_is_final``: a refused connection raises at once
        instead of being retried until the deadline -- for a first contact, where it means no
        master runs there (later, it means one is restarting, and waiting is right). Not in
        HA mode, where a refusing address may be a leader being replaced."""
        return self._call(P.PingReq(), timeout, refused_is_final)

    def mount_segment(self, client_id: str, segment_name: str, base: int, size: int,
                      prev_epoch: int = 0, segment_id: str = "") -> MountReply:
        return self._call(P.MountSegmentReq(client_id, segment_name, base, size, prev_epoch, segment_id))

    def unmount_segment(self, client_id: str, segment_name: str, *, refused_is_final: bool = False) -> None:
        """``refused_is_final`` (see ``ping``): at close, a master that refuses connections is
        gone, and waiting out the deadline for it would only delay the caller's exit."""
        self._call(P.UnmountSegmentReq(client_id, segment_name), None, refused_is_final)

    def heartbeat(self, client_id: str, release: list[int] | None = None) -> HeartbeatReply:
        """``release``: addresses of our reservations we let go of (unused past their age)."""
        return self._call(P.HeartbeatReq(client_id, release or []))

    def report_objects(self, client_id: str, objects: list[tuple[str, ReplicaDesc]],
                       versions: list[int] | None = None) -> int:
        """Re-report complete objects after ``need_remount`` (with the versions ``put_end``
        returned; the highest version of a key wins); returns how many were accepted."""
        return self._call(P.ReportObjectsReq(client_id, [(k, r) for k, r in objects], list(versions or [])))

    def put_start(self, client_id: str, key: str, size: int,
                  cfg: ReplicateConfigMsg | None = None, *, release: list[int] | None = None) -> list[ReplicaDesc]:
        """``release``: the address of our reservation this put does not use (freed first)."""
        return self._call(P.PutStartReq(client_id, key, size, cfg or ReplicateConfigMsg(), release or []))

    def upsert_start(self, client_id: str, key: str, size: int,
                     cfg: ReplicateConfigMsg | None = None) -> list[ReplicaDesc]:
        return self._call(P.UpsertStartReq(client_id, key, size, cfg or ReplicateConfigMsg()))

    def put_end(self, client_id: str, key: str) -> int:
        """Publish a put: the object's version (> 0), or 0 when nothing was published."""
        return self._call(P.PutEndReq(client_id, key))

    def put_commit(self, client_id: str, key: str, size: int, cfg: ReplicateConfigMsg, *, reserved: bool,
                   next_size: int) -> P.PutCommitReply:
        """put_end of ``key`` (``reserved``: written into our reservation, no put_start) and
        a reservation of ``next_size`` bytes for the next put, in one round trip."""
        return self._call(P.PutCommitReq(client_id, key, size, cfg, reserved, next_size))

    def put_revoke(self, client_id: str, key: str) -> None:
        self._call(P.PutRevokeReq(client_id, key))

    def batch_put_start(self, client_id: str, keys: list[str], sizes: list[int],
                        cfg: ReplicateConfigMsg | None = None) -> list[list[ReplicaDesc] | int]:
        """put_start of every key: its replicas or its code (``batch_put_start_packed`` unpacked)."""
        return expand_placements(self.batch_put_start_packed(client_id, keys, sizes, cfg), sizes)

    def batch_upsert_start(self, client_id: str, keys: list[str], sizes: list[int],
                           cfg: ReplicateConfigMsg | None = None) -> list[list[ReplicaDesc] | int]:
        return expand_placements(self.batch_put_start_packed(client_id, keys, sizes, cfg, upsert=True), sizes)

    def batch_put_start_packed(self, client_id: str, keys: list[str], sizes: list[int] | bytes,
                               cfg: ReplicateConfigMsg | None = None, *, upsert: bool = False,
                               release: list[int] | None = None) -> P.Placements:
        """One round trip for the whole batch; ``sizes`` as ints or already packed (``u64``);
        ``release`` (put, not upsert): as put_start's, for our batch reservation."""
        blob = sizes if isinstance(sizes, bytes) else pack(U64, sizes)
        ks = keys if isinstance(keys, list) else list(keys)
        if upsert:
            return self._call(P.BatchUpsertStartReq(client_id, ks, blob, cfg or ReplicateConfigMsg()))
        return self._call(P.BatchPutStartReq(client_id, ks, blob, cfg or ReplicateConfigMsg(), release or []))

    def batch_put_end(self, client_id: str, keys: list[str]) -> list[int]:
        """Per key the version (> 0), 0 (nothing published) or a code."""
        return unpack(I64, self.batch_put_end_packed(client_id, keys), len(keys), "batch_put_end reply")

    def batch_put_end_packed(self, client_id: str, keys: list[str]) -> bytes:
        return self._call(P.BatchPutEndReq(client_id, keys if isinstance(keys, list) else list(keys)))

    def batch_put_commit(self, client_id: str, keys: list[str], sizes: bytes, cfg: ReplicateConfigMsg, *,
                         reserved: bool, next_sizes: bytes) -> P.BatchPutCommitReply:
        """batch_put_end of ``keys`` (``reserved``: written into our batch reservation, of the
        packed ``sizes``, no put_start) and a reservation for objects of the packed
        ``next_sizes`` (empty: none), in one round trip."""
        return self._call(P.BatchPutCommitReq(client_id, keys if isinstance(keys, list) else list(keys), sizes, cfg,
                                              reserved, next_sizes))

    def batch_put_revoke(self, client_id: str, keys: list[str]) -> list[int]:
        return unpack(I64, self._call(P.BatchPutRevokeReq(client_id, list(keys))), len(keys),
                      "batch_put_revoke reply")

    def get_replica_list(self, key: str) -> GetReply:
        return self._call(P.GetReplicaListReq(key))

    def batch_get_replica_list(self, keys: list[str]) -> list[GetReply | int]:
        return expand_gets(self.batch_get_packed(keys), len(keys))

    def batch_get_packed(self, keys: list[str]) -> P.BatchGetReply:
        """One lease grant for the whole batch, packed (see ``packing``)."""
        return self._call(P.BatchGetReplicaListReq(keys if isinstance(keys, list) else list(keys)))

    def exist_key(self, key: str) -> bool:
        return self._call(P.ExistKeyReq(key))

    def batch_exist_key(self, keys: list[str]) -> list[bool]:
        return self._call(P.BatchExistKeyReq(list(keys)))

    def get_size(self, key: str) -> int:
        return self._call(P.GetSizeReq(key))

    def remove(self, key: str, force: bool = False) -> None:
        self._call(P.RemoveReq(key, bool(force)))

    def remove_all(self, force: bool = False) -> int:
        return self._call(P.RemoveAllReq(bool(force)))

    def remove_by_regex(self, pattern: str, force: bool = False) -> int:
        return self._call(P.RemoveByRegexReq(pattern, bool(force)))

    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]:
        return self._call(P.BatchRemoveReq(list(keys), bool(force)))

    def offload_done(self, client_id: str, key: str, path: str, size: int) -> None:
        self._call(P.OffloadDoneReq(client_id, key, path, size))

    def watch_keys(self, after: int, prefix: str = "", limit: int = 0, epoch: int = 0,
                   timeout: float | None = None) -> "P.KeyEventsReply":
        """Key events after cursor ``after`` (0 = a snapshot first); see store/key_events.py."""
        return self._call(P.WatchKeysReq(after, prefix, limit, epoch), timeout)

    def offload_failed(self, client_id: str, key: str) -> None:
        self._call(P.OffloadFailedReq(client_id, key))

    # ------------------------------------------------------------------ replica tasks (master_tasks)
    def create_copy_task(self, client_id: str, key: str, targets: list[str]) -> tuple[int, int]:
        return tuple(self._call(P.CreateCopyTaskReq(client_id, key, list(targets))))  # type: ignore[return-value]

    def create_move_task(self, client_id: str, key: str, source: str, target: str) -> tuple[int, int]:
        return tuple(self._call(P.CreateMoveTaskReq(client_id, key, source, target)))  # type: ignore[return-value]

    def query_task(self, task_id: tuple[int, int]) -> "P.TaskInfo":
        return self._call(P.QueryTaskReq(task_id))

    def replica_task_done(self, client_id: str, task_id: tuple[int, int], ok: bool, message: str = "") -> None:
        self._call(P.ReplicaTaskDoneReq(client_id, task_id, ok, message))

    def batch_replica_clear(self, keys: list[str], segment_name: str = "") -> list[str]:
        return self._call(P.BatchReplicaClearReq(list(keys), segment_name))

    def unmount_segment_gracefully(self, client_id: str, segment_key: str, grace_period_ms: int) -> None:
        """Drain, then unmount (see ``MasterState.unmount_segment``); ``segment_status`` says when done."""
        self._call(P.UnmountSegmentReq(client_id, segment_key, grace_period_ms))

    def segment_status(self, client_id: str, segment_key: str) -> tuple[int, int]:
        return tuple(self._call(P.SegmentStatusReq(client_id, segment_key)))  # type: ignore[return-value]
