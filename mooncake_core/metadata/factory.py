"""``open_metadata``: pick the backend a connection string names (see conn_string.py)."""

from __future__ import annotations

from mooncake_core.metadata.base import MetadataBackend
from mooncake_core.metadata.conn_string import parse_conn_string


def open_metadata(conn_str: str, *, timeout: float = 5.0) -> MetadataBackend | None:
    """Open the metadata service named by ``conn_str``.

    Returns None for ``P2PHANDSHAKE`` (the engine exchanges descriptors itself). Raises
    ValueError on a malformed string (naming it and listing the accepted forms). Connecting
    is lazy: an unreachable server surfaces as MetadataError on the first call, within
    ``timeout`` seconds.
    """
    spec = parse_conn_string(conn_str)
    if spec.kind == "p2p":
        return None
    if spec.kind == "http":
        from mooncake_core.metadata.http_backend import HttpMetadataBackend
        return HttpMetadataBackend(spec, timeout=timeout)
    if spec.kind == "etcd":
        from mooncake_core.metadata.etcd_backend import EtcdMetadataBackend
        return EtcdMetadataBackend(spec, timeout=timeout)
    if spec.kind == "redis":
        from mooncake_core.metadata.redis_backend import RedisMetadataBackend
        return RedisMetadataBackend(spec, timeout=timeout)
    raise AssertionError(f"unhandled metadata kind {spec.kind!r}")
