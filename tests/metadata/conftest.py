"""Fixtures for the metadata tests: HTTP metadata servers in-process and as real processes.

etcd and Redis come from the session fixtures in tests/conftest.py (real binaries).
"""

from __future__ import annotations

from typing import Iterator

import pytest

from mooncake_core.metadata import HttpMetadataServer

from .helpers import ServerProcess


@pytest.fixture
def http_server() -> Iterator[HttpMetadataServer]:
    srv = HttpMetadataServer(port=0).start()
    yield srv
    srv.stop()


@pytest.fixture
def http_server_proc(python_exe: str) -> Iterator[ServerProcess]:
    sp = ServerProcess(python_exe)
    yield sp
    sp.stop()


