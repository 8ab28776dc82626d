"""mooncake_core.utils.metrics.start_metrics_server against real sockets."""

from __future__ import annotations

import socket
import uuid

import pytest
from prometheus_client import CollectorRegistry, Counter

from mooncake_core.utils.metrics import start_metrics_server, stop_metrics_servers

from .helpers import http_call

pytestmark = pytest.mark.integration


def test_serves_registry_on_picked_port() -> None:
    reg = CollectorRegistry()
    name = f"mooncake_test_{uuid.uuid4().hex[:8]}"
    c = Counter(name, "test counter", ["kind"], registry=reg)
    c.labels("a").inc(7)
    port = start_metrics_server(0, registry=reg)
    try:
        assert port > 0
        status, body = http_call("GET", f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert f'{name}_total{{kind="a"}} 7.0' in body.decode()
    finally:
        stop_metrics_servers()


def test_busy_port_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(OSError, match=f"metrics server: cannot bind 127.0.0.1:{port}"):
            start_metrics_server(port)


@pytest.mark.parametrize("bad", [-1, 70000, "9003"])
def test_bad_port_rejected(bad) -> None:
    with pytest.raises(ValueError, match="metrics port"):
        start_metrics_server(bad)


def test_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    reg = CollectorRegistry()
    Counter("mooncake_test_v6", "v6", registry=reg).inc()
    try:
        port = start_metrics_server(0, host="::1", registry=reg)
    except OSError as e:
        pytest.skip(f"IPv6 loopback unavailable: {e}")
    try:
        status, body = http_call("GET", f"http://[::1]:{port}/metrics")
        assert status == 200 and b"mooncake_test_v6_total 1.0" in body
    finally:
        stop_metrics_servers()
