"""Client for an HTTP metadata server (``http://host:port/metadata``).

Wire protocol as Mooncake's ``HTTPStoragePlugin``: ``GET|PUT|DELETE <url>?key=<escaped key>``;
GET answers the stored body (200) or 404; PUT stores the raw body; an optional shared token
from ``MC_METADATA_HTTP_TOKEN`` (else ``MOONCAKE_AUTH_TOKEN``) travels as ``Authorization: Bearer``. Listing keys
(``GET <url>?prefix=P`` -> ``{"keys": [...]}``) is our server's extension.

Why http.client with one keep-alive connection per thread: the engine calls from several
threads, each connection carries its own socket timeout, and no third-party HTTP stack is
needed on the engine's import path.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse

from mooncake_core import auth, envs
from mooncake_core.metadata.base import (MetadataBackend, MetadataError, check_key,
                                         decode_value, encode_value)
from mooncake_core.metadata.conn_string import HttpSpec

_RETRYABLE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
              http.client.BadStatusLine)


class HttpMetadataBackend(MetadataBackend):
    backend_name = "http"

    def __init__(self, spec: HttpSpec, timeout: float = 5.0, token: str | None = None):
        super().__init__(spec.url, timeout)
        self._spec = spec
        self._host, self._port = spec.endpoints[0]
        self._path = urllib.parse.urlsplit(spec.url).path
        self._token = token or envs.MC_METADATA_HTTP_TOKEN or auth.resolve_token()
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._all_lock = threading.Lock()
        self._closed = False

    # ---- connection handling -------------------------------------------------------------
    def _conn(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection and whether it was used before (i.e. may be stale)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        cls = http.client.HTTPSConnection if self._spec.scheme == "https" else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.timeout)
        self._local.conn = conn
        with self._all_lock:
            self._all.append(conn)
        return conn, False

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            with self._all_lock:
                if conn in self._all:
                    self._all.remove(conn)

    def _request(self, method: str, query: dict[str, str], body: bytes | None = None) -> tuple[int, bytes]:
        if self._closed:
            raise self._error("backend is closed")
        target = self._path + "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
        headers = {"Connection": "keep-alive"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        what = f"{method} " + " ".join(f"{k}={v!r}" for k, v in query.items())
        deadline = time.monotonic() + self.timeout
        for attempt in (0, 1):
            conn, reused = self._conn()
            # keep the whole request inside the caller's budget, retry included
            conn.timeout = max(0.05, deadline - time.monotonic())
            if conn.sock is not None:
                conn.sock.settimeout(conn.timeout)
            try:
                conn.request(method, target, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                if resp.getheader("Connection", "").lower() == "close":
                    self._drop()
                return resp.status, data
            except _RETRYABLE as e:
                self._drop()
                # A keep-alive connection the server closed meanwhile: retry once on a fresh one.
                if reused and attempt == 0 and time.monotonic() < deadline:
                    continue
                raise self._error(f"{what} failed: connection lost ({e!r})") from None
            except (socket.timeout, TimeoutError):
                self._drop()
                raise self._error(f"{what} timed out after {self.timeout:g}s") from None
            except OSError as e:
                self._drop()
                raise self._error(f"{what} failed: {e.strerror or e!r} "
                                  f"(is the metadata server running?)") from None
            except http.client.HTTPException as e:
                self._drop()
                raise self._error(f"{what} failed: bad HTTP response ({e!r})") from None
        raise AssertionError("unreachable")

    def _fail(self, method: str, key: str, status: int, data: bytes) -> MetadataError:
        text = data[:200].decode(errors="replace")
        if status == 401:
            return self._error(f"{method} {key!r} unauthorized (401: {text}): set MOONCAKE_AUTH_TOKEN "
                               f"(or MC_METADATA_HTTP_TOKEN) to the server's token")
        return self._error(f"{method} {key!r} answered HTTP {status}: {text}")

    # ---- MetadataBackend -----------------------------------------------------------------
    def get(self, key: str) -> dict | None:
        check_key(key)
        status, data = self._request("GET", {"key": key})
        if status == 404:
            return None
        if status != 200:
            raise self._fail("GET", key, status, data)
        return decode_value(self.backend_name, self.endpoint, key, data)

    def set(self, key: str, value: dict) -> None:
        check_key(key)
        body = encode_value(key, value)
        status, data = self._request("PUT", {"key": key}, body)
        if status != 200:
            raise self._fail("PUT", key, status, data)

    def remove(self, key: str) -> None:
        check_key(key)
        status, data = self._request("DELETE", {"key": key})
        if status not in (200, 404):
            raise self._fail("DELETE", key, status, data)

    def list(self, prefix: str) -> list[str]:
        if not isinstance(prefix, str):
            raise ValueError(f"metadata prefix must be a str, got {prefix!r}")
        status, data = self._request("GET", {"prefix": prefix})
        if status == 400:
            raise self._error(f"listing prefix {prefix!r}: this server does not support key "
                              f"listing (GET ?prefix=), e.g. the original Mooncake server")
        if status != 200:
            raise self._fail("LIST", prefix, status, data)
        try:
            keys = json.loads(data)["keys"]
        except (ValueError, KeyError, TypeError):
            raise self._error(f"listing prefix {prefix!r}: server does not support key listing "
                              f"(expected {{\"keys\": [...]}}, got {data[:80]!r})") from None
        return sorted(str(k) for k in keys)

    def close(self) -> None:
        self._closed = True
        with self._all_lock:
            conns, self._all = self._all, []
        for c in conns:
            c.close()
