"""Drive LMCache engine processes (``lmcache_peer.py``, in the LMCache venv) from the tests and
from ``bench/frameworks/bench_lmcache.py``.

Why a helper: every peer is a real process running LMCache 0.5.6's code against real
``mooncake_master`` processes; the driver must never hang on one (every read has a timeout,
a wedged peer is killed) and must leave no process behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from mooncake_core.utils.net import free_port, wait_for_port
from mooncake_core.utils.proc import readline_timeout, stop_process, thread_report
from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.venvs import venv_dir

HERE = Path(__file__).resolve().parent
PEER = HERE / "lmcache_peer.py"
INSTALL_HINT = "run scripts/install_lmcache.sh (after scripts/install_vllm.sh), or point LMCACHE_VENV at a venv with lmcache==0.5.6"
DEFAULT_VENV = str(venv_dir("vllm"))  # $VLLM_VENV, else the user's cache dir (mooncake_lab/venvs.py)


def lmcache_python() -> str | None:
    """The LMCache venv's python when lmcache and this repo import there, else None."""
    venv = os.environ.get("LMCACHE_VENV") or os.environ.get("VLLM_VENV") or DEFAULT_VENV
    py = Path(venv) / "bin" / "python"
    if not py.exists():
        return None
    probe = ("import importlib.util as u, sys; "
             "sys.exit(0 if u.find_spec('lmcache') and u.find_spec('mooncake_connectors') else 1)")
    ok = subprocess.run([str(py), "-c", probe], capture_output=True, timeout=60)
    return str(py) if ok.returncode == 0 else None


def peer_env(extra: dict[str, str] | None = None, *, pythonpath: str | None = None) -> dict[str, str]:
    """Environment of a peer: the checkout under test first on the path, a fixed hash seed
    (LMCache's chunk keys use Python's hash: equal only with equal seeds), one thread."""
    env = dict(os.environ, PYTHONPATH=pythonpath or shim_pythonpath(), PYTHONHASHSEED="0",
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.update(extra or {})
    return env


class LmcPeer:
    """One ``lmcache_peer.py`` process; ``cmd`` sends a command and returns its JSON answer."""

    def __init__(self, py: str, log_path: Path, *args: str, env: dict[str, str] | None = None,
                 ready_timeout: float | None = 120.0):
        """Start the peer; wait for it unless ``ready_timeout`` is None (then ``wait_ready``)."""
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([py, str(PEER), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, env=env or peer_env())
        self.ready: dict[str, Any] = {}
        if ready_timeout is not None:
            self.wait_ready(ready_timeout)

    def wait_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        """Peers start in parallel when created with ``ready_timeout=None`` and waited for here."""
        if not self.ready:
            self.ready = self._read(timeout)
        return self.ready

    def _read(self, timeout: float) -> dict[str, Any]:
        line = readline_timeout(self.proc, timeout, what=f"LMCache peer (log {self.log_path})")
        if not line:
            raise RuntimeError(f"LMCache peer exited with {self.proc.poll()}:\n{self.log_tail()}")
        return json.loads(line)

    def send(self, op: str, **kw: Any) -> None:
        """Send a command without waiting (``recv`` its answer): lets two peers work at once."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(dict(kw, op=op)) + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 120.0) -> dict[str, Any]:
        reply = self._read(timeout)
        if "error" in reply:
            raise RuntimeError(f"peer command failed: {reply['error']}\n{self.log_tail()}")
        return reply

    def cmd(self, op: str, timeout: float = 120.0, **kw: Any) -> dict[str, Any]:
        self.send(op, **kw)
        return self.recv(timeout)

    def log_text(self) -> str:
        self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 4000) -> str:
        return self.log_text()[-n:]

    def close(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        stop_process(self.proc, 5)
        self._log.close()


#: LMCache processes in the tests send no usage telemetry
LMC_ENV = {"LMCACHE_TRACK_USAGE": "false"}


def adapter_spec(master_addr: str, meta: str, **params: Any) -> str:
    """``--l2-adapter`` JSON loading our ``MooncakeStoreL2Adapter`` through LMCache's ``plugin`` type;
    by default the server lends no memory to the pool (``global_segment_size`` 0)."""
    return json.dumps({"type": "plugin", "module_path": "mooncake_connectors.lmcache.l2_adapter",
                       "class_name": "MooncakeStoreL2Adapter",
                       "adapter_params": {"master_server_address": master_addr, "metadata_server": meta,
                                          "local_hostname": "127.0.0.1", "global_segment_size": "0",
                                          "local_buffer_size": str(16 << 20), "mooncake_rpc_timeout": "2",
                                          **params}})


class MPServer:
    """LMCache's multiprocess cache server (``lmcache.v1.multiprocess.server``, unchanged) with an
    L2 adapter spec (``adapter_spec``); ``args``: more of its flags."""

    def __init__(self, py: str, log: Path, spec: str, *args: str, chunk_size: int = 64):
        self.py = py
        self.port = free_port()
        self.log = log
        with open(log, "ab") as f:
            self.proc = subprocess.Popen(
                [py, "-m", "lmcache.v1.multiprocess.server", "--host", "127.0.0.1", "--port", str(self.port),
                 "--chunk-size", str(chunk_size), "--l1-size-gb", "0.05", "--eviction-policy", "LRU",
                 "--disable-observability", "--l2-adapter", spec, *args],
                stdout=f, stderr=subprocess.STDOUT, env=peer_env(LMC_ENV))

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> MPServer:
        wait_for_port("127.0.0.1", self.port, 120, self.proc)
        return self

    def clear_l1(self) -> None:
        """Empty the server's L1 (LMCache's own ``clear`` request, forced): what it serves next
        comes from L2."""
        code = ("import sys; from lmcache.v1.multiprocess.transport.factory import RequestClientFactory as F; "
                "c = F.create(sys.argv[1]); c.clear(True).result(timeout=30); c.close()")
        subprocess.run([self.py, "-c", code, self.url], check=True, capture_output=True, timeout=120,
                       env=peer_env(LMC_ENV))

    def stop(self, grace: float = 30.0) -> None:
        """SIGINT: the server's own clean shutdown (its ``KeyboardInterrupt`` path closes the L2
        adapters). A server still running after ``grace`` seconds gets its threads' kernel view
        (``thread_report``: where each sleeps, which signals are pending or blocked) appended to
        its log -- the test then fails on the missing shutdown lines with the reason in the
        log's tail -- and is stopped with SIGTERM, then SIGKILL."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                report = thread_report(self.proc.pid)
                with open(self.log, "a") as f:
                    f.write(f"[MPServer.stop] the server did not exit within {grace:.0f} s of SIGINT; "
                            f"its threads:\n{report}\n")
        stop_process(self.proc, 10)
