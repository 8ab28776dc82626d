"""Failure paths: dead or silent servers give MetadataError within the timeout, never a hang;
etcd fails over between endpoints."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from typing import Iterator

import pytest

from mooncake_core.metadata import HttpMetadataServer, MetadataError, open_metadata
from mooncake_core.utils.net import free_port, wait_for_port
from mooncake_core.utils.proc import stop_process

pytestmark = pytest.mark.integration

TIMEOUT = 1.0
SLACK = 3.0  # generous: CI is a busy 2-core box


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections (kernel backlog) but never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield s.getsockname()[1]
    s.close()


def conn_for(kind: str, port: int) -> str:
    return {"http": f"http://127.0.0.1:{port}/metadata", "etcd": f"etcd://127.0.0.1:{port}",
            "redis": f"redis://127.0.0.1:{port}"}[kind]


def assert_fails_fast(conn: str, op: str) -> MetadataError:
    b = open_metadata(conn, timeout=TIMEOUT)
    t0 = time.monotonic()
    with pytest.raises(MetadataError) as ei:
        if op == "get":
            b.get("mooncake/ram/x")
        elif op == "set":
            b.set("mooncake/ram/x", {"a": 1})
        elif op == "remove":
            b.remove("mooncake/ram/x")
        else:
            b.list("mooncake/")
    elapsed = time.monotonic() - t0
    assert elapsed < TIMEOUT + SLACK, f"{conn} {op} took {elapsed:.1f}s"
    b.close()
    return ei.value


@pytest.mark.parametrize("kind", ["http", "etcd", "redis"])
@pytest.mark.parametrize("op", ["get", "set", "remove", "list"])
def test_nothing_listening(kind: str, op: str) -> None:
    port = free_port()
    err = assert_fails_fast(conn_for(kind, port), op)
    msg = str(err)
    assert kind in msg and f"127.0.0.1:{port}" in msg, msg


@pytest.mark.parametrize("kind", ["http", "etcd", "redis"])
def test_silent_server_times_out(kind: str, silent_port: int) -> None:
    err = assert_fails_fast(conn_for(kind, silent_port), "get")
    assert f"127.0.0.1:{silent_port}" in str(err)


def test_http_server_stopped_midlife() -> None:
    srv = HttpMetadataServer(port=0).start()
    b = open_metadata(srv.url, timeout=TIMEOUT)
    b.set("mooncake/ram/a", {"a": 1})  # keep-alive connection now open
    srv.stop()
    t0 = time.monotonic()
    with pytest.raises(MetadataError, match="http metadata service at http://127.0.0.1"):
        b.get("mooncake/ram/a")
    assert time.monotonic() - t0 < TIMEOUT + SLACK
    # and recovers once a server is back on the same port (descriptors re-published)
    srv2 = HttpMetadataServer(port=srv.port).start()
    try:
        assert b.get("mooncake/ram/a") is None
        b.set("mooncake/ram/a", {"a": 2})
        assert b.get("mooncake/ram/a") == {"a": 2}
    finally:
        srv2.stop()


def test_http_keepalive_reconnects_after_server_restart(tmp_path) -> None:
    path = str(tmp_path / "m.json")
    srv = HttpMetadataServer(port=0, persist_path=path).start()
    b = open_metadata(srv.url, timeout=TIMEOUT)
    b.set("k", {"v": 1})
    srv.stop()
    srv = HttpMetadataServer(port=srv.port, persist_path=path).start()
    try:
        assert b.get("k") == {"v": 1}  # stale keep-alive socket is replaced transparently
    finally:
        srv.stop()


def test_etcd_first_endpoint_dead(etcd_endpoint: str) -> None:
    dead = f"127.0.0.1:{free_port()}"
    b = open_metadata(f"etcd://{dead};{etcd_endpoint}", timeout=5.0)
    key = f"mooncake/ram/failover-{uuid.uuid4().hex}"
    b.set(key, {"v": 1})
    assert b.get(key) == {"v": 1}
    assert key in b.list("mooncake/ram/failover-")
    b.remove(key)
    assert b.get(key) is None
    b.close()


def test_etcd_first_endpoint_silent(etcd_endpoint: str, silent_port: int) -> None:
    """A hung (not refusing) first endpoint gets only its share of the budget."""
    b = open_metadata(f"etcd://127.0.0.1:{silent_port};{etcd_endpoint}", timeout=2.0)
    key = f"mooncake/ram/silent-{uuid.uuid4().hex}"
    t0 = time.monotonic()
    b.set(key, {"v": 2})
    assert time.monotonic() - t0 < 2.0 + SLACK
    t0 = time.monotonic()
    assert b.get(key) == {"v": 2}  # sticks to the endpoint that answered
    assert time.monotonic() - t0 < 1.0
    b.remove(key)
    b.close()


def test_etcd_second_endpoint_dead(etcd_endpoint: str) -> None:
    b = open_metadata(f"{etcd_endpoint};127.0.0.1:{free_port()}", timeout=5.0)  # bare form
    key = f"mooncake/ram/second-{uuid.uuid4().hex}"
    b.set(key, {"v": 3})
    assert b.get(key) == {"v": 3}
    b.remove(key)
    b.close()


def test_etcd_all_endpoints_dead_names_each() -> None:
    p1, p2 = free_port(), free_port()
    err = assert_fails_fast(f"etcd://127.0.0.1:{p1};127.0.0.1:{p2}", "get")
    assert f"127.0.0.1:{p1}" in str(err) and f"127.0.0.1:{p2}" in str(err)
    assert "no endpoint reachable" in str(err)


def test_etcd_value_over_server_limit_is_clear(etcd_endpoint: str) -> None:
    b = open_metadata(f"etcd://{etcd_endpoint}")
    with pytest.raises(MetadataError, match="mooncake/ram/huge.*larger than max"):
        b.set("mooncake/ram/huge", {"blob": "x" * (3 << 20)})
    b.close()


@pytest.fixture(scope="module")
def redis_with_password() -> Iterator[tuple[str, str]]:
    """A real redis-server that requires a password: ("127.0.0.1:PORT", password)."""
    binary = shutil.which("redis-server")
    if not binary:
        msg = "redis-server not installed (run scripts/install.sh)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    port, password = free_port(), uuid.uuid4().hex
    data = tempfile.mkdtemp(prefix="mc-redis-pw-")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", data, "--requirepass", password],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port("127.0.0.1", port, 30, proc)
        yield f"127.0.0.1:{port}", password
    finally:
        stop_process(proc)
        shutil.rmtree(data, ignore_errors=True)


def test_redis_password_forms(redis_with_password, monkeypatch) -> None:
    endpoint, password = redis_with_password
    b = open_metadata(f"redis://:{password}@{endpoint}", timeout=TIMEOUT)
    b.set("mooncake/ram/pw", {"v": 1})
    assert b.get("mooncake/ram/pw") == {"v": 1}
    b.close()
    monkeypatch.setenv("MC_REDIS_PASSWORD", password)  # Mooncake's env form
    b = open_metadata(f"redis://{endpoint}", timeout=TIMEOUT)
    assert b.get("mooncake/ram/pw") == {"v": 1}
    b.close()


@pytest.mark.parametrize("conn_pw", ["wrong-pw", None])
def test_redis_wrong_or_missing_password_is_clear(redis_with_password, monkeypatch, conn_pw) -> None:
    endpoint, _ = redis_with_password
    monkeypatch.delenv("MC_REDIS_PASSWORD", raising=False)
    conn = f"redis://:{conn_pw}@{endpoint}" if conn_pw else f"redis://{endpoint}"
    b = open_metadata(conn, timeout=TIMEOUT)
    t0 = time.monotonic()
    with pytest.raises(MetadataError) as ei:
        b.get("mooncake/ram/x")
    assert time.monotonic() - t0 < TIMEOUT + SLACK
    msg = str(ei.value)
    assert endpoint in msg and ("authentication" in msg.lower() or "NOAUTH" in msg), msg
    assert "wrong-pw" not in msg  # never echo the password
    b.close()


def test_redis_db_index_isolates(redis_endpoint: str) -> None:
    key = f"mooncake/ram/db-{uuid.uuid4().hex}"
    b0 = open_metadata(f"redis://{redis_endpoint}/0")
    b3 = open_metadata(f"redis://{redis_endpoint}/3")
    b3.set(key, {"db": 3})
    assert b3.get(key) == {"db": 3} and b0.get(key) is None
    b3.remove(key)
    b0.close()
    b3.close()


@pytest.mark.parametrize("kind", ["redis", "etcd", "http"])
def test_non_json_value_is_clear(kind: str, request) -> None:
    """Another tool wrote garbage under a key: get names the key instead of crashing."""
    key = f"mooncake/ram/garbage-{uuid.uuid4().hex}"
    if kind == "redis":
        import redis
        host, port = request.getfixturevalue("redis_endpoint").split(":")
        redis.Redis(host=host, port=int(port)).set(key, b"\xff not json")
        b = open_metadata(f"redis://{host}:{port}")
    elif kind == "etcd":
        import etcd3gw
        ep = request.getfixturevalue("etcd_endpoint")
        host, port = ep.split(":")
        etcd3gw.client(host=host, port=int(port), timeout=5).put(key, "[1, 2]")
        b = open_metadata(f"etcd://{ep}")
    else:
        srv = request.getfixturevalue("http_server")
        srv.service.store.put(key, b"not json")
        b = open_metadata(srv.url)
    with pytest.raises(MetadataError, match=f"{key}.*(not valid JSON|expected a JSON object)"):
        b.get(key)
    b.remove(key)
    b.close()
