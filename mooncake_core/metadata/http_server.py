"""HTTP metadata server: Mooncake's ``/metadata?key=K`` key/value service, on aiohttp.

Semantics follow Mooncake's ``mooncake_http_metadata_server``:

- ``GET /metadata?key=K``    200 with the stored body, 404 ``metadata not found``
- ``PUT /metadata?key=K``    stores the raw body, 200 ``metadata updated``
- ``DELETE /metadata?key=K`` 200 ``metadata deleted``, 404 when missing
- missing or blank ``key``  400 ``metadata key is required``; a key is used with surrounding
  whitespace stripped (``?key=%20k%20`` is ``k``), as Mooncake's Python server does
- these responses carry ``Content-Type: application/json`` (short text bodies), as Mooncake's do:
  its clients and tests read the header; our own additions below answer ``text/plain``
- ``MC_METADATA_HTTP_TOKEN`` set: requests need ``Authorization: Bearer <token>`` (else 401)
- key/byte budgets (``MC_METADATA_MAX_KEYS``, ``MC_METADATA_MAX_TOTAL_BYTES``): 507

Ours adds ``GET /metadata?prefix=P`` (``{"keys": [...]}``, used by ``MetadataBackend.list``),
``/health``, ``/metrics`` (Prometheus), a 413 naming the limit for oversized bodies, and
``--persist-path`` so descriptors survive a restart (Mooncake issue #2246).

Unlike Mooncake's server, a PUT of an existing ``rpc_meta`` key with a different value is
accepted (last writer wins, as with etcd and Redis), so an engine restarted on a new port can
re-publish itself.

Four ways to run it: the console script (:func:`main`); :class:`HttpMetadataServer` on a
background thread (tests, demos, the store master's ``--enable_http_metadata_server``);
:class:`MetadataHttpService` inside an existing aiohttp app/loop (``add_routes`` or
``start``/``stop`` coroutines); or the original's ``KVBootstrapServer`` interface
(:mod:`mooncake_core.metadata.kv_bootstrap`, ``mooncake.http_metadata_server``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
import threading
import time

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

from mooncake_core.metadata import persist
from mooncake_core import auth, envs
from mooncake_core.metadata.kvstore import KVStore, PutResult
from mooncake_core.utils.log import get_logger, setup_logging
from mooncake_core.utils.net import bind_listener, parse_host_port
from mooncake_core.utils.sizes import format_size, parse_size
from mooncake_core.utils.tls import server_context

log = get_logger("mooncake.metadata.http_server")

DEFAULT_MAX_BODY = 16 << 20


def _text(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text, content_type="text/plain")


def _reply(status: int, text: str) -> web.Response:
    """A response Mooncake's server defines, with the content type it sends."""
    return web.Response(status=status, text=text, content_type="application/json")


