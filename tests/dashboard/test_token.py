"""The page works with the services' auth token: ``?token=`` on the page URL is sent as
``Authorization: Bearer`` with every data request and removed from the address bar.

The auth check itself is not this page's job; a tiny test server stands in for a service
that wants the token (the page and data are the master's real ones, from an unbound server)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest
from prometheus_client import CollectorRegistry

from mooncake_core.dashboard.page import page_html
from mooncake_core.store.master_dashboard import MasterDashboard
from mooncake_core.store.master_server import MasterServer
from mooncake_core.store.master_state import MasterState
from tests.dashboard.test_master_page import console_errors, text, wait_for

pytestmark = pytest.mark.integration
TOKEN = "s3cr3t-token"


@pytest.fixture
def guarded() -> Iterator[tuple[str, list[str]]]:
    state = MasterState()
    state.mount_segment("c1", "10.0.0.9:1", 0x1000, 1 << 20)
    dash = MasterDashboard(MasterServer(state, "127.0.0.1", 0, registry=CollectorRegistry()))
    seen: list[str] = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.startswith("/dashboard/data.json"):
                auth = self.headers.get("Authorization", "")
                seen.append(auth)
                if auth != f"Bearer {TOKEN}":
                    return self._send(401, "application/json", b'{"error":"token required"}')
                return self._send(200, "application/json", json.dumps(dash.data()).encode())
            if self.path.startswith("/dashboard"):
                return self._send(200, "text/html; charset=utf-8", page_html("master"))
            self._send(404, "text/plain", b"")

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()


def test_token_goes_in_the_header_not_the_url(browser: Any, guarded: tuple[str, list[str]]) -> None:
    base, seen = guarded
    browser.get(base + "/dashboard")
    wait_for("the token hint", lambda: "?token=" in text(browser, "#status"))
    browser.get_log("browser")  # the 401s above are expected console noise
    browser.get(f"{base}/dashboard?token={TOKEN}")
    wait_for("the segment row", lambda: "10.0.0.9:1" in text(browser, "#segments"))
    assert "token" not in browser.current_url  # kept in sessionStorage, not in history/screenshots
    assert seen[-1] == f"Bearer {TOKEN}"
    browser.refresh()  # same tab, plain URL: still authorised
    n = len(seen)
    wait_for("polls after reload", lambda: len(seen) > n + 1)
    assert set(seen[n:]) == {f"Bearer {TOKEN}"}
    assert not console_errors(browser)
    browser.execute_script("sessionStorage.clear()")
