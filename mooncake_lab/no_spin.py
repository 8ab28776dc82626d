"""``--no-idle-spin`` for the vLLM benches (bench-only; never used by the product).

The servers are started with ``mooncake_lab/vllm_no_spin`` (a ``sitecustomize``) first on ``PYTHONPATH``; it cuts
vLLM CPU's 1 s busy spin after each message to 2 ms (why: see that module). One place for the path,
the log mark that proves the patch ran, and the check, shared by ``bench/frameworks/bench_vllm_pd.py`` and
``bench/scheduling/bench_live_scheduling.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Protocol

DIR = Path(__file__).resolve().parent / "vllm_no_spin"
MARK = "[bench no-idle-spin]"


class _Logged(Protocol):
    def log_text(self) -> str: ...


def pythonpath(rest: str) -> str:
    """``PYTHONPATH`` for a server: the patch first, then ``rest`` (the checkout shim)."""
    return os.pathsep.join([str(DIR), rest])


def check_applied(servers: Iterable[_Logged], where: str = "") -> None:
    """Raise unless every server's log shows the patch ran."""
    if not all(MARK in s.log_text() for s in servers):
        raise RuntimeError(f"--no-idle-spin: a server's log lacks {MARK!r} (patch not applied){where}")
