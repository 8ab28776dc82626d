"""Parse a Mooncake metadata connection string (pure logic, no I/O).

The text before ``://`` names the backend, as the original Mooncake selects its metadata
plugin (``MetadataStoragePlugin::Create``), and a string without ``://`` is an etcd endpoint.
Backends are plugins (``mooncake_metadata_backends`` hook): each parses its own scheme into
its own spec type. The built-in forms:

- ``P2PHANDSHAKE``                      no server; the engine exchanges descriptors itself
- ``http://host:port/metadata``         our HTTP metadata server (``https://`` too)
- ``etcd://host:2379[;host2:2379...]``  etcd; several endpoints (``;`` or ``,``) fail over
- ``host:2379[;host2:2379]``            same as ``etcd://...`` (Mooncake's default plugin)
- ``redis://[[user]:password@]host:6379[/db]``  Redis; credentials may also come from
  ``MC_REDIS_USERNAME`` / ``MC_REDIS_PASSWORD`` / ``MC_REDIS_DB_INDEX`` as in Mooncake
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from typing import Callable, Mapping, Protocol

from mooncake_core import envs
from mooncake_core.utils.net import parse_host_port


class SchemeParser(Protocol):
    """What this module needs of a metadata backend plugin: its accepted forms and its parser
    (the plugin manager's ``MetadataBackendPlugin`` is one; this module imports no plugin code)."""

    @property
    def forms(self) -> str: ...

    @property
    def parse(self) -> Callable[[str, Mapping[str, str]], MetadataSpec]: ...

P2PHANDSHAKE = "P2PHANDSHAKE"

ACCEPTED_FORMS = (
    "P2PHANDSHAKE, http://host:port/metadata, https://host:port/metadata, "
    "etcd://host:port[;host2:port2], host:port[;host2:port2] (etcd), "
    "redis://[:password@]host:port[/db]"
)


@dataclasses.dataclass(frozen=True)
class MetadataSpec:
    """What a connection string selects: ``kind`` names the backend ("p2p", "http", "etcd",
    "redis", or a plugin's). Each backend has its own subclass with its own fields."""

    kind: str
    endpoints: tuple[tuple[str, int], ...] = ()

    @property
    def endpoint_text(self) -> str:
        """Human-readable endpoint list for messages (never contains a password)."""
        return ";".join(f"{h}:{p}" for h, p in self.endpoints)


@dataclasses.dataclass(frozen=True)
class HttpSpec(MetadataSpec):
    url: str = ""              # the full base URL requests go to (?key= appended)
    scheme: str = "http"       # http or https

    @property
    def endpoint_text(self) -> str:
        return self.url


@dataclasses.dataclass(frozen=True)
class EtcdSpec(MetadataSpec):
    pass


@dataclasses.dataclass(frozen=True)
class RedisSpec(MetadataSpec):
    db: int = 0
    username: str | None = None
    password: str | None = None


def _bad(conn: str, why: str, backends: Mapping[str, SchemeParser] | None = None) -> ValueError:
    return ValueError(f"invalid metadata connection string {conn!r}: {why}. "
                      f"Accepted forms: {accepted_forms(backends or {})}")


def accepted_forms(backends: Mapping[str, SchemeParser]) -> str:
    """The built-in forms (:data:`ACCEPTED_FORMS`) plus those of metadata backend plugins."""
    extra = []
    for b in dict.fromkeys(backends.values()):  # one entry per plugin, registration order
        if b.forms and b.forms not in ACCEPTED_FORMS:
            extra.append(b.forms)
    return ", ".join([ACCEPTED_FORMS, *extra])


def _host_port(conn: str, text: str) -> tuple[str, int]:
    try:
        host, port = parse_host_port(text, what="metadata endpoint")
    except ValueError as e:
        raise _bad(conn, str(e)) from None
    if not host:
        raise _bad(conn, f"missing host in {text!r}")
    if port == 0:
        raise _bad(conn, f"port 0 in {text!r} is not a server port")
    return host, port


def _endpoint_list(conn: str, text: str) -> tuple[tuple[str, int], ...]:
    parts = [p.strip() for p in text.replace(",", ";").split(";")]
    parts = [p for p in parts if p]
    if not parts:
        raise _bad(conn, "no endpoint given")
    out = []
    for p in parts:
        if "://" in p:  # "etcd://a:1;etcd://b:2" -- tolerate a repeated scheme
            scheme, _, p = p.partition("://")
            if scheme != "etcd":
                raise _bad(conn, f"endpoint {p!r} has scheme {scheme!r}, expected etcd")
        out.append(_host_port(conn, p.rstrip("/")))
    return tuple(out)


def parse_conn_string(conn: str, env: Mapping[str, str] | None, backends: Mapping[str, SchemeParser]) -> MetadataSpec:
    """Turn a connection string into the spec of the backend its scheme names; ValueError
    on bad input.

    ``env`` supplies the ``MC_REDIS_*`` fallbacks (defaults to ``os.environ``) and
    ``backends`` the scheme table; both are parameters so the logic stays testable without
    touching the process (``mooncake_core.metadata.parse_conn_string`` passes the registered
    plugins).
    """
    if env is None:
        import os
        env = os.environ
    if not isinstance(conn, str):
        raise ValueError(f"metadata connection string must be a str, got {type(conn).__name__}. "
                         f"Accepted forms: {accepted_forms(backends)}")
    text = conn.strip()
    if not text:
        raise _bad(conn, "empty", backends)
    if text.upper() == P2PHANDSHAKE:
        return MetadataSpec(kind="p2p")
    if "://" not in text:  # Mooncake's default plugin: a bare etcd endpoint list
        return parse_etcd(conn)
    scheme = text.partition("://")[0].lower()
    plugin = backends.get(scheme)
    if plugin is None:
        raise _bad(conn, f"unknown scheme {scheme!r} (registered: {', '.join(sorted(backends))})", backends)
    return plugin.parse(conn, env)


def parse_etcd(conn: str) -> EtcdSpec:
    """``etcd://h:p[;h2:p2]`` or a bare ``h:p[;h2:p2]``."""
    text = conn.strip()
    rest = text.partition("://")[2] if "://" in text else text
    return EtcdSpec(kind="etcd", endpoints=_endpoint_list(conn, rest))


def _url_host_port(conn: str, u: urllib.parse.SplitResult, example: str) -> tuple[str, int]:
    """Host and server port of a parsed URL; one place for the errors http:// and redis:// share."""
    if not u.hostname:
        raise _bad(conn, "missing host")
    try:
        port = u.port
    except ValueError:
        # rpartition: never echo a redis password (user:pass@host) in the message
        raise _bad(conn, f"port in {u.netloc.rpartition('@')[2]!r} is not a number in 1..65535") from None
    if port is None:
        raise _bad(conn, f"missing port (e.g. {example})")
    if port == 0:
        raise _bad(conn, "port 0 is not a server port")
    return u.hostname, port


def parse_http(conn: str) -> HttpSpec:
    """``http(s)://host:port[/path]`` (a bare host:port is served at /metadata)."""
    text = conn.strip()
    scheme = text.partition("://")[0].lower()
    u = urllib.parse.urlsplit(text)
    host, port = _url_host_port(conn, u, "http://127.0.0.1:8080/metadata")
    if u.query or u.fragment:
        raise _bad(conn, "the URL must not carry a query or fragment (?key= is added per request)")
    # Mooncake uses the URL verbatim; a bare http://host:port is served at /metadata by our
    # server, so fill that in rather than send requests to "/".
    path = u.path if u.path not in ("", "/") else "/metadata"
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return HttpSpec(kind="http", scheme=scheme, endpoints=((host, port),), url=f"{scheme}://{netloc}{path}")


def parse_redis(conn: str, env: Mapping[str, str]) -> RedisSpec:
    """``redis://[[user]:password@]host:port[/db]``, ``MC_REDIS_*`` from ``env`` as fallbacks."""
    u = urllib.parse.urlsplit(conn.strip())
    host, port = _url_host_port(conn, u, "redis://127.0.0.1:6379")
    db_text = u.path.strip("/")
    if db_text:
        if not db_text.isdigit():
            raise _bad(conn, f"database {db_text!r} is not a number")
        db = int(db_text)
    else:
        db = envs.get("MC_REDIS_DB_INDEX", env)
    if db > 255:
        raise _bad(conn, f"database index {db} out of range 0..255")
    username = urllib.parse.unquote(u.username) if u.username else None
    password = urllib.parse.unquote(u.password) if u.password else None
    if password is None:
        password = envs.get("MC_REDIS_PASSWORD", env)
        if username is None:
            username = envs.get("MC_REDIS_USERNAME", env)
    return RedisSpec(kind="redis", endpoints=((host, port),), db=db, username=username, password=password)
