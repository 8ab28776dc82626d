"""A test peer process speaking a line protocol: one command line on its stdin, one answer line
on its stdout, after a first JSON line that says it is ready (or ``{"error": ...}``).

Shared by ``mooncake_lab/te_helpers.py`` (te_peer.py), ``mooncake_lab.fuzz.targets``
(te_target.py, for tests/fuzz and bench/robustness/bench_fuzz.py) and tests/gpu (gpu_peer.py).
"""

from __future__ import annotations

import json
import subprocess
from typing import IO, Any, ClassVar

from mooncake_core.utils.proc import readline_timeout

#: seconds a peer may take to answer one command or to get ready: a wedged peer is killed and
#: fails the test with its name instead of hanging it
ANSWER_TIMEOUT_S = 120.0


class LinePeer:
    """Base of a peer's handle (a dataclass with a ``proc`` field); ``what`` names it in errors."""

    proc: subprocess.Popen
    what: ClassVar[str] = "peer"

    def cmd(self, line: str, timeout: float = ANSWER_TIMEOUT_S) -> str:
        """Send one command, return its answer line (stripped); RuntimeError if the peer died."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = readline_timeout(self.proc, timeout, what=f"{self.what} running {line!r}")
        if not out:
            raise RuntimeError(f"{self.what} exited (rc={self.proc.poll()}) while running {line!r}")
        return out.strip()


def spawn_line_peer(argv: list[str], what: str, *, env: dict[str, str] | None = None,
                    stderr: IO[Any] | None = None, timeout: float = ANSWER_TIMEOUT_S) -> tuple[subprocess.Popen, dict]:
    """Start ``argv`` and return it with its ready line (a dict); RuntimeError naming ``what``
    and why when it exits first or reports ``{"error": ...}`` (the process is then killed)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    line = readline_timeout(proc, timeout, what=f"{what} starting")
    if not line:
        proc.kill()
        raise RuntimeError(f"{what} failed to start (rc={proc.wait()})")
    info = json.loads(line)
    if "error" in info:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{what} failed to initialize: {info['error']}")
    return proc, info
