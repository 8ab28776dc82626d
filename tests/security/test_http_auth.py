"""HTTP surfaces with the shared secret and TLS: the proxy's admin API and request-size limit,
the HTTP metadata server over HTTPS. Real processes, real sockets, a self-signed certificate."""

from __future__ import annotations

import os
import ssl
import sys

import httpx
import pytest

from mooncake_core.metadata.conn_string import parse_http
from mooncake_core.metadata.http_backend import HttpMetadataBackend
from mooncake_core.metadata.base import MetadataError
from mooncake_core.utils.proc import spawn_until, stop_process

from .conftest import TOKEN, child_env

pytestmark = pytest.mark.integration


def _spawn(args: list[str], what: str, env: dict[str, str]):
    proc, m = spawn_until([sys.executable, "-u", *args], what + r" listening on https?://[^ ]+:(\d+)", 30,
                          env=env, what=what)
    return proc, int(m.group(1))


@pytest.fixture
def proxy(request, self_signed):
    """A proxy started with MOONCAKE_AUTH_TOKEN, HTTPS and a 4 KiB body limit."""
    cert, key = self_signed
    proc, port = _spawn(["-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", "0",
                         "--max-request-bytes", "4096", "--tls-cert", cert, "--tls-key", key],
                        "mooncake_proxy", child_env(TOKEN))
    yield f"https://127.0.0.1:{port}", cert, proc
    stop_process(proc, 5)


def test_proxy_admin_api_needs_the_token(proxy) -> None:
    url, cert, proc = proxy
    with httpx.Client(timeout=10, verify=ssl.create_default_context(cafile=cert)) as c:
        r = c.get(url + "/admin/instances")
        assert r.status_code == 401 and "no key presented" in r.json()["error"]["message"]
        r = c.post(url + "/admin/instances", json={"role": "decode", "url": "http://evil:1"},
                   headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and "a wrong key" in r.json()["error"]["message"]
        assert c.get(url + "/admin/instances", headers={"Authorization": f"Bearer {TOKEN}"}).json() == \
            {"instances": []}, "the refused POST added an instance"
        assert c.get(url + "/admin/instances", headers={"X-Admin-Key": TOKEN}).status_code == 200
        assert c.get(url + "/health").status_code in (200, 503)  # probes stay open
    assert TOKEN not in "".join(proc.output_tail)


def test_proxy_refuses_an_oversize_body_clearly(proxy) -> None:
    url, cert, proc = proxy
    with httpx.Client(timeout=10, verify=ssl.create_default_context(cafile=cert)) as c:
        r = c.post(url + "/v1/completions", json={"prompt": "x" * 10_000, "max_tokens": 1})
        assert r.status_code == 413 and "4096 bytes" in r.text and "--max-request-bytes" in r.text
        assert c.get(url + "/health").status_code in (200, 503)  # still serving
    assert proc.poll() is None


def test_proxy_beyond_loopback_without_a_token_warns() -> None:
    proc, _ = _spawn(["-m", "mooncake_proxy.cli", "--host", "0.0.0.0", "--port", "0"], "mooncake_proxy",
                     child_env(None))
    try:
        out = "".join(proc.output_tail)
        assert "proxy listening" in out
        assert "SECURITY: the proxy's admin API listens on 0.0.0.0" in out
    finally:
        stop_process(proc, 5)


def test_metadata_server_over_https_with_a_token(self_signed, monkeypatch) -> None:
    cert, key = self_signed
    proc, port = _spawn(["-m", "mooncake_core.metadata.http_server", "--host", "127.0.0.1", "--port", "0",
                         "--tls-cert", cert, "--tls-key", key], "mooncake_http_metadata_server", child_env(TOKEN))
    try:
        url = f"https://127.0.0.1:{port}/metadata"
        monkeypatch.setenv("SSL_CERT_FILE", cert)  # trust the test's CA, the OpenSSL way
        monkeypatch.setenv("MOONCAKE_AUTH_TOKEN", TOKEN)
        ok = HttpMetadataBackend(parse_http(url))
        ok.set("seg/a", {"v": 1})
        assert ok.get("seg/a") == {"v": 1}
        ok.close()
        monkeypatch.setenv("MOONCAKE_AUTH_TOKEN", "wrong-token")
        bad = HttpMetadataBackend(parse_http(url))
        with pytest.raises(MetadataError, match="unauthorized.*wrong token"):
            bad.set("seg/a", {"v": 2})
        bad.close()
        with pytest.raises(httpx.TransportError):  # a plain-HTTP client of the TLS port gets no answer
            httpx.get(url.replace("https://", "http://") + "?key=seg/a", timeout=5).raise_for_status()
    finally:
        stop_process(proc, 5)
    assert "https://127.0.0.1" in "".join(proc.output_tail) and TOKEN not in "".join(proc.output_tail)
    assert os.path.exists(cert)
