"""Fixtures of the security tests: peer processes started with (or without) the shared secret."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Iterator

import pytest

from mooncake_core.utils.proc import close_piped

TE_PEER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "transfer", "te_peer.py")
TOKEN = "s3cret-token-for-tests"


@dataclass
class TePeer:
    proc: subprocess.Popen
    segment: str
    addr: int
    size: int
    pid: int
    rpc_port: int
    log_path: str

    def cmd(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = self.proc.stdout.readline()
        if not out:
            raise RuntimeError(f"peer exited (rc={self.proc.poll()}) while running {line!r}")
        return out.strip()

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()


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
    started: list[TePeer] = []
    logs = tempfile.mkdtemp(prefix="mc-sec-")

    def start(token: str | None, metadata: str = "P2PHANDSHAKE", size: int = 1 << 20) -> TePeer:
        log_path = os.path.join(logs, f"peer{len(started)}.log")
        with open(log_path, "w") as err:
            proc = subprocess.Popen([python_exe, TE_PEER, "--metadata", metadata, "--size", str(size)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                    env=child_env(token))
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            raise RuntimeError(f"peer failed to start (rc={proc.wait()}): {open(log_path).read()}")
        info = json.loads(line)
        if "error" in info:
            proc.kill()
            raise RuntimeError(f"peer failed to initialize: {info['error']}")
        p = TePeer(proc, info["segment"], info["addr"], info["size"], info["pid"], info["rpc_port"], log_path)
        started.append(p)
        return p

    yield start
    for p in started:
        close_piped(p.proc)
