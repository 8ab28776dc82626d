"""Fixtures starting real ``mooncake_master`` processes on free loopback ports."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from typing import Callable, Iterator

import pytest

from mooncake_lab.master_proc import MasterProc
from mooncake_core.utils.net import free_port

__all__ = ["MasterProc", "start_master"]


@pytest.fixture
def start_master() -> Iterator[Callable[..., MasterProc]]:
    """start_master(*flags, port=None, wait=True) -> MasterProc (killed at teardown)."""
    procs: list[MasterProc] = []
    tmp = tempfile.mkdtemp(prefix="mc-master-test-")

    def _start(*flags: str, port: int | None = None, wait: bool = True) -> MasterProc:
        port = port or free_port()
        mport = free_port()
        args = [f"--port={port}", "--rpc_address=127.0.0.1", f"--metrics_port={mport}", *flags]
        mp = MasterProc(args, port, mport, os.path.join(tmp, f"master-{port}-{len(procs)}.log"))
        procs.append(mp)
        return mp.wait_ready() if wait else mp

    yield _start
    for mp in procs:
        mp.kill(signal.SIGTERM)
    shutil.rmtree(tmp, ignore_errors=True)
