"""The store master's RPC and its embedded HTTP metadata server with a shared secret: a real
``mooncake_master`` process, real clients over real sockets.

Without the token, or with another, every RPC is refused with -600 naming the refusal (never a
hang, and the master keeps serving); with it, a store client sets up, puts and gets as before
(its engine publishes through the token-protected metadata server and serves its rpc port with
the token too). Started beyond loopback without a token, the master says so loudly.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store.master_client import MasterClient

from mooncake_lab.store_procs import Master, make_client
from .conftest import TOKEN

pytestmark = pytest.mark.integration


@pytest.fixture
def master(python_exe, tmp_path, monkeypatch):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    monkeypatch.setenv("MOONCAKE_AUTH_TOKEN", TOKEN)  # for the helper's readiness ping
    m = Master(python_exe, str(tmp_path), auth_token_file=str(path)).start()
    monkeypatch.delenv("MOONCAKE_AUTH_TOKEN")
    yield m
    m.stop()


@pytest.mark.parametrize("mine, reason", [(None, "no token presented"), ("wrong-token", "wrong token")])
def test_rpc_without_the_right_token_is_refused(master, monkeypatch, mine, reason) -> None:
    if mine is not None:
        monkeypatch.setenv("MOONCAKE_AUTH_TOKEN", mine)
    with MasterClient(master.addr, timeout=3.0) as c:
        for call in (c.ping, lambda: c.remove_all(True), lambda: c.exist_key("k")):
            t0 = time.monotonic()
            with pytest.raises(MooncakeError) as e:
                call()
            assert time.monotonic() - t0 < 3, "refusal took as long as a timeout"
            assert e.value.code == ErrorCode.INVALID_PARAMS
            assert "authentication failed" in e.value.message and reason in e.value.message, e.value.message
    log = master.log_tail()
    assert "refused unauthenticated client" in log and TOKEN not in log
    assert master.proc is not None and master.proc.poll() is None


def test_metadata_writes_need_the_token(master) -> None:
    key_url = master.meta + "?key=forged"
    req = urllib.request.Request(key_url, data=b'{"x": 1}', method="PUT")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 401 and b"no token presented" in e.value.read()
    bad = urllib.request.Request(key_url, data=b"{}", method="DELETE", headers={"Authorization": "Bearer nope"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad, timeout=5)
    assert e.value.code == 401 and b"wrong token" in e.value.read()
    good = urllib.request.Request(key_url, data=b'{"x": 1}', method="PUT",
                                  headers={"Authorization": f"Bearer {TOKEN}"})
    assert urllib.request.urlopen(good, timeout=5).status == 200
    health = master.meta.replace("/metadata", "/health")
    assert urllib.request.urlopen(health, timeout=5).status == 200  # probes stay open


def test_store_client_with_the_token_works(master, monkeypatch) -> None:
    monkeypatch.setenv("MOONCAKE_AUTH_TOKEN", TOKEN)
    s = make_client(master, segment=16 << 20, local_buffer_size=16 << 20)
    try:
        assert s.put("k1", b"v" * 100_000) == 0
        assert s.get("k1") == b"v" * 100_000
        assert s.is_exist("k1") == 1
    finally:
        s.close()


def test_store_client_without_the_token_fails_setup_clearly(master) -> None:
    from mooncake_core.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup({"local_hostname": "127.0.0.1", "metadata_server": master.meta, "global_segment_size": 0,
                  "local_buffer_size": 16 << 20, "protocol": "tcp", "master_server_addr": master.addr})
    assert rc != 0


def test_listening_beyond_loopback_without_a_token_warns(python_exe, tmp_path) -> None:
    m = Master(python_exe, str(tmp_path), rpc_address="0.0.0.0", http_metadata_server_host="0.0.0.0",
               metrics_address="127.0.0.1").start()
    want = ("master RPC listening", "HTTP metadata server listening", "metrics listening",
            "SECURITY: the master RPC listens on 0.0.0.0", "SECURITY: the HTTP metadata server listens on 0.0.0.0")
    try:
        # the master is up once its port answers; its log lines may reach the pipe a moment later
        deadline = time.monotonic() + 20
        while any(w not in m.log_tail() for w in want) and time.monotonic() < deadline:
            time.sleep(0.1)
        log = m.log_tail()
        for w in want:
            assert w in log, f"{w!r} not in the master's log:\n{log}"
    finally:
        m.stop()
