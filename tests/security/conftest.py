"""Fixtures of the security tests: peer processes started with (or without) the shared secret."""

from __future__ import annotations

import os
import tempfile
from typing import Iterator

import pytest
from mooncake_lab.te_helpers import Peer, spawn_peer

TOKEN = "s3cret-token-for-tests"


def peer_log(peer: Peer) -> str:
    """What a peer started by ``start_te_peer`` wrote to stderr (its log) so far."""
    with open(LOGS[peer.pid], encoding="utf-8", errors="replace") as f:
        return f.read()


LOGS: dict[int, str] = {}


def child_env(token: str | None, **extra: str) -> dict[str, str]:
    """This process's environment with MOONCAKE_AUTH_TOKEN set to ``token`` (or removed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MOONCAKE_AUTH_TOKEN", "MOONCAKE_AUTH_TOKEN_FILE")}
    if token is not None:
        env["MOONCAKE_AUTH_TOKEN"] = token
    env.update(extra)
    return env


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch) -> None:
    """Each test sets the token it means; none leaks in from the caller's environment."""
    monkeypatch.delenv("MOONCAKE_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("MOONCAKE_AUTH_TOKEN_FILE", raising=False)


@pytest.fixture
def start_te_peer(python_exe) -> Iterator:
    started: list[Peer] = []
    logs = tempfile.mkdtemp(prefix="mc-sec-")

    def start(token: str | None, metadata: str = "P2PHANDSHAKE", size: int = 1 << 20) -> Peer:
        log_path = os.path.join(logs, f"peer{len(started)}.log")
        with open(log_path, "w") as err:
            p = spawn_peer(python_exe, metadata, size=size, env=child_env(token), stderr=err)
        LOGS[p.pid] = log_path
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


@pytest.fixture(scope="session")
def self_signed(tmp_path_factory) -> tuple[str, str]:
    """(cert.pem, key.pem) of a self-signed certificate for 127.0.0.1, made by the openssl CLI."""
    import shutil
    import subprocess

    openssl = shutil.which("openssl")
    if not openssl:
        msg = "openssl CLI not installed (apt-get install openssl)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    d = tmp_path_factory.mktemp("tls")
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key
