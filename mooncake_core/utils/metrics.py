"""Expose a process's Prometheus metrics over HTTP (``/metrics``) with one call.

Every service calls ``start_metrics_server(port)`` once (``--metrics_port`` flags); 0 picks a
free port and the bound port is returned so it can be logged. A busy port raises OSError
naming the port instead of prometheus_client's bare EADDRINUSE.

Naming convention: prefix every metric with ``mooncake_<component>_`` (e.g.
``mooncake_te_bytes_total``, ``mooncake_store_put_seconds``, ``mooncake_metadata_keys``),
use base units (seconds, bytes), ``_total`` for counters (prometheus_client adds it), and
keep label sets small (method, status, transport, peer) so a dashboard stays readable.

``routes`` adds other GET paths to the same port (the master's ``/dashboard`` page and its
``/dashboard/data.json``): a route gets the WSGI environ and returns (status, headers, body);
an exception in it becomes a 500 naming it, never a dead server thread.
"""

from __future__ import annotations

import socket
import threading
from http import HTTPStatus
from typing import Any, Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from socketserver import ThreadingMixIn

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app

_servers: list[WSGIServer] = []

#: a route: WSGI environ -> (HTTP status, headers, body)
Route = Callable[[dict[str, Any]], tuple[int, dict[str, str], bytes]]


def _with_routes(metrics_app: Callable[..., Iterable[bytes]],
                 routes: dict[str, Route]) -> Callable[..., Iterable[bytes]]:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "") or "/"
        route = routes.get(path.rstrip("/") or "/")
        if route is None:
            return metrics_app(environ, start_response)
        try:
            status, headers, body = route(environ)
        except Exception as e:  # a bug in a page must not take /metrics down with it
            status, headers = 500, {"Content-Type": "text/plain; charset=utf-8"}
            body = f"{path}: internal error: {type(e).__name__}: {e}\n".encode()
        hdrs = list(headers.items()) + [("Content-Length", str(len(body)))]
        start_response(f"{status} {HTTPStatus(status).phrase}", hdrs)
        return [body]
    return app


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # scrapes are not news
        pass


def start_metrics_server(port: int, host: str = "127.0.0.1",
                         registry: CollectorRegistry = REGISTRY, routes: dict[str, Route] | None = None) -> int:
    """Serve ``registry`` at http://host:port/metrics (and ``routes``) on a daemon thread;
    return the port."""
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"metrics port must be an int in 0..65535, got {port!r}")
    server_cls: type[_ThreadingWSGIServer] = _ThreadingWSGIServer
    if ":" in host:  # IPv6 literal
        server_cls = type("_ThreadingWSGIServer6", (_ThreadingWSGIServer,),
                          {"address_family": socket.AF_INET6})
    try:
        httpd = make_server(host, port, _with_routes(make_wsgi_app(registry), routes or {}), server_cls,
                            handler_class=_QuietHandler)
    except OSError as e:
        raise OSError(e.errno, f"metrics server: cannot bind {host}:{port}: {e.strerror} "
                               f"(is another process using it? choose another port, or 0 "
                               f"for any)") from None
    threading.Thread(target=httpd.serve_forever, name=f"mc-metrics-{port}", daemon=True).start()
    _servers.append(httpd)
    return httpd.server_address[1]


def stop_metrics_servers() -> None:
    """Shut down every server started by this module (tests, clean exits)."""
    while _servers:
        s = _servers.pop()
        s.shutdown()
        s.server_close()
