"""Session-wide fixtures: real etcd and Redis servers on free loopback ports.

The services are real binaries (Debian's etcd-server and redis-server, installed by
scripts/install.sh). Set MOONCAKE_TEST_ETCD=host:port / MOONCAKE_TEST_REDIS=host:port to
use already-running ones instead. When a binary is missing the dependent tests are skipped
with a message naming it -- except under CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Iterator

import pytest

from mooncake_core import envs
from mooncake_core.utils.net import free_port, wait_for_port
from mooncake_core.utils.proc import stop_process


@contextlib.contextmanager
def _serving(proc: subprocess.Popen, port: int, data: str) -> Iterator[str]:
    """'127.0.0.1:PORT' once ``proc`` listens; stops it and removes its data dir afterwards."""
    try:
        wait_for_port("127.0.0.1", port, 30, proc)
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(proc)
        shutil.rmtree(data, ignore_errors=True)


def _missing(binary: str, packages: str = "etcd-server redis-server") -> None:
    msg = f"{binary} not installed (run scripts/install.sh: apt-get install {packages})"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def etcd_endpoint() -> Iterator[str]:
    """'127.0.0.1:PORT' of a real etcd server for this test session."""
    given = envs.MOONCAKE_TEST_ETCD
    if given:
        yield given
        return
    binary = shutil.which("etcd")
    if not binary:
        _missing("etcd")
    port, peer = free_port(), free_port()
    data = tempfile.mkdtemp(prefix="mc-etcd-")
    log = open(os.path.join(data, "etcd.log"), "w")
    proc = subprocess.Popen(
        [binary, "--name", "mc-test", "--data-dir", os.path.join(data, "d"),
         "--listen-client-urls", f"http://127.0.0.1:{port}",
         "--advertise-client-urls", f"http://127.0.0.1:{port}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"mc-test=http://127.0.0.1:{peer}"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    with _serving(proc, port, data) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def redis_endpoint() -> Iterator[str]:
    """'127.0.0.1:PORT' of a real Redis server for this test session."""
    given = envs.MOONCAKE_TEST_REDIS
    if given:
        yield given
        return
    binary = shutil.which("redis-server")
    if not binary:
        _missing("redis-server")
    port = free_port()
    data = tempfile.mkdtemp(prefix="mc-redis-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", data],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    with _serving(proc, port, data) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of Prometheus' ``promtool`` (Debian's ``prometheus`` package), for the alert-rule tests."""
    binary = shutil.which("promtool")
    if not binary:
        _missing("promtool", "prometheus")
    return str(binary)


@pytest.fixture(scope="session")
def python_exe() -> str:
    """The interpreter running the tests, for spawning peer processes."""
    return sys.executable
