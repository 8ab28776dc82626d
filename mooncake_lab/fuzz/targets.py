"""The fuzzed Transfer Engine's process (``te_target.py``): started by tests/fuzz, tests/security
and bench/robustness/bench_fuzz.py alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from mooncake_lab.line_peer import LinePeer, spawn_line_peer

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class TeTarget(LinePeer):
    what: ClassVar[str] = "te_target"
    proc: subprocess.Popen
    segment: str
    rpc_port: int
    base: int
    size: int
    seed: int

    def initial(self) -> bytes:
        return np.random.default_rng(self.seed).integers(0, 256, self.size, dtype=np.uint8).tobytes()

    def check(self) -> dict:
        return json.loads(self.cmd("check"))


def start_te_target(python_exe: str = sys.executable, size: int = 256 << 10, seed: int = 5,
                    env: dict | None = None) -> TeTarget:
    proc, d = spawn_line_peer([python_exe, os.path.join(HERE, "te_target.py"), "--size", str(size),
                               "--seed", str(seed)], TeTarget.what, env={**os.environ, **(env or {})})
    return TeTarget(proc, d["segment"], d["rpc_port"], d["base"], d["size"], seed)
