"""A real ``mooncake_master`` subprocess for tests of any area (store, proxy, connectors)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from mooncake_core.errors import MooncakeError
from mooncake_core.store.master_client import MasterClient
from mooncake_core.utils.proc import stop_process


class MasterProc:
    """A running mooncake_master subprocess."""

    def __init__(self, args: list[str], port: int, metrics_port: int, log_path: str):
        self.args = args
        self.port = port
        self.metrics_port = metrics_port
        self.addr = f"127.0.0.1:{port}"
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "mooncake_core.store.master_main", *args],
                                     stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 20.0) -> "MasterProc":
        deadline = time.monotonic() + timeout
        with MasterClient(self.addr, timeout=1.0) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mooncake_master exited with {self.proc.returncode}:\n{self.log()}")
                try:
                    c.ping()
                    return self
                except MooncakeError:
                    time.sleep(0.1)
        raise TimeoutError(f"mooncake_master not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-4000:]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        stop_process(self.proc, 10, sig)
        self._log.close()
