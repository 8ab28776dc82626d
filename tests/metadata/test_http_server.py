"""The HTTP metadata server's wire behaviour, driven with raw HTTP requests."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import threading
import urllib.parse

import pytest

from mooncake_core.metadata import HttpMetadataServer, MetadataError, open_metadata
from mooncake_core.metadata.http_server import MetadataHttpService

from mooncake_core.utils.net import free_port

from .helpers import ServerProcess, http_call, random_descriptor, server_command

pytestmark = pytest.mark.integration


def key_url(base: str, key: str) -> str:
    return base + "?" + urllib.parse.urlencode({"key": key})


@pytest.mark.parametrize("kind", ["inproc", "proc"])
def test_mooncake_semantics(kind: str, request) -> None:
    srv = request.getfixturevalue("http_server" if kind == "inproc" else "http_server_proc")
    base = srv.url
    body = os.urandom(64).hex().encode() + b"\x00\xff raw bytes kept verbatim"
    assert http_call("GET", key_url(base, "mooncake/ram/x")) == (404, b"metadata not found")
    status, text = http_call("PUT", key_url(base, "mooncake/ram/x"), body)
    assert (status, text) == (200, b"metadata updated")
    assert http_call("GET", key_url(base, "mooncake/ram/x")) == (200, body)
    assert http_call("DELETE", key_url(base, "mooncake/ram/x")) == (200, b"metadata deleted")
    assert http_call("DELETE", key_url(base, "mooncake/ram/x")) == (404, b"metadata not found")
    assert http_call("GET", key_url(base, "mooncake/ram/x"))[0] == 404
    assert http_call("POST", key_url(base, "k"), b"x")[0] == 405


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
@pytest.mark.parametrize("query", ["", "?key=", "?key=%20%20", "?other=1"])
def test_missing_or_blank_key_is_400(http_server, method: str, query: str) -> None:
    status, text = http_call(method, http_server.url + query, b"{}" if method == "PUT" else None)
    assert status == 400
    assert b"metadata key is required" in text
    assert http_server.service.store.keys() == []


def test_prefix_listing(http_server) -> None:
    for k in ["mooncake/ram/a", "mooncake/ram/b", "mooncake/rpc_meta/a"]:
        assert http_call("PUT", key_url(http_server.url, k), b"{}")[0] == 200
    status, text = http_call("GET", http_server.url + "?prefix=mooncake/ram/")
    assert status == 200 and json.loads(text) == {"keys": ["mooncake/ram/a", "mooncake/ram/b"]}


def test_body_too_large_is_413_and_server_survives() -> None:
    with HttpMetadataServer(port=0, max_body=1024) as srv:
        status, text = http_call("PUT", key_url(srv.url, "big"), os.urandom(4096))
        assert status == 413
        assert b"'big'" in text and b"1024 bytes" in text
        assert http_call("PUT", key_url(srv.url, "small"), b'{"ok":1}')[0] == 200
        assert http_call("GET", key_url(srv.url, "small")) == (200, b'{"ok":1}')
        assert http_call("GET", key_url(srv.url, "big"))[0] == 404


def test_budgets_answer_507() -> None:
    with HttpMetadataServer(port=0, max_keys=2) as srv:
        b = open_metadata(srv.url)
        b.set("a", {"v": 1})
        b.set("b", {"v": 2})
        with pytest.raises(MetadataError, match="507.*key budget"):
            b.set("c", {"v": 3})
        b.set("a", {"v": 4})  # replacing an existing key is fine
        assert b.get("a") == {"v": 4}


def test_token_auth(monkeypatch) -> None:
    with HttpMetadataServer(port=0, auth_token="s3cret") as srv:
        assert http_call("GET", key_url(srv.url, "k"))[0] == 401
        assert http_call("GET", key_url(srv.url, "k"), headers={"Authorization": "Bearer nope"})[0] == 401
        monkeypatch.delenv("MC_METADATA_HTTP_TOKEN", raising=False)
        with pytest.raises(MetadataError, match="unauthorized.*MC_METADATA_HTTP_TOKEN"):
            open_metadata(srv.url).get("k")
        monkeypatch.setenv("MC_METADATA_HTTP_TOKEN", "s3cret")
        b = open_metadata(srv.url)
        b.set("k", {"v": 1})
        assert b.get("k") == {"v": 1}


def test_health_and_metrics(http_server) -> None:
    b = open_metadata(http_server.url)
    b.set("mooncake/ram/m", {"a": 1})
    b.get("mooncake/ram/m")
    assert b.get("mooncake/ram/none") is None
    http_call("GET", http_server.url + "?key=")
    status, text = http_call("GET", f"http://127.0.0.1:{http_server.port}/health")
    assert status == 200 and json.loads(text) == {"status": "ok", "keys": 1}
    status, text = http_call("GET", f"http://127.0.0.1:{http_server.port}/metrics")
    metrics = text.decode()
    assert status == 200
    assert "mooncake_metadata_keys 1.0" in metrics
    assert 'mooncake_metadata_requests_total{method="PUT",status="200"} 1.0' in metrics
    assert 'mooncake_metadata_requests_total{method="GET",status="404"} 1.0' in metrics
    assert 'mooncake_metadata_requests_total{method="GET",status="400"} 1.0' in metrics
    assert 'mooncake_metadata_request_duration_seconds_count{method="GET"}' in metrics


def test_persist_survives_inprocess_restart(tmp_path) -> None:
    path = str(tmp_path / "meta.json")
    values = {f"mooncake/ram/seg{i}": random_descriptor(f"seg{i}") for i in range(20)}
    with HttpMetadataServer(port=0, persist_path=path) as srv:
        port = srv.port
        b = open_metadata(srv.url)
        for k, v in values.items():
            b.set(k, v)
        b.remove("mooncake/ram/seg0")
        del values["mooncake/ram/seg0"]
    with HttpMetadataServer(port=port, persist_path=path) as srv:  # same URL for the peers
        b = open_metadata(srv.url)
        assert b.list("mooncake/ram/") == sorted(values)
        for k, v in values.items():
            assert b.get(k) == v


def test_persist_survives_process_kill(python_exe, tmp_path) -> None:
    """Even SIGKILL (no clean shutdown) keeps every acknowledged write."""
    path = str(tmp_path / "meta.json")
    sp = ServerProcess(python_exe, "--persist-path", path)
    try:
        b = open_metadata(sp.url)
        values = {f"mooncake/ram/p{i}": random_descriptor(f"p{i}") for i in range(10)}
        for k, v in values.items():
            b.set(k, v)
        sp.proc.kill()
        sp.proc.wait(10)
    finally:
        sp.stop()
    sp2 = ServerProcess(python_exe, "--persist-path", path)
    try:
        b = open_metadata(sp2.url)
        for k, v in values.items():
            assert b.get(k) == v
    finally:
        sp2.stop()


def test_corrupt_persist_file_refuses_to_start(python_exe, tmp_path) -> None:
    path = tmp_path / "meta.json"
    path.write_text("{garbage")
    r = subprocess.run(server_command(python_exe) + ["--port", "0", "--persist-path", str(path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert str(path) in r.stderr and "not valid JSON" in r.stderr
    assert path.read_text() == "{garbage"  # never silently overwritten


def test_busy_port_clear_error_nonzero_exit(python_exe) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run(server_command(python_exe) + ["--port", str(port)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode != 0
        assert f"127.0.0.1:{port}" in r.stderr and "in use" in r.stderr.lower()
        with pytest.raises(OSError, match=f"127.0.0.1:{port}.*another process"):
            HttpMetadataServer(port=port).start()


def test_cli_help_explains_every_flag(python_exe) -> None:
    r = subprocess.run(server_command(python_exe) + ["--help"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0
    for flag in ("--host", "--port", "--persist-path", "--max-body", "--log-level"):
        assert flag in r.stdout
    assert "MC_METADATA_HTTP_TOKEN" in r.stdout


def test_bad_cli_values(python_exe) -> None:
    r = subprocess.run(server_command(python_exe) + ["--max-body", "lots"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "--max-body" in r.stderr
    r = subprocess.run(server_command(python_exe) + ["--port", "70000"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "70000" in r.stderr


async def test_async_service_in_running_loop() -> None:
    """The service runs inside an existing event loop (e.g. the store master's)."""
    svc = MetadataHttpService()
    port = await svc.start("127.0.0.1", 0)
    try:
        import asyncio
        url = f"http://127.0.0.1:{port}/metadata"
        b = open_metadata(url)
        value = random_descriptor("async")
        await asyncio.to_thread(b.set, "mooncake/ram/async", value)
        assert await asyncio.to_thread(b.get, "mooncake/ram/async") == value
    finally:
        await svc.stop()


def test_many_parallel_clients_against_subprocess(http_server_proc) -> None:
    """16 threads with their own clients hammer one server process; nothing is lost."""
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            b = open_metadata(http_server_proc.url)
            for i in range(30):
                v = {"t": t, "i": i, "r": random.random()}
                b.set(f"mooncake/ram/{t}/{i}", v)
                assert b.get(f"mooncake/ram/{t}/{i}") == v
            b.close()
        except BaseException as e:
            errors.append(e)

    ths = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(60)
    assert not errors, errors[0]
    assert len(open_metadata(http_server_proc.url).list("mooncake/ram/")) == 16 * 30


def test_host_with_port_is_accepted(python_exe) -> None:
    """Mooncake #2785: '--host H:P' crashed; ours binds H:P."""
    port = free_port()
    sp = ServerProcess(python_exe, "--host", f"127.0.0.1:{port}", port_flag=False)
    try:
        assert sp.port == port
        b = open_metadata(sp.url)
        b.set("k", {"v": 1})
        assert b.get("k") == {"v": 1}
    finally:
        sp.stop()
    r = subprocess.run(server_command(python_exe) + ["--host", f"127.0.0.1:{port}", "--port", "1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "give one" in r.stderr


def test_unknown_host_is_clear(python_exe) -> None:
    r = subprocess.run(server_command(python_exe) + ["--host", "no-such-host.invalid", "--port", "0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "no-such-host.invalid" in r.stderr


def test_resolve_host_port_unit() -> None:
    from mooncake_core.metadata.http_server import resolve_host_port
    assert resolve_host_port("127.0.0.1", None) == ("127.0.0.1", 8080)
    assert resolve_host_port("0.0.0.0:9000", None) == ("0.0.0.0", 9000)
    assert resolve_host_port("[::1]:81", None) == ("::1", 81)
    assert resolve_host_port("::1", 0) == ("::1", 0)
    for host, port, why in [("a:1", 2, "give one"), ("a:x", None, "not a number"),
                            (":80", None, "missing address"), ("a", 70000, "out of range")]:
        with pytest.raises(ValueError, match=why):
            resolve_host_port(host, port)


def test_bench_smoke() -> None:
    """The benchmark module keeps working (HTTP rows only, a few ms each)."""
    from mooncake_core.metadata import bench
    assert bench.main(["--seconds", "0.05", "--etcd", "", "--redis", ""]) == 0


def test_client_sees_413_for_oversized_value(http_server) -> None:
    b = open_metadata(http_server.url)
    with pytest.raises(MetadataError, match="413.*'mooncake/ram/huge'.*16.00 MiB"):
        b.set("mooncake/ram/huge", {"blob": "x" * (17 << 20)})
    b.set("mooncake/ram/ok", {"v": 1})  # same client keeps working
    assert b.get("mooncake/ram/ok") == {"v": 1}


async def test_add_routes_to_existing_app() -> None:
    """The store master mounts /metadata next to its own routes on one aiohttp app."""
    import asyncio

    from aiohttp import web
    app = web.Application()
    async def own(request: web.Request) -> web.Response:
        return web.Response(text="own route")
    app.router.add_get("/own", own)
    svc = MetadataHttpService()
    svc.add_routes(app)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        b = open_metadata(f"http://127.0.0.1:{port}/metadata")
        value = random_descriptor("mounted")
        await asyncio.to_thread(b.set, "mooncake/ram/mounted", value)
        assert await asyncio.to_thread(b.get, "mooncake/ram/mounted") == value
        assert await asyncio.to_thread(http_call, "GET", f"http://127.0.0.1:{port}/own") == (200, b"own route")
    finally:
        await runner.cleanup()


def test_sigterm_exits_cleanly_with_json_logs(python_exe) -> None:
    sp = ServerProcess(python_exe, "--log-level", "DEBUG", env={"MC_LOG_JSON": "1"})
    b = open_metadata(sp.url)
    b.set("k", {"v": 1})
    assert sp.stop() == 0
    lines = [json.loads(x) for x in sp.proc.stderr.read().decode().splitlines() if x.startswith("{")]
    msgs = [rec["msg"] for rec in lines]
    assert "HTTP metadata server listening" in msgs and "shutting down" in msgs
    assert any(rec.get("url") == sp.url for rec in lines)


def test_garbage_bytes_do_not_hurt_the_server(http_server) -> None:
    for junk in (b"\x00\xff" * 500, b"GET /metadata?key=k HTTP/9.9\r\n\r\n", b"PUT\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", http_server.port), timeout=5) as s:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            try:
                s.recv(4096)
            except OSError:
                pass
    b = open_metadata(http_server.url)
    b.set("still", {"alive": True})
    assert b.get("still") == {"alive": True}
