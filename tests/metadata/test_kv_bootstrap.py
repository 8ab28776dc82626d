"""The original's in-process server interface (``mooncake.http_metadata_server.KVBootstrapServer``)
on our metadata server, over a real socket: keys are whitespace-stripped, the responses Mooncake
defines carry its content type, and run / poll / close behave as its users expect."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

import pytest

from mooncake_core.metadata.kv_bootstrap import KVBootstrapServer, KVPoll

from .helpers import http_call

pytestmark = pytest.mark.integration


def _content_type(method: str, url: str) -> tuple[int, str]:
    req = urllib.request.Request(url, method=method, data=b"{}" if method == "PUT" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers.get_content_type()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get_content_type()


def test_bootstrap_server_serves_strips_keys_and_stops() -> None:
    srv = KVBootstrapServer(port=0, host="127.0.0.1")
    assert srv.poll() is KVPoll.Failed  # not running yet
    thread = srv.run()
    try:
        assert thread.is_alive() and srv.poll() is KVPoll.Success and srv.port > 0
        base = f"http://127.0.0.1:{srv.port}/metadata"
        padded = base + "?" + urllib.parse.urlencode({"key": "  seg/a  "})
        assert http_call("PUT", padded, b"v1") == (200, b"metadata updated")
        assert "seg/a" in srv.store and "  seg/a  " not in srv.store
        assert http_call("GET", base + "?key=seg/a") == (200, b"v1")
        assert http_call("DELETE", padded) == (200, b"metadata deleted")
        assert "seg/a" not in srv.store
        for method in ("GET", "PUT", "DELETE"):
            assert _content_type(method, base + "?key=%20") == (400, "application/json")
        assert _content_type("GET", base + "?key=absent") == (404, "application/json")
    finally:
        srv.close()
    assert srv.poll() is KVPoll.Failed
    srv.close()  # idempotent


def test_bootstrap_server_on_a_taken_port_fails_at_run_naming_it() -> None:
    first = KVBootstrapServer(port=0, host="127.0.0.1")
    first.run()
    try:
        second = KVBootstrapServer(port=first.port, host="127.0.0.1")
        with pytest.raises(OSError, match=str(first.port)):
            second.run()
        assert second.poll() is KVPoll.Failed
    finally:
        first.close()
