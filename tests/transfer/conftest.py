"""Fixtures for transfer tests: a peer process running te_peer.py, metadata backends."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

import numpy as np
import pytest

from mooncake_core.utils.proc import close_piped

PEER = os.path.join(os.path.dirname(__file__), "te_peer.py")


@dataclass
class Peer:
    proc: subprocess.Popen
    segment: str
    addr: int
    size: int
    pid: int
    rpc_port: int
    seed: int

    def cmd(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = self.proc.stdout.readline()
        if not out:
            raise RuntimeError(f"peer exited (rc={self.proc.poll()}) while running {line!r}")
        return out.strip()

    def sha(self, off: int, length: int) -> str:
        return self.cmd(f"sha {off} {length}")

    def expected(self) -> np.ndarray:
        return np.random.default_rng(self.seed).integers(0, 256, self.size, dtype=np.uint8)

    def stop(self) -> None:
        close_piped(self.proc)


@pytest.fixture
def start_peer(python_exe):
    started: list[Peer] = []

    def start(metadata: str, size: int = 1 << 20, seed: int = 7, hostname: str = "127.0.0.1",
              env: dict | None = None, wrap: list[str] | None = None) -> Peer:
        """``wrap``: a command prefix, e.g. ``["unshare", "--pid", "--fork"]``."""
        e = dict(os.environ)
        e.update(env or {})
        proc = subprocess.Popen([*(wrap or []), python_exe, PEER, "--metadata", metadata, "--size", str(size),
                                 "--seed", str(seed), "--hostname", hostname],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=e)
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            raise RuntimeError(f"peer failed to start (rc={proc.wait()})")
        info = json.loads(line)
        if "error" in info:
            proc.kill()
            raise RuntimeError(f"peer failed to initialize: {info['error']}")
        p = Peer(proc, info["segment"], info["addr"], info["size"], info["pid"], info["rpc_port"], seed)
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

    def make(metadata: str, hostname: str = "127.0.0.1") -> TransferEngine:
        e = TransferEngine()
        rc = e.initialize(hostname, metadata, "tcp", "")
        assert rc == 0, e.last_error
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()
