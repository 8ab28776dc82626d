"""The engine's rpc/data listener: serves peers' WRITE/READ and control requests.

Safety rules (the point of this module):
* every request is validated against the registered regions *before* memory is touched;
  an out-of-bounds WRITE has its payload drained into a scratch buffer, never into memory,
  and the initiator gets an error reply; the violation is logged here at the target;
* garbage (bad magic, absurd lengths) or a truncated message closes that connection only;
  the listener and every other connection keep serving;
* a peer speaking another wire version gets a reply naming both versions, then is closed;
* with a token (``MOONCAKE_AUTH_TOKEN``), a connection must pass the AUTH challenge before
  any other request: otherwise it gets UNAUTHORIZED naming what was refused, and is closed.
Each connection is served by its own thread doing blocking, GIL-releasing socket I/O
straight into / out of registered memory (zero copy).
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Callable

import numpy as np

from mooncake_core import auth, envs
from mooncake_core.transfer import device_memory, metrics, staging, tcp_vec, vec
from mooncake_core.transfer.iov import iov_array, recv_iov, send_iov
from mooncake_core.transfer.memory import RegionTable, memview
from mooncake_core.transfer.sockio import (PeerClosed, Poller, busy_poll_s, drain, is_timeout, recv_exact,
                                           recv_into_exact, sendmsg_all, set_buffers, set_kernel_timeouts)
from mooncake_core.transfer.wire import (MAGIC, OP_VALUES, REQ, RESP, WIRE_VERSION, Op, Response, Status, WireError,
                                         unpack_request, version_mismatch_message)
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.net import bind_listener

log = get_logger("mooncake.te.server")

SCRATCH = 1 << 20
IDLE_TIMEOUT = 600.0  # an idle peer connection is closed after this many seconds
#: a refused unauthenticated WRITE's payload is read and dropped up to this size so that the
#: initiator can read the refusal; a larger one is cut off (the connection closes)
REFUSED_DRAIN_MAX = 16 << 20
#: connections all peers together may hold open at once
MAX_CONNS = 1024


class _Refused(Exception):
    """This connection is done: it was refused (the reply has been sent)."""


class TcpServer:
    def __init__(self, host: str, port: int, regions: RegionTable,
                 descriptor: Callable[[], dict], on_notify: Callable[[str, str], None],
                 segment_name: Callable[[], str], *, token: str | None = None,
                 max_conns_per_peer: int | None = None):
        self.regions = regions
        #: the shared secret peers must prove (None: auth off); read once, never logged
        self._token = token if token is not None else auth.resolve_token()
        #: connections one peer address may hold open at once; more are refused (and closed)
        self.max_conns_per_peer = max_conns_per_peer or envs.MC_TCP_MAX_CONNS_PER_PEER
        self._per_peer: dict[str, int] = {}
        self._descriptor = descriptor
        self._on_notify = on_notify
        self._segment_name = segment_name
        # after serving a request, poll this long for the next one before sleeping in recv
        # (twice the initiator's MC_TCP_BUSY_POLL_US; a bad value fails engine start-up)
        self._spin = 2 * busy_poll_s()
        self._rcvlowat = envs.MC_TCP_RCVLOWAT  # WRITEV payloads (iov.recv_iov)
        self._sndbuf, self._rcvbuf = envs.MC_TCP_SNDBUF, envs.MC_TCP_RCVBUF
        self.sock = bind_listener(host, port, what="transfer engine rpc port (MC_TCP_BIND_ADDRESS / local_hostname)")
        self.host, self.port = self.sock.getsockname()[:2]
        self._stop = threading.Event()
        self._vec_index: tuple[object, tuple] = (None, ())  # (region snapshot, (starts, ends))
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name=f"te-accept-{self.port}", daemon=True)
        self._thread.start()
        log.info("transfer engine rpc port listening",
                 extra={"address": f"{self.host}:{self.port}", "auth": self._token is not None})
        warn = auth.exposure_warning("transfer engine rpc port", str(self.host), self._token,
                                     "read and write every registered buffer")
        if warn:
            log.warning(warn, extra={"address": f"{self.host}:{self.port}"})

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self._stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, addr = self.sock.accept()
            except OSError:
                if self._stop.is_set():
                    return
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            set_kernel_timeouts(conn, IDLE_TIMEOUT)
            set_buffers(conn, self._sndbuf, self._rcvbuf)
            with self._lock:
                n = self._per_peer.get(addr[0], 0)
                full = n >= self.max_conns_per_peer or len(self._conns) >= MAX_CONNS
                if not full:
                    self._per_peer[addr[0]] = n + 1
                    self._conns.add(conn)
            if full:
                metrics.refused("connections")
                log.warning("refusing connection: too many from this peer",
                            extra={"peer": f"{addr[0]}:{addr[1]}", "open": n, "limit": self.max_conns_per_peer})
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, addr), daemon=True,
                             name=f"te-conn-{addr[1]}").start()

    # ------------------------------------------------------------------ per connection
    def _serve(self, conn: socket.socket, addr) -> None:
        scratch = memoryview(bytearray(SCRATCH))
        hdr = bytearray(REQ.size)
        hview = memoryview(hdr)
        peer = f"{addr[0]}:{addr[1]}"
        unpack = REQ.unpack
        contains = self.regions.contains
        rpack = RESP.pack
        served = metrics.served_counters()
        poller = Poller(self._spin)
        authed = self._token is None
        nonce: bytes | None = None
        try:
            while not self._stop.is_set():
                try:
                    first = poller.recv_into(conn, hview, REQ.size)
                    if first is None:
                        first = conn.recv_into(hview, REQ.size)
                except OSError as e:
                    if is_timeout(e):
                        log.info("closing idle peer connection", extra={"peer": peer})
                        return
                    raise
                if first == 0:
                    return
                if first < REQ.size:
                    recv_into_exact(conn, hview[first:])
                magic, ver, op, _flags, rid, raddr, length, aux_len, _ = unpack(hdr)
                if not authed:
                    authed, nonce = self._authenticate(conn, unpack_request(hdr), peer, nonce, scratch)
                    continue
                # hot path: data ops of the current version, validated before memory is touched
                if magic == MAGIC and ver == WIRE_VERSION and aux_len == 0 and op in (Op.WRITE, Op.READ):
                    if length == 0 or contains(raddr, length):
                        if device_memory.active() and self._staged(conn, op, rid, raddr, length, peer):
                            continue  # it was in a device region: staged through pinned host memory
                        if op == Op.WRITE:
                            if length:
                                recv_into_exact(conn, memview(raddr, length))
                            conn.sendall(rpack(MAGIC, WIRE_VERSION, op, 0, rid, 0, 0, 0))
                            served["write"] += length
                        else:
                            bufs: list[bytes | memoryview] = [rpack(MAGIC, WIRE_VERSION, op, 0, rid, 0, 0, length)]
                            if length:
                                bufs.append(memview(raddr, length, writable=False))
                            sendmsg_all(conn, bufs)
                            served["read"] += length
                        continue
                if magic == MAGIC and ver == WIRE_VERSION and op not in OP_VALUES:
                    self._unknown_op(conn, op, rid, peer)
                    return
                req = unpack_request(hdr)  # slow path: raises WireError on garbage
                if req.version != WIRE_VERSION:
                    msg = version_mismatch_message(req.version)
                    log.warning("refusing peer", extra={"peer": peer, "reason": msg})
                    metrics.refused("version")
                    aux = msg.encode()
                    sendmsg_all(conn, [Response(req.op, req.req_id, Status.VERSION_MISMATCH,
                                                len(aux)).pack(), aux])
                    return
                self._handle(conn, req, peer, scratch)
        except _Refused:
            pass
        except WireError as e:
            metrics.refused("garbage")
            log.warning("dropping connection: malformed message", extra={"peer": peer, "error": str(e)})
        except (PeerClosed, ConnectionError, socket.timeout) as e:
            log.debug("peer connection ended", extra={"peer": peer, "error": str(e)})
        except OSError as e:
            if not self._stop.is_set():
                log.debug("peer connection error", extra={"peer": peer, "error": str(e)})
        except Exception:  # never let one connection kill the server
            log.exception("unexpected error serving peer", extra={"peer": peer})
        finally:
            with self._lock:
                self._conns.discard(conn)
                left = self._per_peer.get(addr[0], 1) - 1
                if left > 0:
                    self._per_peer[addr[0]] = left
                else:
                    self._per_peer.pop(addr[0], None)
            try:
                conn.close()
            except OSError:
                pass

    def _authenticate(self, conn: socket.socket, req, peer: str, nonce: bytes | None,
                      scratch: memoryview) -> tuple[bool, bytes | None]:
        """One request of a connection that has not proven the token yet: serve the AUTH
        challenge / answer, refuse anything else. Returns (authenticated, pending nonce);
        raises _Refused after replying UNAUTHORIZED."""
        token = self._token
        assert token is not None
        if req.version != WIRE_VERSION:
            raise WireError(version_mismatch_message(req.version))
        aux = bytes(recv_exact(conn, req.aux_len)) if req.aux_len else b""
        if req.op == Op.AUTH and not aux:
            nonce = auth.new_nonce()
            self._reply(conn, Op.AUTH, req.req_id, Status.OK, nonce)
            return False, nonce
        if req.op == Op.AUTH:
            if nonce is not None and auth.verify(token, nonce, aux, auth.TE_CONTEXT):
                self._reply(conn, Op.AUTH, req.req_id, Status.OK)
                return True, None
            reason = "wrong token" if nonce is not None else "answer sent before the challenge"
        else:
            reason = "no token presented"
            if req.op in (Op.WRITE, Op.WRITEV) and req.length <= REFUSED_DRAIN_MAX:
                drain(conn, req.length, scratch)  # so that the initiator reads the refusal
        metrics.refused("auth")
        what = Op(req.op).name if req.op in OP_VALUES else f"op {req.op}"
        msg = auth.refusal(f"segment {self._segment_name()!r} refused {what}", reason)
        log.warning("refused unauthenticated peer", extra={"peer": peer, "op": what, "reason": reason})
        self._reply(conn, req.op, req.req_id, Status.UNAUTHORIZED, msg.encode())
        raise _Refused()

    def _reply(self, conn: socket.socket, op: int, req_id: int, status: int, aux: bytes = b"",
               payload: memoryview | None = None) -> None:
        bufs: list[bytes | memoryview] = [Response(op, req_id, status, len(aux),
                                                   len(payload) if payload is not None else 0).pack()]
        if aux:
            bufs.append(aux)
        if payload is not None:
            bufs.append(payload)
        sendmsg_all(conn, bufs)

    def _oob(self, peer: str, op: str, addr: int, length: int) -> bytes:
        metrics.refused("out_of_bounds")
        msg = (f"{op} of {length} bytes at {addr:#x} is outside every region registered by segment "
               f"{self._segment_name()!r}")
        log.warning("refused out-of-bounds request", extra={"peer": peer, "op": op, "addr": hex(addr),
                                                            "length": length})
        return msg.encode()

    def _handle(self, conn: socket.socket, req, peer: str, scratch: memoryview) -> None:
        aux = bytes(recv_exact(conn, req.aux_len)) if req.aux_len else b""
        op = req.op
        if (op == Op.WRITE or op == Op.READ) and device_memory.active() \
                and self.regions.contains(req.addr, req.length) \
                and self._staged(conn, op, req.req_id, req.addr, req.length, peer):
            return
        if op == Op.WRITE:
            if req.length == 0 or self.regions.contains(req.addr, req.length):
                if req.length:
                    recv_into_exact(conn, memview(req.addr, req.length))
                metrics.served("write", req.length)
                self._reply(conn, op, req.req_id, Status.OK)
            else:
                drain(conn, req.length, scratch)
                self._reply(conn, op, req.req_id, Status.OUT_OF_BOUNDS,
                            self._oob(peer, "write", req.addr, req.length))
        elif op == Op.READ:
            if req.length == 0 or self.regions.contains(req.addr, req.length):
                payload = memview(req.addr, req.length, writable=False) if req.length else None
                self._reply(conn, op, req.req_id, Status.OK, payload=payload)
                metrics.served("read", req.length)
            else:
                self._reply(conn, op, req.req_id, Status.OUT_OF_BOUNDS,
                            self._oob(peer, "read", req.addr, req.length))
        elif op == Op.WRITEV or op == Op.READV:
            self._vectored(conn, req, aux, peer, scratch)
        elif op == Op.GET_DESC:
            self._reply(conn, op, req.req_id, Status.OK, json.dumps(self._descriptor()).encode())
        elif op == Op.PROBE:
            self._reply(conn, op, req.req_id, Status.OK, self._segment_name().encode())
        elif op == Op.AUTH:  # authenticated already, or no token here: nothing to prove
            self._reply(conn, op, req.req_id, Status.OK)
        elif op == Op.NOTIFY:
            try:
                d = json.loads(aux)
                name, msg = str(d["name"]), str(d["msg"])
            except (ValueError, KeyError, TypeError) as e:
                raise WireError(f"bad notify payload: {e}") from None
            self._on_notify(name, msg)
            self._reply(conn, op, req.req_id, Status.OK)
        else:  # unreachable: unpack_request rejects unknown ops
            raise WireError(f"unknown op {op}")

    # ------------------------------------------------------------------ vectored requests
    def _unknown_op(self, conn: socket.socket, op: int, req_id: int, peer: str) -> None:
        """An op of our version that we do not know (a newer peer?): say so, then close --
        its aux / payload length cannot be trusted, so the stream cannot be resynchronised."""
        metrics.refused("garbage")
        msg = (f"unknown op {op}: segment {self._segment_name()!r} serves ops "
               f"{', '.join(o.name for o in Op)}; is the peer running a newer release?")
        log.warning("refusing unknown op", extra={"peer": peer, "op": op})
        aux = msg.encode()
        sendmsg_all(conn, [Response(op, req_id, Status.BAD_REQUEST, len(aux)).pack(), aux])

    def _region_index(self) -> tuple:
        """numpy starts/ends of the registered regions, rebuilt when the table changes (the
        table publishes a new snapshot object on every register/unregister)."""
        snap = getattr(self.regions, "_snap", None)
        cached, index = self._vec_index
        if snap is None or cached is not snap:
            index = vec.region_index(self.regions.regions())
            if snap is not None:
                self._vec_index = (snap, index)
        return index

    def _vectored(self, conn: socket.socket, req, aux: bytes, peer: str, scratch: memoryview) -> None:
        """WRITEV / READV: validate the whole block list first; refuse it whole (draining a
        WRITEV's payload into scratch) if any block is outside the registered regions."""
        write = req.op == Op.WRITEV
        addrs, lens = tcp_vec.decode_blocks(aux, req.length)  # WireError: malformed, connection dropped
        starts, ends = self._region_index()
        bad = tcp_vec.first_bad(starts, ends, addrs, lens)
        if bad is not None:
            if write:
                drain(conn, req.length, scratch)
            metrics.refused("out_of_bounds")
            a, n = int(addrs[bad]), int(lens[bad])
            msg = (f"{'write' if write else 'read'} of {n} bytes at {a:#x} (block {bad} of {len(lens)} in a "
                   f"vectored request; the whole request was refused) is outside every region registered "
                   f"by segment {self._segment_name()!r}")
            log.warning("refused out-of-bounds vectored request",
                        extra={"peer": peer, "op": "writev" if write else "readv", "block": bad,
                               "addr": hex(a), "length": n})
            self._reply(conn, req.op, req.req_id, Status.OUT_OF_BOUNDS, msg.encode())
            return
        ra, rl = tcp_vec.runs(addrs, lens)  # remotely contiguous blocks: one iovec entry
        if device_memory.active() and any(device_memory.find(int(a), int(n)) for a, n in zip(ra, rl)):
            self._vectored_staged(conn, req, ra, rl)
            return
        if write:
            recv_iov(conn, iov_array(ra, rl), lowat=self._rcvlowat)
            conn.sendall(Response(req.op, req.req_id, Status.OK).pack())
            metrics.served("write", req.length)
        else:
            head = np.frombuffer(Response(req.op, req.req_id, Status.OK, 0, req.length).pack(), dtype=np.uint8)
            send_iov(conn, iov_array(ra, rl, head=(head.ctypes.data, head.nbytes)))
            metrics.served("read", req.length)

    # ------------------------------------------------------------------ device memory
    def _staged(self, conn: socket.socket, op: int, rid: int, addr: int, length: int, peer: str) -> bool:
        """A WRITE/READ inside a registered device region: through pinned host buffers
        (staging.py), the device copy of one chunk overlapping the socket I/O of the next. False
        when the range is host memory (the caller serves it zero-copy). A device error closes
        the connection (the initiator gets an error within its deadline, never a hang)."""
        r = device_memory.find(addr, length) if length else None
        if r is None:
            return False
        try:
            if op == Op.WRITE:
                staging.recv_to_device(lambda mv: recv_into_exact(conn, mv), addr, length, r)
                conn.sendall(RESP.pack(MAGIC, WIRE_VERSION, op, 0, rid, 0, 0, 0))
                metrics.served("write", length)
            else:
                staging.send_from_device(lambda bufs: sendmsg_all(conn, bufs),
                                         RESP.pack(MAGIC, WIRE_VERSION, op, 0, rid, 0, 0, length), addr, length, r)
                metrics.served("read", length)
        except (OSError, PeerClosed):
            raise
        except Exception as e:  # noqa: BLE001 - a device failure: say which, drop this connection only
            log.error("device copy failed; closing the connection", extra={"peer": peer, "addr": hex(addr),
                                                                           "length": length, "error": str(e)})
            raise _Refused() from e
        return True

    def _vectored_staged(self, conn: socket.socket, req, ra, rl) -> None:
        """WRITEV/READV touching device memory: run by run, device runs staged (bounds already checked)."""
        write = req.op == Op.WRITEV
        if not write:
            sendmsg_all(conn, [Response(req.op, req.req_id, Status.OK, 0, req.length).pack()])
        for a, n in zip(ra.tolist(), rl.tolist()):
            r = device_memory.find(a, n)
            if write:
                if r is None:
                    recv_into_exact(conn, memview(a, n))
                else:
                    staging.recv_to_device(lambda mv: recv_into_exact(conn, mv), a, n, r)
            elif r is None:
                sendmsg_all(conn, [memview(a, n, writable=False)])
            else:
                staging.send_from_device(lambda bufs: sendmsg_all(conn, bufs), b"", a, n, r)
        if write:
            conn.sendall(Response(req.op, req.req_id, Status.OK).pack())
        metrics.served("write" if write else "read", req.length)
