"""Connection-string parsing (pure logic, no sockets)."""

from __future__ import annotations

import pytest

from mooncake_core.metadata import ACCEPTED_FORMS, open_metadata, parse_conn_string

NOENV: dict[str, str] = {}


def test_p2phandshake() -> None:
    assert parse_conn_string("P2PHANDSHAKE", NOENV).kind == "p2p"
    assert open_metadata("P2PHANDSHAKE") is None


@pytest.mark.parametrize("conn,url", [
    ("http://127.0.0.1:8080/metadata", "http://127.0.0.1:8080/metadata"),
    ("http://meta.example:9000/metadata", "http://meta.example:9000/metadata"),
    ("https://meta.example:443/custom/path", "https://meta.example:443/custom/path"),
    ("http://10.0.0.1:8080", "http://10.0.0.1:8080/metadata"),
    ("http://[::1]:8080/metadata", "http://[::1]:8080/metadata"),
])
def test_http(conn: str, url: str) -> None:
    spec = parse_conn_string(conn, NOENV)
    assert spec.kind == "http" and spec.url == url


@pytest.mark.parametrize("conn,endpoints", [
    ("etcd://127.0.0.1:2379", (("127.0.0.1", 2379),)),
    ("etcd://10.0.0.1:2379;10.0.0.2:2380", (("10.0.0.1", 2379), ("10.0.0.2", 2380))),
    ("etcd://a:1,b:2", (("a", 1), ("b", 2))),
    ("etcd://a:1;etcd://b:2;", (("a", 1), ("b", 2))),
    # Mooncake: a string without "://" is an etcd endpoint
    ("127.0.0.1:2379", (("127.0.0.1", 2379),)),
    ("h1:2379;h2:2379", (("h1", 2379), ("h2", 2379))),
])
def test_etcd(conn: str, endpoints: tuple) -> None:
    spec = parse_conn_string(conn, NOENV)
    assert spec.kind == "etcd" and spec.endpoints == endpoints


def test_redis_forms() -> None:
    s = parse_conn_string("redis://127.0.0.1:6379", NOENV)
    assert (s.kind, s.endpoints, s.db, s.password, s.username) == ("redis", (("127.0.0.1", 6379),), 0, None, None)
    s = parse_conn_string("redis://:s%40cret@h:7000/3", NOENV)
    assert (s.endpoints, s.db, s.password, s.username) == ((("h", 7000),), 3, "s@cret", None)
    s = parse_conn_string("redis://alice:pw@h:7000", NOENV)
    assert (s.username, s.password) == ("alice", "pw")
    assert "pw" not in s.endpoint_text


def test_redis_env_fallbacks_as_mooncake() -> None:
    env = {"MC_REDIS_PASSWORD": "envpw", "MC_REDIS_USERNAME": "bob", "MC_REDIS_DB_INDEX": "5"}
    s = parse_conn_string("redis://h:6379", env)
    assert (s.username, s.password, s.db) == ("bob", "envpw", 5)
    # the URL wins over the environment
    s = parse_conn_string("redis://:urlpw@h:6379/2", env)
    assert (s.password, s.db) == ("urlpw", 2)
    with pytest.raises(ValueError, match="MC_REDIS_DB_INDEX"):
        parse_conn_string("redis://h:6379", {"MC_REDIS_DB_INDEX": "x"})


@pytest.mark.parametrize("conn,why", [
    ("", "empty"),
    ("   ", "empty"),
    ("zookeeper://h:2181", "unknown scheme 'zookeeper'"),
    ("http://:8080/metadata", "missing host"),
    ("http://127.0.0.1/metadata", "missing port"),
    ("http://127.0.0.1:abc/metadata", "not a number"),
    ("http://127.0.0.1:99999/metadata", "not a number"),
    ("http://127.0.0.1:8080/metadata?key=x", "query"),
    ("etcd://", "no endpoint"),
    ("etcd://127.0.0.1", "missing port"),
    ("etcd://127.0.0.1:port", "not a number"),
    ("etcd://:2379", "missing host"),
    ("etcd://a:1;http://b:2", "expected etcd"),
    ("127.0.0.1", "missing port"),
    ("redis://", "missing host"),
    ("redis://h", "missing port"),
    ("redis://h:x", "not a number"),
    ("redis://h:6379/db1", "database 'db1'"),
    ("redis://h:6379/999", "out of range"),
    ("http://h:0/metadata", "port 0"),
])
def test_bad_strings_name_the_string_and_list_forms(conn: str, why: str) -> None:
    with pytest.raises(ValueError) as ei:
        open_metadata(conn)
    msg = str(ei.value)
    assert repr(conn) in msg, msg
    assert why in msg, msg
    assert ACCEPTED_FORMS in msg


def test_non_string_rejected() -> None:
    with pytest.raises(ValueError, match="must be a str"):
        open_metadata(None)  # type: ignore[arg-type]


def test_bad_timeout_rejected() -> None:
    with pytest.raises(ValueError, match="timeout"):
        open_metadata("http://127.0.0.1:8080/metadata", timeout=0)
