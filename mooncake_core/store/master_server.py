"""Thin RPC layer of the store master: one epoll loop in front of ``MasterState``.

One thread accepts TCP connections, reads length-prefixed frames (see ``protocol``),
decodes them (msgspec, typed), calls the pure state under a lock, and writes the reply.
The lock is only contended by the Prometheus scrape thread: each request takes microseconds,
so a single request thread keeps the state free of races and still serves tens of thousands
of requests per second (see bench/store/bench_master_rpc.py). Sockets are non-blocking: a slow or
stuck client never blocks the loop (its replies are buffered, bounded).

Malformed input (short frame, bad header, undecodable or mistyped body, unknown method,
protocol version mismatch) gets an error reply with a message and code -600; an oversize
frame also closes that connection (it cannot be resynchronised); an unexpected exception in
a handler gets -1; the server keeps serving in every case.
"""

from __future__ import annotations

import bisect
import os
import select
import socket
import threading
import time
from typing import Any, Callable

import msgspec
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from mooncake_core import auth
from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store import protocol as P
from mooncake_core.store.limits import RequestLimits
from mooncake_core.store.master_state import MasterState
from mooncake_core.store.packing import U64, unpack
from mooncake_core.utils.busypoll import POLL_MAX_REQUEST, Poller
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.net import bind_listener

log = get_logger("mooncake.store.master_server")


def _sizes(r: Any) -> list[int]:
    """The packed ``sizes`` of a batch put request (-600 when they do not match its keys)."""
    return unpack(U64, r.sizes, len(r.keys), f"{type(r).__struct_config__.tag}: sizes")


def _handlers(st: MasterState, info: Callable[[], P.MasterInfo]) -> dict[type, Callable[[Any], Any]]:
    return {
        P.PingReq: lambda r: info(),
        P.MountSegmentReq: lambda r: st.mount_segment(r.client_id, r.segment_name, r.base, r.size, r.prev_epoch,
                                                      r.segment_id),
        P.UnmountSegmentReq: lambda r: st.unmount_segment(r.client_id, r.segment_name, r.grace_period_ms),
        P.SegmentStatusReq: lambda r: st.segment_status(r.client_id, r.segment_name),
        P.HeartbeatReq: lambda r: st.heartbeat(r.client_id, r.release),
        P.ReportObjectsReq: lambda r: st.report_objects(r.client_id, r.objects, r.versions),
        P.PutStartReq: lambda r: st.put_start(r.client_id, r.key, r.size, r.cfg, release=r.release),
        P.UpsertStartReq: lambda r: st.put_start(r.client_id, r.key, r.size, r.cfg, upsert=True),
        P.PutEndReq: lambda r: st.put_end(r.client_id, r.key),
        P.PutRevokeReq: lambda r: st.put_revoke(r.client_id, r.key),
        P.PutCommitReq: lambda r: st.put_commit(r.client_id, r.key, r.size, r.cfg, r.reserved, r.next_size),
        P.BatchPutStartReq: lambda r: st.batch_put_start(r.client_id, r.keys, _sizes(r), r.cfg, release=r.release),
        P.BatchUpsertStartReq: lambda r: st.batch_put_start(r.client_id, r.keys, _sizes(r), r.cfg, upsert=True),
        P.BatchPutEndReq: lambda r: st.batch_put_end(r.client_id, r.keys),
        P.BatchPutCommitReq: lambda r: st.batch_put_commit(r.client_id, r.keys, r.sizes, r.cfg, r.reserved,
                                                           r.next_sizes),
        P.BatchPutRevokeReq: lambda r: st.batch_put_revoke(r.client_id, r.keys),
        P.GetReplicaListReq: lambda r: st.get_replica_list(r.key),
        P.BatchGetReplicaListReq: lambda r: st.batch_get_replica_list(r.keys),
        P.ExistKeyReq: lambda r: st.exist_key(r.key),
        P.BatchExistKeyReq: lambda r: st.batch_exist_key(r.keys),
        P.GetSizeReq: lambda r: st.get_size(r.key),
        P.RemoveReq: lambda r: st.remove(r.key, r.force),
        P.RemoveAllReq: lambda r: st.remove_all(r.force),
        P.RemoveByRegexReq: lambda r: st.remove_by_regex(r.pattern, r.force),
        P.BatchRemoveReq: lambda r: st.batch_remove(r.keys, r.force),
        P.OffloadDoneReq: lambda r: st.offload_done(r.client_id, r.key, r.path, r.size),
        P.OffloadFailedReq: lambda r: st.offload_failed(r.client_id, r.key),
        P.WatchKeysReq: lambda r: st.watch_keys(r.after, r.prefix, r.limit, r.epoch),
        P.CreateCopyTaskReq: lambda r: st.tasks.create_copy(r.key, r.targets),
        P.CreateMoveTaskReq: lambda r: st.tasks.create_move(r.key, r.source, r.target),
        P.QueryTaskReq: lambda r: st.tasks.query(r.task_id),
        P.ReplicaTaskDoneReq: lambda r: st.tasks.done(r.client_id, r.task_id, r.ok, r.message),
        P.BatchReplicaClearReq: lambda r: st.batch_replica_clear(r.keys, r.segment_name),
    }


