"""``open_metadata``: open the backend a connection string's scheme names (see conn_string.py).

Backends are plugins (``mooncake_metadata_backends``, docs/plugins.md): the scheme table
comes from the plugin manager, so a third-party ``scheme://`` works with no edit here.
"""

from __future__ import annotations

from collections.abc import Mapping

from mooncake_core.metadata import conn_string
from mooncake_core.metadata.base import MetadataBackend
from mooncake_core.metadata.conn_string import P2PHANDSHAKE, MetadataSpec


def parse_conn_string(conn: str, env: Mapping[str, str] | None = None,
                      backends: Mapping[str, conn_string.SchemeParser] | None = None) -> MetadataSpec:
    """Parse ``conn`` against the registered metadata backends (built-ins and plugins), or
    ``backends`` when given; ValueError names the string and lists the accepted forms."""
    if backends is None:
        from mooncake_core.plugins import metadata_backends  # late: the plugin manager loads entry points
        backends = metadata_backends()
    return conn_string.parse_conn_string(conn, env, backends)


def open_metadata(conn_str: str, *, timeout: float = 5.0) -> MetadataBackend | None:
    """Open the metadata service named by ``conn_str``.

    Returns None for ``P2PHANDSHAKE`` (the engine exchanges descriptors itself). Raises
    ValueError on a malformed string (naming it and listing the accepted forms). Connecting
    is lazy: an unreachable server surfaces as MetadataError on the first call, within
    ``timeout`` seconds.
    """
    from mooncake_core.plugins import metadata_backends

    backends = metadata_backends()
    spec = parse_conn_string(conn_str, backends=backends)
    if spec.kind == "p2p":
        return None
    scheme = conn_str.strip().partition("://")[0].lower() if "://" in conn_str else "etcd"
    return backends[scheme].open(spec, timeout)


__all__ = ["P2PHANDSHAKE", "open_metadata", "parse_conn_string"]
