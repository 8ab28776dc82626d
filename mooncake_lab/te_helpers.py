"""Small helpers shared by the transfer tests (imported as a plain module)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from typing import IO, ClassVar

import numpy as np
from mooncake_lab.line_peer import LinePeer, spawn_line_peer

from mooncake_core.utils.proc import close_piped


def sha(arr) -> str:
    """sha256 hex of a numpy array / buffer's bytes."""
    return hashlib.sha256(bytes(memoryview(arr).cast("B"))).hexdigest()


PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "te_peer.py")


@dataclass
class Peer(LinePeer):
    """A running te_peer.py process (see its docstring for the commands)."""

    what: ClassVar[str] = "peer"
    proc: subprocess.Popen
    segment: str
    addr: int
    size: int
    pid: int
    rpc_port: int
    seed: int

    def sha(self, off: int, length: int) -> str:
        return self.cmd(f"sha {off} {length}")

    def expected(self) -> np.ndarray:
        return np.random.default_rng(self.seed).integers(0, 256, self.size, dtype=np.uint8)

    def stop(self) -> None:
        close_piped(self.proc)


def spawn_peer(python_exe: str, metadata: str, *, size: int = 1 << 20, seed: int = 7, hostname: str = "127.0.0.1",
               env: dict | None = None, wrap: list[str] | None = None, stderr: IO | None = None,
               protocol: str = "tcp", device: str = "") -> Peer:
    """Start te_peer.py and wait for its ready line (RuntimeError naming why it did not start)."""
    proc, info = spawn_line_peer([*(wrap or []), python_exe, PEER, "--metadata", metadata, "--size", str(size),
                                  "--seed", str(seed), "--hostname", hostname, "--protocol", protocol,
                                  "--device", device], Peer.what, env=env, stderr=stderr)
    return Peer(proc, info["segment"], info["addr"], info["size"], info["pid"], info["rpc_port"], seed)
