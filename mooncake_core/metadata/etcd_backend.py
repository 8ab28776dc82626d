"""etcd backend through etcd's v3 JSON gateway (``etcd3gw``).

Keys are stored verbatim (``mooncake/ram/<segment>``), values as compact JSON, as Mooncake's
etcd plugin does, so the two can share one etcd. Several endpoints (``etcd://a:2379;b:2379``)
give failover: a call goes to the endpoint that last worked and moves on to the next when
that one cannot be reached (refused, or silent for its share of the budget), all within
one ``timeout`` budget.

Why thread-local clients: ``etcd3gw`` sits on a ``requests.Session``, which is not
documented thread-safe; one client per (thread, endpoint) avoids sharing it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, TypeVar

import etcd3gw
from etcd3gw import exceptions as etcd_exc

from mooncake_core.metadata.base import MetadataBackend, check_key, decode_value, encode_value
from mooncake_core.metadata.conn_string import EtcdSpec
from mooncake_core.utils.log import get_logger

log = get_logger(__name__)
T = TypeVar("T")

_UNREACHABLE = (etcd_exc.ConnectionFailedError, etcd_exc.ConnectionTimeoutError)


def prefix_range_end(prefix: bytes) -> bytes:
    """etcd's range_end for "every key starting with prefix" (as clientv3.GetPrefixRangeEnd):
    drop trailing 0xff bytes and increment the last remaining byte; b"\\0" means no end."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return b"\0"
    p[-1] += 1
    return bytes(p)


def _k(key: str) -> bytes:
    # etcd3gw encodes str as latin-1; Mooncake (Go/C++ clients) stores UTF-8 bytes.
    return key.encode("utf-8")


class EtcdMetadataBackend(MetadataBackend):
    backend_name = "etcd"

    def __init__(self, spec: EtcdSpec, timeout: float = 5.0):
        super().__init__(spec.endpoint_text, timeout)
        self._endpoints = list(spec.endpoints)
        self._preferred = 0          # index of the endpoint that answered last
        # etcd >= 3.4 serves the gateway at /v3/; fixing it saves a /version round trip per
        # client (ETCD3GW_API_PATH overrides, e.g. /v3beta/ for etcd 3.3)
        self._api_path: str = os.environ.get("ETCD3GW_API_PATH") or "/v3/"
        self._lock = threading.Lock()
        self._local = threading.local()
        self._sessions: list[Any] = []
        self._closed = False

    def _client(self, idx: int, budget: float) -> etcd3gw.Etcd3Client:
        clients = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        c = clients.get(idx)
        if c is None:
            host, port = self._endpoints[idx]
            c = etcd3gw.client(host=host, port=port, api_path=self._api_path)
            clients[idx] = c
            with self._lock:
                self._sessions.append(c.session)
        # requests applies a float timeout to connect and to each read separately; halves
        # keep one request inside the budget
        c.timeout = (budget / 2, budget / 2)
        return c

    def _call(self, what: str, fn: Callable[[etcd3gw.Etcd3Client], T]) -> T:
        """Run ``fn`` against the preferred endpoint, failing over to the others in turn."""
        if self._closed:
            raise self._error("backend is closed")
        deadline = time.monotonic() + self.timeout
        n = len(self._endpoints)
        start = self._preferred
        errors: list[str] = []
        for i in range(n):
            idx = (start + i) % n
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            # a hung endpoint must not eat the whole budget: leave a fair share for the rest
            budget = remaining / (n - i)
            host, port = self._endpoints[idx]
            client = self._client(idx, budget)
            try:
                result = fn(client)
            except _UNREACHABLE as e:
                errors.append(f"{host}:{port}: {type(e).__name__}")
                if i + 1 < n:
                    log.warning("etcd endpoint unreachable, trying next",
                                extra={"endpoint": f"{host}:{port}", "op": what})
                continue
            except etcd_exc.Etcd3Exception as e:
                raise self._error(f"{what} failed at {host}:{port}: {type(e).__name__} "
                                  f"{e.detail_text or ''}".rstrip()) from None
            if idx != self._preferred:
                self._preferred = idx
                log.info("etcd failover: using endpoint", extra={"endpoint": f"{host}:{port}"})
            return result
        tried = "; ".join(errors) or "no time left"
        raise self._error(f"{what} failed: no endpoint reachable within {self.timeout:g}s ({tried})")

    def get(self, key: str) -> dict | None:
        check_key(key)
        values = self._call(f"get {key!r}", lambda c: c.get(_k(key)))
        if not values:
            return None
        return decode_value(self.backend_name, self.endpoint, key, values[0])

    def set(self, key: str, value: dict) -> None:
        check_key(key)
        body = encode_value(key, value)
        self._call(f"put {key!r}", lambda c: c.put(_k(key), body))

    def remove(self, key: str) -> None:
        check_key(key)
        self._call(f"delete {key!r}", lambda c: c.delete(_k(key)))

    def list(self, prefix: str) -> list[str]:
        if not isinstance(prefix, str):
            raise ValueError(f"metadata prefix must be a str, got {prefix!r}")
        if prefix:
            start, end = _k(prefix), prefix_range_end(_k(prefix))
        else:  # the whole keyspace
            start, end = b"\0", b"\0"
        items = self._call(f"list prefix {prefix!r}",
                           # etcd3gw's stub lacks keys_only (the gateway takes it)
                           lambda c: c.get(start, metadata=True, range_end=end,  # type: ignore[call-overload]
                                           keys_only=True))
        keys = []
        for _value, meta in items:
            k = meta["key"]
            keys.append(k.decode("utf-8", errors="replace") if isinstance(k, bytes) else str(k))
        return sorted(keys)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for s in sessions:
            s.close()
