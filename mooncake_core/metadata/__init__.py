"""Metadata service clients and the HTTP metadata server.

``open_metadata(conn_str, timeout=5.0)`` returns a :class:`MetadataBackend` for
``http://host:port/metadata``, ``etcd://h:2379[;h2:2379]`` (or bare ``h:2379``),
``redis://[:pw@]h:6379[/db]``, a plugin's ``scheme://...`` (docs/plugins.md), or None for
``P2PHANDSHAKE``. The server side is
:class:`HttpMetadataServer` (``mooncake_http_metadata_server`` on the command line).
"""

from __future__ import annotations

from typing import Any

from mooncake_core.metadata.base import MetadataBackend, MetadataError
from mooncake_core.metadata.conn_string import (ACCEPTED_FORMS, P2PHANDSHAKE, EtcdSpec, HttpSpec, MetadataSpec,
                                                RedisSpec)
from mooncake_core.metadata.factory import open_metadata, parse_conn_string

__all__ = [
    "open_metadata", "MetadataBackend", "MetadataError", "parse_conn_string", "MetadataSpec", "HttpSpec",
    "EtcdSpec", "RedisSpec",
    "P2PHANDSHAKE", "ACCEPTED_FORMS", "HttpMetadataServer", "MetadataHttpService",
]


def __getattr__(name: str) -> Any:
    # The server pulls in aiohttp; engines that only read metadata need not import it.
    if name in ("HttpMetadataServer", "MetadataHttpService"):
        from mooncake_core.metadata import http_server
        return getattr(http_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
