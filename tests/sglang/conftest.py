"""Fixtures for the SGLang connector tests.

SGLang (0.5.23) lives in its own venv (``scripts/install_sglang.sh``; ``$SGLANG_VENV``, default
``~/.cache/mooncake-core/venvs/sglang``) because it pins its own torch/transformers. The tests run the SGLang side
as subprocesses of that venv's python; without the venv they skip with a message naming the
install script, unless ``MOONCAKE_REQUIRE_SGLANG=1`` turns the skip into a failure (CI).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_core import envs
from mooncake_core.utils.net import listen_port  # noqa: F401 - the tests import it from here
from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.venvs import venv_python

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
INSTALL_HINT = "run scripts/install_sglang.sh (or set SGLANG_VENV to an SGLang 0.5.23 venv)"


def sglang_venv_python() -> str | None:
    """The SGLang venv's python if it exists and has sglang + this repo installed, else None."""
    py = str(venv_python("sglang"))  # $SGLANG_VENV, else the user's cache dir (mooncake_lab/venvs.py)
    if not os.access(py, os.X_OK):
        return None
    probe = ("import importlib.util as u; "
             "print(bool(u.find_spec('sglang')), bool(u.find_spec('mooncake_connectors')))")
    site = subprocess.run([py, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    return py if site.stdout.strip() == "True True" else None


@pytest.fixture(scope="session")
def sglang_python() -> str:
    py = sglang_venv_python()
    if py is None:
        msg = f"SGLang venv not found or incomplete: {INSTALL_HINT}"
        if envs.require("sglang"):
            pytest.fail(msg + " (MOONCAKE_REQUIRE_SGLANG=1)")
        pytest.skip(msg)
    return py


def sglang_env(**extra: str) -> dict[str, str]:
    """Environment for SGLang subprocesses: loopback only, quiet, short failure detection."""
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": shim_pythonpath(),
        "SGLANG_HOST_IP": "127.0.0.1",
        "PYTHONWARNINGS": "ignore",
        # decode notices a dead prefill after heartbeat_interval x max_failures (SGLang clamps to >= 2 s, >= 1)
        "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2",
        "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
        "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE": "4",
        "MC_TRANSFER_TIMEOUT": "20",
    })
    env.update(extra)
    return env


class Peer:
    """A child process that prints JSON event lines on stdout (tests/sglang/peer_*.py)."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: str):
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the child; closed in close()
        # stdin stays open until close(): a child may block on it to stay up (peer_hicache writer)
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     env=env, cwd=REPO, start_new_session=True)
        self.events: list[dict[str, Any]] = []
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._buf = b""

    def _pump(self) -> None:
        try:
            chunk = self.proc.stdout.read()
        except (BlockingIOError, ValueError):
            chunk = None
        if chunk:
            self._buf += chunk
            *lines, self._buf = self._buf.split(b"\n")
            for line in lines:
                line = line.strip()
                if line.startswith(b"{"):
                    self.events.append(json.loads(line))

    def wait_event(self, name: str, timeout: float) -> dict[str, Any]:
        """The first event called ``name``; fails with the child's log tail on timeout/exit."""
        deadline = time.monotonic() + timeout
        while True:
            self._pump()
            for ev in self.events:
                if ev.get("event") == name:
                    return ev
            if self.proc.poll() is not None:
                self._pump()
                for ev in self.events:
                    if ev.get("event") == name:
                        return ev
                raise AssertionError(f"{self.log_path}: exited ({self.proc.returncode}) before event "
                                     f"{name!r}; events={self.events}\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.log_path}: no event {name!r} within {timeout}s; "
                                     f"events={self.events}\n{self.tail()}")
            time.sleep(0.05)

    def tail(self, n: int = 3000) -> str:
        self._log.flush()
        with open(self.log_path, "rb") as f:
            return f.read()[-n:].decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)

    def close(self) -> None:
        self.kill()
        self.proc.stdin.close()
        self.proc.stdout.close()
        self._log.close()


@pytest.fixture
def peers(tmp_path) -> Iterator[Any]:
    """Start Peer processes; all are killed (by process group) at the end of the test."""
    started: list[Peer] = []

    def start(args: list[str], env: dict[str, str], name: str) -> Peer:
        p = Peer(args, env, str(tmp_path / f"{name}.log"))
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()
