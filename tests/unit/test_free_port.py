"""free_port / listen_port: ports drawn in one process are distinct, even before anyone binds them.

Why it matters: a test draws several ports and only then starts the servers; the kernel may hand
the same ephemeral port to two ``bind(0)`` calls in a row, and vLLM binds with SO_REUSEPORT, so two
servers on one port would both come up and look healthy.
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

from mooncake_core.utils.net import _bindable, ephemeral_low, free_port, listen_port


def test_free_ports_never_repeat_in_one_process() -> None:
    # 2,000 unbound draws from a ~28k ephemeral range: the kernel alone repeats one (birthday bound)
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    assert all(_bindable("127.0.0.1", p) for p in ports[:50])  # free when drawn, none bound since


def test_free_ports_distinct_across_threads() -> None:
    with ThreadPoolExecutor(8) as ex:
        ports = list(ex.map(lambda _: free_port(), range(800)))
    assert len(set(ports)) == len(ports)


def test_listen_ports_are_distinct_and_below_the_ephemeral_range() -> None:
    ports = [listen_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)
    assert all(15000 <= p < max(15001, min(ephemeral_low(), 32768)) for p in ports)


def test_a_reuseport_listener_makes_its_port_unbindable() -> None:
    """The check a drawn port passes: a plain bind, which fails where a SO_REUSEPORT server
    listens (a SO_REUSEPORT bind would succeed and hide it)."""
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        assert not _bindable("127.0.0.1", port)
        with socket.socket() as twin:  # what vLLM's second server would do
            twin.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            twin.bind(("127.0.0.1", port))
    assert _bindable("127.0.0.1", port)
