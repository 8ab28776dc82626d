"""Fixtures for transfer tests: a peer process running te_peer.py, metadata backends."""

from __future__ import annotations

import os

import pytest
from mooncake_lab.te_helpers import Peer, spawn_peer


@pytest.fixture
def start_peer(python_exe):
    started: list[Peer] = []

    def start(metadata: str, size: int = 1 << 20, seed: int = 7, hostname: str = "127.0.0.1",
              env: dict | None = None, wrap: list[str] | None = None, protocol: str = "tcp",
              device: str = "") -> Peer:
        """``wrap``: a command prefix, e.g. ``["unshare", "--pid", "--fork"]``."""
        p = spawn_peer(python_exe, metadata, size=size, seed=seed, hostname=hostname,
                       env={**os.environ, **(env or {})}, wrap=wrap, protocol=protocol, device=device)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


@pytest.fixture(scope="module")
def http_metadata():
    from mooncake_core.metadata import HttpMetadataServer
    srv = HttpMetadataServer(port=0).start()
    yield srv.url
    srv.stop()


@pytest.fixture
def engine_factory():
    from mooncake_core.engine import TransferEngine
    made = []

    def make(metadata: str, hostname: str = "127.0.0.1", protocol: str = "tcp", device: str = "") -> TransferEngine:
        e = TransferEngine()
        rc = e.initialize(hostname, metadata, protocol, device)
        assert rc == 0, e.last_error
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


@pytest.fixture(scope="module")
def ucx_lib():
    """The process's libucp (the UCX transport's tests): CI installs the libucx wheel (the ``ucx``
    extra is in ``test``), so there a missing UCX fails; elsewhere the test skips, naming it."""
    from mooncake_core.transfer.ucx import library
    try:
        return library.load()
    except library.UcxNotFound as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the UCX transport: {e}")
        pytest.skip(f"no UCX here: {e}")
