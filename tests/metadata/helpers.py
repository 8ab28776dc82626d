"""Helpers shared by the metadata tests (server subprocess, raw HTTP, random values)."""

from __future__ import annotations

import os
import random
import selectors
import shutil
import subprocess
import time
import urllib.error
import urllib.request


def random_descriptor(segment: str) -> dict:
    """A segment descriptor shaped like the engine's (random, never zeros)."""
    rng = random.Random()
    return {
        "name": segment,
        "protocol": rng.choice(["tcp", "rdma", "shm"]),
        "tcp_data_port": rng.randint(1024, 65535),
        "buffers": [{"name": f"cpu:{i}", "addr": rng.getrandbits(47) | 1,
                     "length": rng.randint(1, 1 << 34)} for i in range(rng.randint(1, 6))],
        "nonce": rng.randbytes(24).hex(),
        "ratio": rng.random(),
        "tags": [rng.choice(["a", "ü", "\\", "\"", "/"]) for _ in range(5)],
    }


def server_command(python_exe: str) -> list[str]:
    """The installed console script next to the interpreter (what users run)."""
    script = os.path.join(os.path.dirname(python_exe), "mooncake_http_metadata_server")
    if os.path.exists(script):
        return [script]
    found = shutil.which("mooncake_http_metadata_server")
    assert found, "console script mooncake_http_metadata_server not installed (pip install -e .)"
    return [found]


class ServerProcess:
    """A ``mooncake_http_metadata_server`` subprocess started with ``--port 0``."""

    def __init__(self, python_exe: str, *extra: str, env: dict | None = None,
                 port_flag: bool = True):
        self.cmd = server_command(python_exe) + (["--port", "0"] if port_flag else []) + list(extra)
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={**os.environ, **(env or {})})
        self.url = self._read_url(timeout=30)
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])

    def _read_url(self, timeout: float) -> str:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        buf = b""
        while time.monotonic() < deadline:
            if sel.select(timeout=0.2):
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
                for line in buf.decode(errors="replace").splitlines():
                    if "listening on " in line:
                        return line.split("listening on ", 1)[1].strip()
            elif self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"server {self.cmd} did not start: stdout={buf!r} "
                           f"stderr={self.proc.stderr.read()!r}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def http_call(method: str, url: str, body: bytes | None = None,
              headers: dict | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    """A raw HTTP request (status, body) that does not raise on 4xx/5xx."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
