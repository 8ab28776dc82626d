"""The metadata backend contract shared by the Transfer Engine, the store and the tools.

Mooncake keeps *segment descriptors* (``mooncake/ram/<segment>``) and RPC endpoints
(``mooncake/rpc_meta/<segment>``) in a small key/value service. Every backend (our HTTP
server, etcd, Redis) stores the key verbatim and the value as compact JSON text, so a
descriptor written by one tool can be read by any other pointed at the same service.

Why an ABC with only five methods: the engine needs nothing more, and a small surface keeps
every backend easy to test against a real server. Values are JSON *objects* (dicts) because
that is what Mooncake stores; anything else is refused at ``set`` with a message naming the
key, and a stored value that is not a JSON object is reported at ``get`` instead of being
returned half-parsed.
"""

from __future__ import annotations

import abc
import json
from typing import Any


class MetadataError(RuntimeError):
    """A metadata service could not be reached or answered with an error.

    The message always names the backend and the endpoint, so a log line alone says which
    server to look at.
    """

    def __init__(self, backend: str, endpoint: str, message: str):
        super().__init__(f"{backend} metadata service at {endpoint}: {message}")
        self.backend = backend
        self.endpoint = endpoint


def check_key(key: Any) -> str:
    """Validate a metadata key: a non-blank string (keys are stored verbatim)."""
    if not isinstance(key, str) or not key.strip():
        raise ValueError(f"metadata key must be a non-blank string, got {key!r}")
    return key


def encode_value(key: str, value: Any) -> bytes:
    """JSON-encode ``value`` (must be a dict) compactly, naming ``key`` on bad input."""
    if not isinstance(value, dict):
        raise TypeError(f"metadata value for key {key!r} must be a dict (JSON object), "
                        f"got {type(value).__name__}")
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise TypeError(f"metadata value for key {key!r} is not JSON-serialisable: {e}") from None


def decode_value(backend: str, endpoint: str, key: str, raw: bytes | str) -> dict:
    """Parse a stored value; a non-JSON or non-object value is a clear MetadataError."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        preview = raw[:80] if isinstance(raw, (bytes, str)) else raw
        raise MetadataError(backend, endpoint,
                            f"value under key {key!r} is not valid JSON ({e}): {preview!r}") from None
    if not isinstance(value, dict):
        raise MetadataError(backend, endpoint,
                            f"value under key {key!r} is a JSON {type(value).__name__}, "
                            f"expected a JSON object")
    return value


class MetadataBackend(abc.ABC):
    """Key/value access to one metadata service. Implementations are thread-safe and every
    call is bounded by the ``timeout`` given at construction (seconds).

    Connection failures and server errors raise :class:`MetadataError`; a missing key is not
    an error (``get`` returns ``None``, ``remove`` does nothing).
    """

    #: short backend name used in error messages ("http", "etcd", "redis")
    backend_name: str = "?"

    def __init__(self, endpoint: str, timeout: float):
        if not timeout or timeout <= 0:
            raise ValueError(f"metadata timeout must be > 0 seconds, got {timeout!r}")
        self.endpoint = endpoint
        self.timeout = float(timeout)

    def _error(self, message: str) -> MetadataError:
        return MetadataError(self.backend_name, self.endpoint, message)

    @abc.abstractmethod
    def get(self, key: str) -> dict | None:
        """The JSON object stored under ``key``, or None when the key does not exist."""

    @abc.abstractmethod
    def set(self, key: str, value: dict) -> None:
        """Store ``value`` (a JSON object) under ``key``, replacing any previous value."""

    @abc.abstractmethod
    def remove(self, key: str) -> None:
        """Delete ``key``; deleting a missing key is not an error."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """All keys starting with ``prefix`` (sorted); ``""`` lists every key."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections. Further calls are not supported."""

    def __enter__(self) -> "MetadataBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.backend_name} {self.endpoint} timeout={self.timeout}s>"
