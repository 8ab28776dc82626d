"""The per-process operation log of a chaos worker (JSON lines, one file per incarnation).

Why a file, appended with one ``os.write`` per record: a worker can be SIGKILLed at any
moment, and the checker must still know every write it *began* (an interrupted put may
have become visible), so a write's ``begin`` record reaches the kernel before the call.
Records (all times ``CLOCK_MONOTONIC`` ns, shared by every process on the host):

* ``{"b": 1, "w", "i", "t", "n", "op", "k", "v", "ts"}`` -- a put/upsert about to start;
* ``{"w", "i", "t", "n", "op", "k", "ts", "te", "rc", ["v"], ["got", "st"]}`` -- any op done;
* ``{"stuck": 1, "w", "i", "t", "n", "op", "k", "ts", "tn"}`` -- still running at shutdown.

``w`` writer slot, ``i`` incarnation, ``t`` thread, ``n`` per-thread op number, ``v`` the
WriteId written, ``got``/``st`` what a read returned (see payload.Decoded). Stdlib only.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Iterator


class OpLog:
    """Append-only writer; safe to share between threads (one write call per record)."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, rec: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def log_path(logdir: str, writer: int, incarnation: int) -> str:
    return os.path.join(logdir, f"ops-w{writer}-i{incarnation}.jsonl")


def read_records(logdir: str) -> Iterator[dict[str, Any]]:
    """Every record of every worker log in ``logdir``; a line torn by a SIGKILL is skipped."""
    for path in sorted(glob.glob(os.path.join(logdir, "ops-w*-i*.jsonl"))):
        with open(path, "rb") as f:
            for line in f:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue
