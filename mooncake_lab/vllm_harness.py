"""Start and stop real vLLM (CPU) servers for the connector tests and benches.

Why a helper: every vLLM server costs ~2 GB and ~30 s to start on 2 cores, so tests start each
one once per module, pin it to one core, and make sure it is gone afterwards (its engine core
runs in a child process: we start a new session and kill the whole process group).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.venvs import venv_python

from mooncake_core.utils.net import free_port  # noqa: F401 - re-exported: distinct per process (see net.py)
from mooncake_core.utils.proc import stop_process

REPO = Path(__file__).resolve().parents[1]
#: Prefill lease in the P2P tests: long enough for a decode on a busy 2-core box to start its
#: read, short enough for the lease-expiry test to wait it out.
LEASE_S = 12.0
#: The decode's ``want_retry_s`` in the P2P tests: a lost ``ready`` costs this long.
WANT_RETRY_S = 1.0
#: Transfer ids the P2P tests' prefill (corrupting_connector.py) loses the first ``ready`` of.
DROP_READY = "mc-test-drop-ready-"


def vllm_python() -> str | None:
    """The vLLM venv's python, or None when it is not installed."""
    py = venv_python("vllm")  # $VLLM_VENV, else the user's cache dir (mooncake_lab/venvs.py)
    if not py.exists():
        return None
    ok = subprocess.run([str(py), "-c", "import importlib.util as u, sys; "
                         "sys.exit(0 if u.find_spec('vllm') and u.find_spec('mooncake_connectors') else 1)"],
                        capture_output=True, timeout=60)
    return str(py) if ok.returncode == 0 else None


def make_tiny_model(py: str, out_dir: Path, *args: str) -> Path:
    """scripts/make_tiny_model.py into ``out_dir`` (``args``: its flags, e.g. ``--arch deepseek_v2``)."""
    if not (out_dir / "config.json").exists():
        subprocess.run([py, str(REPO / "scripts" / "make_tiny_model.py"), *args, str(out_dir)], check=True,
                       capture_output=True, timeout=300)
    return out_dir


class HTTPStatusError(RuntimeError):
    def __init__(self, status: int, msg: str):
        super().__init__(msg)
        self.status = status


def http_json(url: str, body: dict | None = None, timeout: float = 120.0) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:  # keep the server's explanation in the test failure
        raise HTTPStatusError(e.code, f"{url}: HTTP {e.code}: {e.read()[:2000]!r}") from None


def http_text(url: str, timeout: float = 30.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def metric(text: str, name: str) -> float:
    """Sum of all samples of a Prometheus metric (any labels) in an exposition text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class VllmServer:
    py: str
    model: Path
    port: int
    cpu: int
    log_path: Path
    kv_config: dict | None = None
    env: dict = field(default_factory=dict)
    args: list = field(default_factory=list)  # extra server flags (--kv-events-config; tensor parallelism: tp_args)
    #: confine the whole server (API server, engine core, worker) to core ``cpu``, not only the
    #: worker's OpenMP threads (benches: keeps one instance's idle-time spinning off the other's core)
    pin_all: bool = False
    dtype: str = "float32"  # the MLA model runs bf16 (vLLM CPU's MLA path)
    block_size: int = 32  # vLLM CPU's MLA kernel takes 16 only
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "VllmServer":
        cmd = [self.py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
               "--served-model-name", "tiny", "--dtype", self.dtype, "--enforce-eager", "--max-model-len", "512",
               "--block-size", str(self.block_size), "--kv-cache-memory-bytes", "134217728", "--host", "127.0.0.1",
               "--port", str(self.port), "--max-num-seqs", "16"]
        if self.kv_config is not None:
            cmd += ["--kv-transfer-config", json.dumps(self.kv_config)]
        cmd += [str(a) for a in self.args]
        env = dict(os.environ)
        env.update({"VLLM_CPU_OMP_THREADS_BIND": str(self.cpu), "VLLM_LOGGING_LEVEL": "INFO",
                    "PYTHONUNBUFFERED": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                    "PYTHONPATH": shim_pythonpath()})  # the servers run the checkout under test
        env.update(self.env)
        self._log = open(self.log_path, "wb")
        cpus = {self.cpu % max(1, os.cpu_count() or 1)}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True,
                                     preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if self.pin_all else None)
        return self

    def wait_healthy(self, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server on port {self.port} exited with {self.proc.returncode}; "
                                   f"log tail:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        raise TimeoutError(f"vLLM server on port {self.port} not healthy after {timeout:.0f} s; "
                           f"log tail:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def connector_log(self, n: int = 40) -> str:
        """The last ``n`` lines this server logged about KV transfer or trouble (our connectors'
        and store client's lines, errors, tracebacks -- not vLLM's start-up warnings): what an
        assertion about loads, saves or hits needs to say why it failed."""
        keys = ("Mooncake", "mooncake.", "mooncake_core", "master", " ERROR ", "Traceback", "Error:")
        lines = [ln for ln in self.log_text().splitlines() if any(k in ln for k in keys)]
        return "\n".join(lines[-n:])

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        try:  # the engine-core child may outlive the API server: kill the whole group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None
        self._log.close()

    def kill(self) -> None:
        """SIGKILL the whole server (failure-path tests)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)


def start_all(servers: list[VllmServer], timeout: float = 240.0) -> None:
    """Start servers together (their start-ups overlap) and wait until all are healthy."""
    for s in servers:
        s.start()
    try:
        with ThreadPoolExecutor(len(servers)) as ex:
            list(ex.map(lambda s: s.wait_healthy(timeout), servers))
    except BaseException:
        for s in servers:
            s.stop()
        raise


@contextmanager
def serving(servers: list[VllmServer], what: str, timeout: float = 240.0) -> Iterator[list[VllmServer]]:
    """``start_all`` (printing how long ``what`` took to be healthy), then yield the servers and
    always stop them: a module fixture's whole life of its servers."""
    t0 = time.monotonic()
    start_all(servers, timeout=timeout)
    print(f"{what} healthy in {time.monotonic() - t0:.1f} s")
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


def tp_args(tp: int, pin: bool = False) -> tuple[list[str], dict]:
    """(server flags, env) of ``tensor_parallel_size`` ``tp`` on vLLM CPU: one worker process per
    rank (multiprocessing executor, gloo), one OpenMP thread each.

    ``pin`` puts rank r's threads on core r mod the cores (``VLLM_CPU_OMP_THREADS_BIND``, what a
    deployment with cores to spare does). Unpinned is for tests: with three servers' five TP
    workers on 2 cores a worker pinned next to a spinning one (vLLM's readers spin for 1 s after
    each message) could not run, nor could our rpc thread get its GIL to answer a peer -- notify
    round trips of ~1 s, and once a decode rank held up past the prefill's lease (CI); unpinned,
    the kernel moves it to the other core."""
    if tp == 1:
        return [], {}
    flags = ["--tensor-parallel-size", str(tp), "--distributed-executor-backend", "mp"]
    if not pin:
        return flags, {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    return flags, {"VLLM_CPU_OMP_THREADS_BIND": "|".join(str(r % max(1, os.cpu_count() or 1)) for r in range(tp))}


def start_proxy(prefill: VllmServer, decode: VllmServer, handoff: str, log: Path,
                bootstrap: int | None = None, timeout: float = 60.0,
                extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """Our ``mooncake_proxy`` in front of one prefill and one decode; returns (process, url) once it
    answers ``/v1/models``. ``handoff`` is the proxy's ``--handoff`` (``mooncake`` needs ``bootstrap``),
    ``extra`` more proxy flags."""
    port = free_port()
    if handoff == "mooncake":
        inst = ["--prefill", prefill.url, str(bootstrap), "--decode", decode.url]
    else:
        inst = ["--prefiller-hosts", "127.0.0.1", "--prefiller-ports", str(prefill.port),
                "--decoder-hosts", "127.0.0.1", "--decoder-ports", str(decode.port)]
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", str(port),
                             *inst, "--handoff", handoff, *extra], stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            http_json(url + "/v1/models", timeout=5)
            return proc, url
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"proxy did not start; see {log}")
            time.sleep(0.5)


def stop_proxy(proc: subprocess.Popen) -> None:
    stop_process(proc, 15)


def p2p_config(role: str, **extra) -> dict:
    cfg = {"kv_connector": "MooncakeCoreConnector", "kv_role": role,
           "kv_connector_extra_config": {"local_hostname": "127.0.0.1", **extra}}
    return cfg


def completion(url: str, prompt, max_tokens: int = 16, kv_transfer_params: dict | None = None,
               timeout: float = 120.0) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, "ignore_eos": True}
    if kv_transfer_params is not None:
        body["kv_transfer_params"] = kv_transfer_params
    return http_json(url + "/v1/completions", body, timeout=timeout)


