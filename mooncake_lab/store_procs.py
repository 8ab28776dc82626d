"""Helpers for the store client tests: a real ``mooncake_master`` process (with its embedded
HTTP metadata server) and real client processes (``store_worker.py``) driven over pipes."""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import time
from typing import Any

import numpy as np

from mooncake_core.utils.net import free_port, wait_for_port
from mooncake_core.utils.proc import stop_process

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "store_worker.py")
OLDER_MASTER = os.path.join(HERE, "older_master.py")


def payload(seed: int, size: int) -> bytes:
    """The bytes a worker generates for (seed, size): random, never zeros."""
    return np.random.default_rng(seed).bytes(size)


def sha(b: Any) -> str:
    return hashlib.sha256(b).hexdigest()


class Master:
    """A ``mooncake_master`` subprocess on fixed ports (so it can be restarted in place)."""

    def __init__(self, python_exe: str, tmpdir: str, *, http: bool = True, **flags: Any):
        self.python_exe = python_exe
        self.http = http
        self.port = free_port()
        self.http_port = free_port()
        self.metrics_port = free_port()
        self.flags = flags
        self.log_path = os.path.join(tmpdir, f"master-{self.port}.log")
        self.proc: subprocess.Popen | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def meta(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/metadata"

    def main_args(self) -> list[str]:
        """How the master program is started (after the python executable)."""
        return ["-m", "mooncake_core.store.master_main"]

    def start(self) -> Master:
        args = [self.python_exe, *self.main_args(),
                f"--port={self.port}", "--rpc_address=127.0.0.1",
                f"--metrics_port={self.metrics_port}"]
        if self.http:
            args += ["--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
                     f"--http_metadata_server_port={self.http_port}"]
        for k, v in self.flags.items():
            args.append(f"--{k}={str(v).lower() if isinstance(v, bool) else v}")
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        if not self.flags.get("enable_ha"):
            wait_for_port("127.0.0.1", self.port, 30, self.proc)
            self.wait_ready(30)
        if self.http:
            wait_for_port("127.0.0.1", self.http_port, 30, self.proc)
        return self

    def wait_ready(self, timeout: float) -> None:
        """Until the master answers a ping (a bound port is not yet a serving master)."""
        from mooncake_core.errors import MooncakeError
        from mooncake_core.store.master_client import MasterClient

        deadline = time.monotonic() + timeout
        with MasterClient(self.addr, timeout=1.0) as c:
            while True:
                try:
                    c.ping()
                    return
                except MooncakeError:
                    if time.monotonic() > deadline or (self.proc and self.proc.poll() is not None):
                        raise TimeoutError(f"master {self.addr} not answering:\n{self.log_tail()}") from None
                    time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None:
            stop_process(self.proc, 10, sig)
        self.proc = None

    def log_tail(self) -> str:
        try:
            with open(self.log_path) as f:
                return f.read()[-3000:]
        except OSError:
            return ""


class OlderMaster(Master):
    """A ``Master`` that does not know the request types ``forget`` (``older_master.py``): how
    a master of an older release answers RPCs added since."""

    def __init__(self, python_exe: str, tmpdir: str, forget: list[str], **flags: Any):
        super().__init__(python_exe, tmpdir, **flags)
        self.forget = forget

    def main_args(self) -> list[str]:
        return [OLDER_MASTER, ",".join(self.forget)]


class Worker:
    """A store client process with its own segment, answering JSON-line commands."""

    def __init__(self, python_exe: str, master: Any, segment: int, offload_dir: str = "", *,
                 prefix: list[str] | None = None, env: dict[str, str] | None = None):
        """``master``: a Master, or any object with ``addr`` and ``meta`` (e.g. etcd:// ones).
        ``prefix``: run the worker under it (e.g. ``ip netns exec NS``); ``env``: extra variables."""
        args = [*(prefix or []), python_exe, WORKER, master.addr, master.meta, str(segment)]
        if offload_dir:
            args.append(offload_dir)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1, env=env)
        ready = self._read(60)
        assert ready.get("rc") == 0, f"worker setup failed: {ready}"
        self.hostname: str = ready["ready"]

    def _read(self, timeout: float) -> dict:
        assert self.proc.stdout is not None
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            raise TimeoutError(f"worker {self.proc.pid} gave no answer within {timeout}s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.proc.pid} exited (code {self.proc.poll()})")
        return json.loads(line)

    def cmd(self, timeout: float = 60, **cmd: Any) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def call(self, method: str, *args: Any) -> Any:
        return self.cmd(op="call", method=method, args=list(args))["result"]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.cmd(op="close", timeout=20)
            except (TimeoutError, RuntimeError, BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_mooncake_client(python_exe: str, master_addr: str, metadata_server: str, port: int, log_path: str, *,
                          segment: str = "256MB", http_port: int | None = None) -> subprocess.Popen:
    """This checkout's ``mooncake_client`` (the node's store service) on ``port``, mounted on the
    master at ``master_addr``; returns once it accepts dummies."""
    from mooncake_lab import repo_pythonpath

    args = [python_exe, "-m", "mooncake_core.store.real_client_main", f"--port={port}", "--host=127.0.0.1",
            f"--master_server_address={master_addr}", f"--metadata_server={metadata_server}",
            f"--global_segment_size={segment}", "--enable_http_server",
            f"--http_port={http_port if http_port is not None else free_port()}"]
    with open(log_path, "ab") as log:
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=repo_pythonpath()))
    wait_for_port("127.0.0.1", port, 60, p)
    return p


def make_client(master: Master, segment: int = 0, **extra: Any):
    """A store client inside the test process (the 'client without a segment' by default)."""
    from mooncake_core.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    cfg = {"local_hostname": "127.0.0.1", "metadata_server": master.meta,
           "global_segment_size": segment, "local_buffer_size": 16 << 20, "protocol": "tcp",
           "master_server_addr": master.addr, **extra}
    rc = s.setup(cfg)
    assert rc == 0, f"setup failed with {rc}; master log:\n{master.log_tail()}"
    return s


def restart_master(m: Any, segments: int = 1, hold_s: float = 1.0) -> None:
    """Restart master ``m``, wait until ``segments`` segments are re-mounted, then ``hold_s``
    more (past its recovery hold: within it nothing is allocated)."""
    from mooncake_core.store.master_client import MasterClient

    m.stop()
    m.start()
    deadline = time.monotonic() + 20
    with MasterClient(m.addr, timeout=2.0) as mc:
        while mc.ping().num_segments < segments:  # the owners re-mounted their segments
            assert time.monotonic() < deadline, f"segment never re-mounted\n{m.log_tail()}"
            time.sleep(0.1)
    time.sleep(hold_s)


def wait_stopped(pid: int, limit: float = 10.0) -> None:
    """kill() returns before the target stops: on a loaded machine a thread of it can still
    answer a request, so wait until the kernel reports every thread stopped (state T)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rpartition(")")[2].split()[0])
            except FileNotFoundError:
                continue
        if states and all(st in ("T", "t") for st in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} did not stop within {limit}s of SIGSTOP")