class MetadataHttpService:
    """The request handlers, table, persistence and metrics of one metadata server.

    Usable inside any aiohttp application: ``service.add_routes(app)``; or standalone on the
    current loop: ``port = await service.start(host, port)`` / ``await service.stop()``.
    """

    def __init__(self, persist_path: str | None = None, *, auth_token: str | None = None,
                 max_body: int = DEFAULT_MAX_BODY, max_keys: int | None = None,
                 max_total_bytes: int | None = None, tls_cert: str | None = None, tls_key: str | None = None):
        self.persist_path = persist_path
        self.max_body = int(max_body)
        #: MC_METADATA_HTTP_TOKEN (this server only) or the deployment's MOONCAKE_AUTH_TOKEN
        self.auth_token = auth_token or envs.MC_METADATA_HTTP_TOKEN or auth.resolve_token()
        self.ssl_context = server_context(tls_cert, tls_key)
        initial = persist.load(persist_path) if persist_path else {}
        if persist_path and not os.path.exists(persist_path):
            try:  # fail at start, not at the first PUT, when the path is not writable
                persist.save(persist_path, initial)
            except OSError as e:
                raise persist.PersistError(
                    f"persist file {persist_path}: cannot write ({e.strerror or e})") from None
        self.store = KVStore(
            max_keys=max_keys if max_keys is not None else envs.MC_METADATA_MAX_KEYS,
            max_total_bytes=(max_total_bytes if max_total_bytes is not None
                             else envs.MC_METADATA_MAX_TOTAL_BYTES),
            data=initial,
        )
        self._saved_generation = self.store.generation
        self._persist_lock: asyncio.Lock | None = None  # created on the serving loop
        if persist_path:
            log.info("metadata persistence enabled",
                     extra={"persist_path": persist_path, "keys_loaded": len(initial)})
        self.registry = CollectorRegistry()
        self._m_requests = Counter("mooncake_metadata_requests", "HTTP metadata requests",
                                   ["method", "status"], registry=self.registry)
        self._m_latency = Histogram("mooncake_metadata_request_duration_seconds",
                                    "HTTP metadata request latency", ["method"],
                                    registry=self.registry,
                                    buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1, 5))
        self._m_keys = Gauge("mooncake_metadata_keys", "Keys stored", registry=self.registry)
        self._m_bytes = Gauge("mooncake_metadata_bytes", "Bytes of values stored",
                              registry=self.registry)
        self._m_keys.set_function(lambda: len(self.store))
        self._m_bytes.set_function(lambda: self.store.total_bytes)
        self._runner: web.AppRunner | None = None

    # ---- wiring --------------------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        """Serve /metadata, /health and /metrics from ``app``."""
        app.router.add_route("*", "/metadata", self.handle_metadata)
        app.router.add_get("/health", self._handle_health)
        app.router.add_get("/metrics", self._handle_metrics)

    def make_app(self) -> web.Application:
        # client_max_size + 1 so that our own handler, not aiohttp, reports the limit
        app = web.Application(client_max_size=self.max_body + 1)
        self.add_routes(app)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0,
                    sock: socket.socket | None = None) -> int:
        """Listen on the running loop; returns the bound port."""
        if sock is None:
            sock = bind_listener(host, port, what="HTTP metadata server")
        self._runner = web.AppRunner(self.make_app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, sock, ssl_context=self.ssl_context).start()
        bound = sock.getsockname()[1]
        scheme = "https" if self.ssl_context is not None else "http"
        log.info("HTTP metadata server listening",
                 extra={"url": f"{scheme}://{host}:{bound}/metadata" if ":" not in host
                        else f"{scheme}://[{host}]:{bound}/metadata", "keys": len(self.store),
                        "auth": self.auth_token is not None, "tls": self.ssl_context is not None})
        warn = auth.exposure_warning("the HTTP metadata server", host, self.auth_token,
                                     "rewrite or delete every segment descriptor")
        if warn:
            log.warning(warn, extra={"host": host, "port": bound})
        return bound

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- handlers ------------------------------------------------------------------------
    def _token_ok(self, request: web.Request) -> bool:
        return auth.bearer_ok(self.auth_token, request.headers.get("Authorization"))

    async def handle_metadata(self, request: web.Request) -> web.StreamResponse:
        """``/metadata``: GET / PUT / DELETE one key, or list a prefix. Reads only the request's
        method, query, headers (when a token is required) and body."""
        t0 = time.perf_counter()
        method = request.method
        if method == "GET" and "key" not in request.query and "prefix" in request.query:
            method = "LIST"
        try:
            resp = await self._dispatch(request, method)
        except web.HTTPException as e:  # aiohttp's own errors, e.g. a client abort
            resp = _text(e.status, e.text or e.reason)
        label = method if method in ("GET", "PUT", "DELETE", "LIST") else "OTHER"
        self._m_requests.labels(label, str(resp.status)).inc()
        self._m_latency.labels(label).observe(time.perf_counter() - t0)
        return resp

    async def _dispatch(self, request: web.Request, method: str) -> web.StreamResponse:
        if self.auth_token is not None and not self._token_ok(request):
            given = "a wrong token" if request.headers.get("Authorization") else "no token"
            log.warning("refused unauthenticated metadata request",
                        extra={"peer": request.remote, "method": request.method, "presented": given})
            return _text(401, f"unauthorized: {request.method} /metadata refused, {given} presented; send "
                              f"'Authorization: Bearer <token>' (MOONCAKE_AUTH_TOKEN or MC_METADATA_HTTP_TOKEN "
                              f"on the client)")
        if method == "LIST":
            keys = self.store.keys(request.query.get("prefix", ""))
            return web.json_response({"keys": keys})
        key = request.query.get("key", "").strip()
        if not key:
            return _reply(400, "metadata key is required: use /metadata?key=<non-blank key>")
        if method == "GET":
            value = self.store.get(key)
            if value is None:
                return _reply(404, "metadata not found")
            return web.Response(status=200, body=value, content_type="application/json")
        if method == "PUT":
            return await self._put(request, key)
        if method == "DELETE":
            if not self.store.delete(key):
                return _reply(404, "metadata not found")
            err = await self._persist()
            return err or _reply(200, "metadata deleted")
        return _reply(405, f"method {request.method} not allowed (use GET, PUT or DELETE)")

    async def _put(self, request: web.Request, key: str) -> web.StreamResponse:
        too_big = _text(413, f"body for key {key!r} exceeds the limit of "
                             f"{format_size(self.max_body)} ({self.max_body} bytes)")
        try:  # the app's client_max_size stops the read just past max_body
            data = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return too_big
        if len(data) > self.max_body:
            return too_big
        result = self.store.put(key, data)
        if result is PutResult.KEY_BUDGET:
            return _text(507, f"metadata key budget exhausted ({self.store.max_keys} keys)")
        if result is PutResult.BYTE_BUDGET:
            return _text(507, f"metadata size budget exhausted ({self.store.max_total_bytes} bytes)")
        err = await self._persist()
        return err or _reply(200, "metadata updated")

    async def _persist(self) -> web.Response | None:
        """Write a snapshot if the table changed; concurrent changes share one write."""
        if not self.persist_path:
            return None
        if self._persist_lock is None:
            self._persist_lock = asyncio.Lock()
        async with self._persist_lock:
            if self._saved_generation >= self.store.generation:
                return None  # a write that already covers this change finished meanwhile
            generation, snap = self.store.snapshot()
            try:
                await asyncio.to_thread(persist.save, self.persist_path, snap)
            except OSError as e:
                log.error("cannot persist metadata",
                          extra={"persist_path": self.persist_path, "error": str(e)})
                return _text(500, f"stored in memory but cannot persist to "
                                  f"{self.persist_path}: {e.strerror or e}")
            self._saved_generation = generation
        return None

    async def _handle_health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "keys": len(self.store)})

    async def _handle_metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