LATENCY_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)


class _Latency:
    """Per-method latency histogram kept in plain lists (~0.3 us per observation instead of
    ~4 us for prometheus_client's Histogram -- it is on every request's path); exported as
    a regular Prometheus histogram by the collector."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds


def _gauges(*specs: tuple[str, str, float]):
    """One unlabelled GaugeMetricFamily per (name, help, value)."""
    for name, help_, value in specs:
        g = GaugeMetricFamily(name, help_)
        g.add_metric([], value)
        yield g


class _StateCollector:
    """Reads gauges/counters straight from the state at scrape time (no per-request cost)."""

    def __init__(self, server: "MasterServer") -> None:
        self.server = server

    def collect(self):
        st, lock = self.server.state, self.server.lock
        with lock:
            segs = [(s.key, s.alloc.used, s.size) for s in st.segments.values()]
            n_keys, n_inflight, n_clients = len(st.objects), st.puts_in_flight, len(st.clients)
            stats = {k: getattr(st.stats, k) for k in st.stats.__slots__}
            disk_used = st.tier.disk_used
            n_offloading = len(st.tier.offloading)
            lat = [(req.__struct_config__.tag, list(h.counts), h.total) for req, h in self.server._lat.items()]
        h = HistogramMetricFamily("mooncake_master_rpc_seconds", "Master RPC handling time by method",
                                  labels=["method"])
        for method, counts, total in lat:
            cum, buckets = 0, []
            for le, c in zip(LATENCY_BUCKETS + (float("inf"),), counts):
                cum += c
                buckets.append(("+Inf" if le == float("inf") else repr(le), cum))
            h.add_metric([method], buckets, total)
        yield h
        yield from _gauges(
            ("mooncake_master_is_leader", "1 when this master serves requests (HA leader or no HA)",
             1 if self.server.is_leader else 0),
            ("mooncake_master_keys", "Complete objects known to the master", n_keys),
            ("mooncake_master_puts_in_flight", "Puts started and not yet ended/revoked", n_inflight),
            ("mooncake_master_active_clients", "Clients with a recent heartbeat", n_clients),
            ("mooncake_master_segments", "Mounted memory segments", len(segs)),
        )
        used = GaugeMetricFamily("mooncake_master_segment_used_bytes", "Bytes allocated in a segment",
                                 labels=["segment"])
        cap = GaugeMetricFamily("mooncake_master_segment_capacity_bytes", "Size of a segment", labels=["segment"])
        for name, u, c in segs:
            used.add_metric([name], u)
            cap.add_metric([name], c)
        yield used
        yield cap
        yield from _gauges(
            ("mooncake_master_used_bytes", "Bytes allocated in all segments", sum(u for _, u, _ in segs)),
            ("mooncake_master_capacity_bytes", "Total size of all segments", sum(c for _, _, c in segs)),
            ("mooncake_master_disk_used_bytes", "Bytes in the SSD tier", disk_used),
            ("mooncake_master_offloads_in_flight", "Objects being written to the SSD tier", n_offloading),
        )
        for key, help_ in (("hits", "GetReplicaList calls that found the object"),
                           ("misses", "GetReplicaList calls for missing/incomplete objects"),
                           ("evictions", "Objects whose memory replicas were evicted"),
                           ("lease_refusals", "Removes refused because the object was leased (-706)"),
                           ("offloads", "Objects written to the SSD tier"),
                           ("puts", "Puts completed"),
                           ("put_conflicts", "PutStarts refused because the key exists (-705)"),
                           ("no_space", "PutStarts refused for lack of space (-200)"),
                           ("disk_evictions", "Objects dropped from the SSD tier (quota)"),
                           ("expired_clients", "Clients dropped after client_ttl without heartbeat"),
                           ("takeovers", "Puts taken over after put_start_discard_timeout"),
                           ("reclaim_waits", "Puts asked to wait while reservations/quarantine are taken back"),
                           ("key_limit_evictions", "Objects evicted to stay within --max_keys"),
                           ("key_limit_refusals", "Puts of new keys refused at --max_keys (-200)")):
            c = CounterMetricFamily(f"mooncake_master_{key}", help_)
            c.add_metric([], stats[key])
            yield c


class _Conn:
    __slots__ = ("sock", "inbuf", "outbuf", "peer", "want_write", "authed", "nonce", "refused")

    def __init__(self, sock: socket.socket, peer: str, authed: bool):
        self.sock = sock
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.peer = peer
        self.want_write = False
        self.authed = authed  #: passed the token challenge (or the master has no token)
        self.nonce: bytes | None = None  #: challenge sent, answer pending
        self.refused = False  #: answered UNAUTHORIZED: flush and close


#: connections one client address may hold open at once (a client opens one per calling thread)
MAX_CONNS_PER_PEER = 512
#: a client that stops reading its replies is disconnected past this much buffered output
MAX_PENDING_OUTPUT = 64 << 20
#: bytes read per recv (one reusable buffer; larger frames arrive over several reads)
RECV_BUFFER = 1 << 20
#: after serving requests, keep polling without sleeping this long (microseconds). A client
#: issuing back-to-back calls (is_exist in a loop) sends its next request within tens of
#: microseconds; a thread that blocked in epoll_wait meanwhile needs ~40 us (more on an idle
#: VM) to be woken and rescheduled, which -- not the work -- bounded one thread's rate at
#: ~10k calls/s. Cost: at most this much CPU after a burst, nothing while idle, and polls that
#: find nothing back off (``mooncake_core.utils.busypoll``).
DEFAULT_BUSY_POLL_US = 100


class MasterServer:
    """TCP listener + request thread around a MasterState."""

    def __init__(self, state: MasterState, host: str = "0.0.0.0", port: int = 50051, *,
                 advertise_address: str | None = None, tick_interval: float = 0.1,
                 registry: CollectorRegistry | None = None, busy_poll_us: int = DEFAULT_BUSY_POLL_US,
                 auth_token: str | None = None, max_conns_per_peer: int = MAX_CONNS_PER_PEER,
                 limits: RequestLimits | None = None) -> None:
        self.state = state
        self.limits = limits or RequestLimits()
        #: the shared secret clients must prove (None: auth off); never logged
        self.auth_token = auth_token if auth_token is not None else auth.resolve_token()
        self.max_conns_per_peer = max_conns_per_peer
        self._per_peer: dict[str, int] = {}
        self.host = host
        self.requested_port = port
        self.advertise_address = advertise_address
        self.tick_interval = tick_interval
        if busy_poll_us < 0:
            raise ValueError(f"busy_poll_us: expected >= 0 microseconds, got {busy_poll_us!r}")
        self.busy_poll_s = busy_poll_us / 1e6
        self.lock = threading.Lock()
        self.port: int | None = None
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        #: HA: returns False while this master may not act as leader (follower, or a leader
        #: whose etcd lease may have expired): requests other than ping are then refused
        self.leader_check: Callable[[], bool] | None = None
        self.registry = registry
        self._lat: dict[type, _Latency] = {req: _Latency() for req in P.RESULT_TYPES}
        if registry is not None:
            registry.register(_StateCollector(self))
        self._handlers = _handlers(state, self._info)
        self._served_big = False  # a request over POLL_MAX_REQUEST bytes since the loop last polled
        self._rbuf = bytearray(RECV_BUFFER)
        self._rview = memoryview(self._rbuf)

    @property
    def is_leader(self) -> bool:
        return self.leader_check is None or self.leader_check()

    def _info(self) -> P.MasterInfo:
        st = self.state
        return P.MasterInfo(P.PROTOCOL_VERSION, self.address, self.is_leader, st.cfg.enable_offload,
                            st.cfg.root_fs_dir, len(st.objects), len(st.segments), st.epoch, time.time())

    @property
    def address(self) -> str:
        return self.advertise_address or f"{self.host}:{self.port}"

    def bind(self) -> int:
        """Bind the listening socket (clear error if the port is taken); returns the port."""
        self._listener = bind_listener(self.host, self.requested_port,
                                       what="master RPC (--port/--rpc_address)", backlog=1024)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        return self.port

    def start(self) -> "MasterServer":
        if self._listener is None:
            self.bind()
        self._thread = threading.Thread(target=self._run, name="mc-master-rpc", daemon=True)
        self._thread.start()
        log.info("master RPC listening", extra={"address": f"{self.host}:{self.port}",
                                                "advertised": self.address, "auth": self.auth_token is not None})
        warn = auth.exposure_warning("the master RPC", self.host, self.auth_token,
                                     "remove every key and mount fake segments")
        if warn:
            log.warning(warn, extra={"address": f"{self.host}:{self.port}"})
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    # ------------------------------------------------------------------ event loop
    def _run(self) -> None:
        lst = self._listener
        assert lst is not None
        # select.epoll directly: selectors' per-call bookkeeping costs several microseconds
        ep = select.epoll()
        lfd = lst.fileno()
        ep.register(lfd, select.EPOLLIN)
        conns: dict[int, _Conn] = {}
        next_tick = time.monotonic() + self.tick_interval
        spin = self.busy_poll_s
        poller = Poller(spin)  # polls after bursts, backs off when the next request does not come
        polling = False
        hot_until = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if polling and now >= hot_until:
                    poller.record(False)
                    polling = False
                events = ep.poll(0.0 if polling else max(0.0, next_tick - now))
                if not events:
                    if now >= next_tick:
                        next_tick = now + self.tick_interval
                        self._tick()
                    continue
                if polling:
                    poller.record(True)
                    polling = False
                for fd, ev in events:
                    if fd == lfd:
                        self._accept(lst, ep, conns)
                        continue
                    conn = conns.get(fd)
                    if conn is None:
                        continue
                    if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                        self._on_readable(conn, ep, conns)
                    if ev & select.EPOLLOUT and conn.sock.fileno() >= 0:
                        self._flush(conn, ep, conns)
                now = time.monotonic()
                if self._served_big:  # a batch: its client is busy with the answer for a while
                    self._served_big = False
                elif poller.should_poll():
                    polling = True
                    hot_until = now + spin
                if now >= next_tick:
                    next_tick = now + self.tick_interval
                    self._tick()
        finally:
            for conn in list(conns.values()):
                self._close(conn, ep, conns)
            ep.close()

    def _accept(self, lst: socket.socket, ep: "select.epoll", conns: dict[int, _Conn]) -> None:
        for _ in range(64):
            try:
                sock, peer = lst.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. EMFILE: keep serving the others
                log.warning("accept failed", extra={"error": str(e)})
                return
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            host = peer[0] if isinstance(peer, tuple) else str(peer)
            n = self._per_peer.get(host, 0)
            if n >= self.max_conns_per_peer:
                log.warning("refusing connection: too many from this client",
                            extra={"peer": host, "open": n, "limit": self.max_conns_per_peer})
                sock.close()
                continue
            self._per_peer[host] = n + 1
            conn = _Conn(sock, f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer),
                         authed=self.auth_token is None)
            conns[sock.fileno()] = conn
            ep.register(sock.fileno(), select.EPOLLIN)

    def _close(self, conn: _Conn, ep: "select.epoll", conns: dict[int, _Conn]) -> None:
        fd = conn.sock.fileno()
        if fd >= 0:
            try:
                ep.unregister(fd)
            except (OSError, ValueError):
                pass
            if conns.pop(fd, None) is not None:
                host = conn.peer.rsplit(":", 1)[0]
                left = self._per_peer.get(host, 1) - 1
                if left > 0:
                    self._per_peer[host] = left
                else:
                    self._per_peer.pop(host, None)
        conn.sock.close()

    def _on_readable(self, conn: _Conn, ep: "select.epoll", conns: dict[int, _Conn]) -> None:
        # recv_into one preallocated buffer: ``recv(1 << 20)`` would malloc (mmap) and shrink
        # a 1 MiB bytes object per request -- measured ~20 us, more than the rest of the request
        try:
            got = conn.sock.recv_into(self._rbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn, ep, conns)
            return
        if not got:
            self._close(conn, ep, conns)
            return
        if got > POLL_MAX_REQUEST:
            self._served_big = True
        data = self._rview[:got]  # valid until the next recv; decoded Structs own their data
        buf = conn.inbuf
        if not buf and not conn.outbuf and len(data) >= 4 and P.unpack_len(data) + 4 == len(data):
            # fast path: exactly one frame arrived and nothing is queued: answer directly
            out = self._handle(data[4:], conn)
            try:
                sent = conn.sock.send(out)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._close(conn, ep, conns)
                return
            if sent == len(out) and not conn.refused:
                return
            conn.outbuf += memoryview(out)[sent:]
        else:
            buf += data
            pos = 0
            while len(buf) - pos >= 4:
                n = P.unpack_len(buf, pos)
                if n > P.MAX_FRAME:
                    conn.outbuf += P.reply_frame(P.PROTOCOL_VERSION, 0, ErrorCode.INVALID_PARAMS,
                                                 f"frame of {n} bytes exceeds the {P.MAX_FRAME}-byte limit; "
                                                 f"closing the connection".encode())
                    self._flush(conn, ep, conns)
                    self._close(conn, ep, conns)
                    return
                if len(buf) - pos - 4 < n:
                    break
                frame = bytes(buf[pos + 4:pos + 4 + n])
                pos += 4 + n
                out = self._handle(memoryview(frame), conn)
                if out is not None:
                    conn.outbuf += out
                if conn.refused:
                    break
            if pos:
                del buf[:pos]
        self._flush(conn, ep, conns)
        if conn.refused:  # the refusal went out (or is lost with the connection): done with this peer
            self._close(conn, ep, conns)

    def _flush(self, conn: _Conn, ep: "select.epoll", conns: dict[int, _Conn]) -> None:
        if conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
                del conn.outbuf[:sent]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._close(conn, ep, conns)
                return
        if len(conn.outbuf) > MAX_PENDING_OUTPUT:
            log.warning("client does not read its replies: disconnecting", extra={"peer": conn.peer})
            self._close(conn, ep, conns)
            return
        want = bool(conn.outbuf)
        if want != conn.want_write:
            conn.want_write = want
            ep.modify(conn.sock.fileno(), select.EPOLLIN | (select.EPOLLOUT if want else 0))

    def _tick(self) -> None:
        try:
            with self.lock:
                self.state.tick()
        except Exception:  # noqa: BLE001 - a bug in a periodic rule must not stop the server
            log.exception("master tick failed")
            return
        self._delete_files()

    def _delete_files(self) -> None:
        """Unlink the SSD-tier files the state released. Also run right after each request, so a
        file dropped to make room for an offload is gone before the reply hands out the task."""
        if not self.state.tier.pending_file_deletes:
            return
        with self.lock:
            deletes = self.state.take_file_deletes()
        root = self.state.cfg.root_fs_dir
        for rel in deletes:
            if not root:
                continue
            try:
                os.unlink(os.path.join(root, rel))
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("cannot delete SSD-tier file", extra={"path": rel, "error": str(e)})

    def _authenticate(self, conn: _Conn, version: int, rid: int, req: Any) -> bytes:
        """A request of a connection that has not proven the token: the challenge, its answer,
        or a refusal (after which the connection is closed)."""
        token = self.auth_token
        assert token is not None
        if isinstance(req, P.AuthChallengeReq):
            conn.nonce = auth.new_nonce()
            return P.reply_frame(version, rid, 0, P.result_encoder.encode(conn.nonce))
        if isinstance(req, P.AuthReq):
            if conn.nonce is not None and auth.verify(token, conn.nonce, req.proof, auth.MASTER_CONTEXT):
                conn.authed, conn.nonce = True, None
                return P.reply_frame(version, rid, 0, P.result_encoder.encode(None))
            reason = "wrong token" if conn.nonce is not None else "answer sent before the challenge"
        else:
            reason = "no token presented"
        conn.refused = True
        method = type(req).__struct_config__.tag
        log.warning("refused unauthenticated client", extra={"peer": conn.peer, "method": method, "reason": reason})
        msg = auth.refusal(f"master {self.address} refused {method}", reason)
        return P.reply_frame(version, rid, ErrorCode.INVALID_PARAMS, msg.encode())

    def _handle(self, frame: memoryview, conn: _Conn) -> bytes:
        """One request frame (without its length prefix) -> one complete reply frame."""
        if len(frame) < P.HEADER_SIZE:
            return P.reply_frame(P.PROTOCOL_VERSION, 0, ErrorCode.INVALID_PARAMS,
                                 f"malformed request: frame of {len(frame)} bytes is shorter than the "
                                 f"{P.HEADER_SIZE}-byte header".encode())
        version, rid = P.unpack_header(bytes(frame[:P.HEADER_SIZE]))
        if version != P.PROTOCOL_VERSION:
            return P.reply_frame(P.PROTOCOL_VERSION, rid, ErrorCode.INVALID_PARAMS,
                                 f"protocol version mismatch: client speaks v{version}, this master "
                                 f"speaks v{P.PROTOCOL_VERSION}; upgrade the older side".encode())
        try:
            req = P.request_decoder.decode(frame[P.HEADER_SIZE:])
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            return P.reply_frame(version, rid, ErrorCode.INVALID_PARAMS, f"malformed request: {e}".encode())
        cls = type(req)
        if not conn.authed:
            return self._authenticate(conn, version, rid, req)
        if cls is P.AuthChallengeReq:  # authenticated already, or this master has no token
            return P.reply_frame(version, rid, 0, P.result_encoder.encode(b""))
        if cls is P.AuthReq:
            return P.reply_frame(version, rid, 0, P.result_encoder.encode(None))
        if self.leader_check is not None and cls is not P.PingReq and not self.leader_check():
            return P.reply_frame(version, rid, ErrorCode.RPC_FAIL,
                                 f"{self.address} is not the master leader (a follower, or its etcd "
                                 f"lease lapsed); use master_server_addr=etcd://... to find the "
                                 f"leader".encode())
        problem = self.limits.check(req)
        if problem is not None:
            return P.reply_frame(version, rid, ErrorCode.INVALID_PARAMS, problem.encode())
        t0 = time.perf_counter()
        try:
            with self.lock:
                result = self._handlers[cls](req)
            payload = P.result_encoder.encode(result)
            status = 0
        except MooncakeError as e:
            status, payload = e.code, e.message.encode()
        except Exception as e:  # noqa: BLE001 - never let one request kill the master
            log.exception("master request failed", extra={"method": cls.__name__})
            status, payload = int(ErrorCode.INTERNAL_ERROR), f"internal error in {cls.__name__}: {e!r}".encode()
        self._lat[cls].observe(time.perf_counter() - t0)
        if self.state.tier.pending_file_deletes:
            self._delete_files()
        return P.reply_frame(version, rid, status, payload)
