"""Redis backend (redis-py).

Keys are stored verbatim and values as compact JSON strings (``GET``/``SET``/``DEL``), as
Mooncake's Redis plugin does. Listing uses ``SCAN MATCH`` with the prefix's glob characters
escaped, never ``KEYS`` (which blocks the server).

Why redis-py's own pool: ``redis.Redis`` is thread-safe (each command borrows a pooled
connection), and its socket timeouts bound every call. Its default retry policy would
stretch a dead server's failure past our budget, so retries are limited to one quick
reconnect that still fits the budget.
"""

from __future__ import annotations

import re
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from mooncake_core.metadata.base import MetadataBackend, check_key, decode_value, encode_value
from mooncake_core.metadata.conn_string import RedisSpec

_GLOB = re.compile(r"([*?\[\]\\])")


def escape_glob(prefix: str) -> str:
    """Escape Redis glob metacharacters so a prefix matches literally."""
    return _GLOB.sub(r"\\\1", prefix)


class RedisMetadataBackend(MetadataBackend):
    backend_name = "redis"

    def __init__(self, spec: RedisSpec, timeout: float = 5.0):
        host, port = spec.endpoints[0]
        super().__init__(f"{host}:{port}/{spec.db}", timeout)
        self._client = redis.Redis(
            host=host, port=port, db=spec.db, username=spec.username, password=spec.password,
            socket_timeout=timeout, socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0, decode_responses=False,
        )
        self._closed = False

    def _run(self, what: str, fn):
        if self._closed:
            raise self._error("backend is closed")
        t0 = time.monotonic()
        try:
            return fn()
        except redis.AuthenticationError as e:
            raise self._error(f"{what}: authentication failed ({e}); check the password in the "
                              f"URL or MC_REDIS_PASSWORD") from None
        except redis.TimeoutError:
            raise self._error(f"{what} timed out after {time.monotonic() - t0:.1f}s "
                              f"(limit {self.timeout:g}s)") from None
        except redis.ConnectionError as e:
            raise self._error(f"{what} failed: cannot connect ({e})") from None
        except redis.ResponseError as e:
            raise self._error(f"{what} rejected by server: {e}") from None
        except redis.RedisError as e:
            raise self._error(f"{what} failed: {type(e).__name__}: {e}") from None

    def get(self, key: str) -> dict | None:
        check_key(key)
        raw = self._run(f"GET {key!r}", lambda: self._client.get(key))
        if raw is None:
            return None
        return decode_value(self.backend_name, self.endpoint, key, raw)

    def set(self, key: str, value: dict) -> None:
        check_key(key)
        body = encode_value(key, value)
        self._run(f"SET {key!r}", lambda: self._client.set(key, body))

    def remove(self, key: str) -> None:
        check_key(key)
        self._run(f"DEL {key!r}", lambda: self._client.delete(key))

    def list(self, prefix: str) -> list[str]:
        if not isinstance(prefix, str):
            raise ValueError(f"metadata prefix must be a str, got {prefix!r}")
        pattern = escape_glob(prefix) + "*"

        def scan() -> list[str]:
            return sorted({k.decode(errors="replace")
                           for k in self._client.scan_iter(match=pattern, count=1000)})
        return self._run(f"SCAN {pattern!r}", scan)

    def close(self) -> None:
        self._closed = True
        self._client.close()