def greedy_tokens(url: str, prompt, max_tokens: int, timeout: float = 300.0) -> list[int]:
    """The token ids a server (or a proxy in front of one) generates greedily for ``prompt``."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True,
            "ignore_eos": True}
    return http_json(url + "/v1/completions", body, timeout=timeout)["choices"][0]["token_ids"]


def proxied_vs_own(decode: "VllmServer", url: str, prompt, max_tokens: int) -> tuple[list[int], list[int], float]:
    """(greedy tokens for ``prompt`` through ``url`` -- a proxy handing off to ``decode`` --, the
    decode's own computation, the external prefix-cache hits the decode counted for the former)."""
    want = own_tokens(decode, prompt, max_tokens)
    hits0 = metric(http_text(decode.url + "/metrics"), "vllm:external_prefix_cache_hits_total")
    got = greedy_tokens(url, prompt, max_tokens)
    return got, want, metric(http_text(decode.url + "/metrics"), "vllm:external_prefix_cache_hits_total") - hits0


def pulled_reads(log_text: str) -> list[tuple[int, int]]:
    """(blocks, bytes) of every request a P2P decode pulled, in order, from its ``kv pulled`` log lines."""
    return [(int(b), int(nb)) for b, nb in re.findall(r"kv pulled request=\S+ transfer=\S+ blocks=(\d+) bytes=(\d+)",
                                                        log_text)]


def wait_prefill_freed(prefill: "VllmServer", timeout: float = 30.0) -> None:
    """Wait until the prefill holds no KV blocks (the decode confirmed; long before the lease)."""
    wait_until(lambda: metric(http_text(prefill.url + "/metrics"), "vllm:kv_cache_usage_perc") == 0.0, timeout,
               "prefill KV usage back to 0 after the decode's confirmation")


def ranks_that_pulled(decode: "VllmServer", transfer_id: str, ranks: int, timeout: float = 15.0) -> int:
    """How many of the decode's ranks logged ``kv pulled`` for ``transfer_id``, waiting up to
    ``timeout`` for ``ranks`` of them (a rank's line may reach the log a moment after the
    completion returned)."""
    pattern = re.compile(r"kv pulled request=\S+ transfer=" + re.escape(transfer_id) + " ")
    deadline = time.monotonic() + timeout
    while True:
        n = len(pattern.findall(decode.log_text()))
        if n >= ranks or time.monotonic() > deadline:
            return n
        time.sleep(0.1)


def corrupted_handoff(prefill: "VllmServer", decode: "VllmServer", prompt, max_tokens: int,
                      ranks: int = 1) -> tuple[dict, list[int], list[int]]:
    """The tests' negative control: hand ``prompt`` off with the marker that makes the decode's
    ``CorruptingMooncakeConnector`` (tests/vllm/corrupting_connector.py) overwrite the received
    blocks with noise; returns (the prefill's params, the decode's greedy tokens, the decode's own
    computation of the prompt).

    First it checks that each of the decode's ``ranks`` pulled the KV: a failed read is
    recomputed (``kv_load_failure_policy``), and the output then equals the decode's own for
    another reason than a decode ignoring what it received -- the AssertionError says which."""
    want = own_tokens(decode, prompt, max_tokens)
    params = completion(prefill.url, prompt, 1, {"do_remote_decode": True})["kv_transfer_params"]
    got = completion(decode.url, prompt, max_tokens, dict(params, mooncake_test_corrupt=True),
                     timeout=300)["choices"][0]["token_ids"]
    tid = params["mooncake_transfer_id"]
    n = ranks_that_pulled(decode, tid, ranks)
    assert n == ranks, (f"transfer {tid}: {n} of {ranks} decode ranks pulled the KV (the noise went nowhere); "
                        f"connector log of the decode:\n{decode.connector_log()}\nof the prefill:\n"
                        f"{prefill.connector_log()}")
    return params, got, want


def prompt_ids(seed: int, n: int = 200) -> list[int]:
    """A reproducible random prompt of token ids (none of the tiny model's special ids 0-2)."""
    rng = random.Random(seed)
    return [rng.randrange(3, 300) for _ in range(n)]


def wait_until(pred, timeout: float, what: str, step: float = 0.25):
    """Poll ``pred`` until truthy (returned) or ``timeout`` s passed (AssertionError naming ``what``)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last value {last!r})")


def own_tokens(server: VllmServer, prompt, max_tokens: int) -> list[int]:
    """The server's own computation of a prompt: a cache salt changes every prefix-cache key,
    vLLM's and the connectors', so nothing is reused."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, "ignore_eos": True, "cache_salt": uuid.uuid4().hex}
    return http_json(server.url + "/v1/completions", body)["choices"][0]["token_ids"]


def reset_prefix_cache(server: VllmServer, timeout: float = 30.0) -> None:
    """Empty vLLM's own prefix cache (needs ``VLLM_SERVER_DEV_MODE=1``), so a repeated prefix can
    only come from a connector; vLLM refuses while blocks are held (a save still running)."""
    deadline = time.monotonic() + timeout
    while not http_json(server.url + "/reset_prefix_cache", {}).get("success"):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"vLLM on port {server.port} kept refusing to reset its prefix cache")
        time.sleep(0.25)


if __name__ == "__main__":  # manual smoke: python -m mooncake_lab.vllm_harness
    print(vllm_python(), file=sys.stderr)