class HttpMetadataServer:
    """A metadata server on a background thread with its own event loop.

    >>> srv = HttpMetadataServer(port=0).start()
    >>> srv.url    # 'http://127.0.0.1:PORT/metadata'
    >>> srv.stop()
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, persist_path: str | None = None,
                 **service_kwargs):
        self.host = host
        self._requested_port = port
        self.service = MetadataHttpService(persist_path, **service_kwargs)
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("HttpMetadataServer not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.service.ssl_context is not None else "http"
        return f"{scheme}://{host}:{self.port}/metadata"

    def start(self, timeout: float = 10.0) -> "HttpMetadataServer":
        """Bind (raising OSError with a clear message if busy), serve, return once listening."""
        if self._thread is not None:
            raise RuntimeError("HttpMetadataServer already started")
        sock = bind_listener(self.host, self._requested_port, what="HTTP metadata server")
        self.port = sock.getsockname()[1]
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.service.start(self.host, self.port or 0, sock=sock))
            except BaseException as e:  # report to start(), do not die silently
                failure.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self.service.stop())
                loop.close()

        self._thread = threading.Thread(target=run, name=f"mc-http-metadata-{self.port}", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError(f"HTTP metadata server did not start within {timeout}s")
        if failure:
            self._thread = None
            raise failure[0]
        return self

    @property
    def thread(self) -> threading.Thread | None:
        """The serving thread (None before ``start`` and after ``stop``)."""
        return self._thread

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._thread = None

    def __enter__(self) -> "HttpMetadataServer":
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- command line ------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mooncake_http_metadata_server",
        description="Mooncake HTTP metadata server: GET/PUT/DELETE /metadata?key=K stores the "
                    "segment descriptors of Transfer Engines. Point engines at "
                    "http://HOST:PORT/metadata. Also serves /health and /metrics (Prometheus).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="Environment: MOONCAKE_AUTH_TOKEN / MOONCAKE_AUTH_TOKEN_FILE (the deployment's shared "
               "secret) or MC_METADATA_HTTP_TOKEN (this server's own): require 'Authorization: Bearer <token>', "
               "MC_METADATA_MAX_KEYS, MC_METADATA_MAX_TOTAL_BYTES (budgets, 507 beyond), "
               "MC_LOG_JSON=1 (JSON log lines).")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; use 0.0.0.0 to accept other hosts "
                        "(then set MOONCAKE_AUTH_TOKEN). 'HOST:PORT' is accepted too")
    p.add_argument("--port", type=int, default=argparse.SUPPRESS,
                   help="TCP port to listen on; 0 picks a free one (printed at start) "
                        "(default: 8080)")
    p.add_argument("--persist-path", default=argparse.SUPPRESS, metavar="FILE",
                   help="keep the table in FILE (atomic rewrite after each change) and reload "
                        "it at start, so descriptors survive a restart (default: memory only)")
    p.add_argument("--max-body", default=format_size(DEFAULT_MAX_BODY), metavar="SIZE",
                   help="largest accepted PUT body, e.g. '16 MiB'; larger bodies get HTTP 413")
    p.add_argument("--tls-cert", default=None, metavar="PEM",
                   help="serve HTTPS with this certificate (with --tls-key); clients use https://... and "
                        "trust its CA (SSL_CERT_FILE=ca.pem for a private one) (default: plain HTTP)")
    p.add_argument("--tls-key", default=None, metavar="PEM", help="private key of --tls-cert")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                   help="logging verbosity")
    return p


def resolve_host_port(host: str, port: int | None, default_port: int = 8080) -> tuple[str, int]:
    """--host may carry a port ("0.0.0.0:8080", "[::1]:8080"; Mooncake #2785 crashed on
    that); it must then agree with --port when both are given."""
    h, p = host, None
    if host.startswith("[") or host.count(":") == 1:
        h, p = parse_host_port(host, default_port=-1, what="--host")
        p = None if p == -1 else p
    if not h:
        raise ValueError(f"--host {host!r}: missing address")
    if p is not None and port is not None and p != port:
        raise ValueError(f"--host {host!r} names port {p} but --port is {port}; give one")
    final = p if p is not None else (port if port is not None else default_port)
    if not 0 <= final <= 65535:
        raise ValueError(f"--port {final} out of range 0..65535")
    return h, final


async def _serve(service: MetadataHttpService, sock: socket.socket, host: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    port = await service.start(host, sock=sock)
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if service.ssl_context is not None else "http"
    print(f"mooncake_http_metadata_server listening on {scheme}://{shown}:{port}/metadata",
          flush=True)
    await stop.wait()
    log.info("shutting down")
    await service.stop()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    prog = "mooncake_http_metadata_server"
    try:
        max_body = parse_size(args.max_body, name="--max-body")
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    try:
        host, port = resolve_host_port(args.host, getattr(args, "port", None))
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    try:
        service = MetadataHttpService(getattr(args, "persist_path", None), max_body=max_body,
                                      tls_cert=args.tls_cert, tls_key=args.tls_key)
    except (persist.PersistError, ValueError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        print(f"{prog}: --host {host!r}: cannot resolve address ({e.strerror})", file=sys.stderr)
        return 1
    try:
        sock = bind_listener(host, port, what="--host/--port")
    except OSError as e:
        print(f"{prog}: {e.strerror or e}", file=sys.stderr)
        return 1
    try:
        asyncio.run(_serve(service, sock, host))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
