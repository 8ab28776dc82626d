"""The processes of a chaos run: etcd members, masters, store clients -- started, killed,
paused, restarted and sampled (RSS, open fds), for either implementation.

Every process is a *slot* (``etcd0``, ``master1``, ``client3``) that keeps its history of
incarnations. A supervisor thread restarts any process that exited without the nemesis
asking (a crash, or a master that stepped down), and records it: those are findings too.
Waits are bounded; :meth:`Cluster.stop` always reaps everything.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

from mooncake_core.store.ha import LEADER_KEY
from mooncake_core.utils.log import get_logger
from mooncake_lab import repo_pythonpath
from mooncake_core.utils.net import free_port, wait_for_port

log = get_logger("mooncake.chaos.cluster")

WORKER = ["-m", "mooncake_lab.chaos.worker"]  # needs the checkout on PYTHONPATH (Cluster._env)
OURS_LEADER_KEY = LEADER_KEY  # the default cluster's key: the chaos masters run without --cluster_id
REF_VIEW_KEY = "mooncake-store/mooncake_cluster/master_view"


@dataclass
class Impl:
    """How to run one implementation: its Python (for the workers) and its master."""

    name: str  # "ours" | "ref"
    python: str
    master_cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def ours(cls) -> "Impl":
        return cls("ours", sys.executable, [sys.executable, "-m", "mooncake_core.store.master_main"])

    @classmethod
    def ref(cls, venv: str) -> "Impl":
        py, master = os.path.join(venv, "bin", "python"), os.path.join(venv, "bin", "mooncake_master")
        for p in (py, master):
            if not os.path.exists(p):
                raise FileNotFoundError(f"original Mooncake not found: {p} (pip install "
                                        f"mooncake-transfer-engine-non-cuda==0.3.13 into {venv})")
        env = {}
        # the wheel's store.so links libcudart.so.12, shipped by the nvidia-cuda-runtime wheel
        cudart = os.path.join(venv, "lib", f"python{_venv_pyver(venv)}", "site-packages", "nvidia",
                              "cuda_runtime", "lib")
        if os.path.isdir(cudart):
            env["LD_LIBRARY_PATH"] = cudart + os.pathsep + os.environ.get("LD_LIBRARY_PATH", "")
        return cls("ref", py, [master], env)


def _venv_pyver(venv: str) -> str:
    libdir = os.path.join(venv, "lib")
    for name in sorted(os.listdir(libdir)) if os.path.isdir(libdir) else []:
        if name.startswith("python"):
            return name[len("python"):]
    return "3.11"


@dataclass
class Life:
    """One incarnation of a slot."""

    incarnation: int
    pid: int
    t_start: int
    t_end: int | None = None
    rc: int | None = None
    cause: str = ""  # "killed", "crashed", "stopped", "exited"


class Slot:
    def __init__(self, name: str, kind: str, index: int, cmd: Callable[[int], list[str]],
                 env: dict[str, str], log_dir: str, piped: bool | None = None):
        self.name, self.kind, self.index = name, kind, index
        self.piped = kind == "client" if piped is None else piped  # JSON lines on stdout, stop = stdin EOF
        self.cmd, self.env, self.log_dir = cmd, env, log_dir
        self.proc: subprocess.Popen | None = None
        self.lives: list[Life] = []
        self.down = False  # held down by the nemesis: the supervisor must not restart it
        self.paused = False
        self.ready = threading.Event()
        self.progress = {"p": 0, "e": 0, "s": 0, "t": 0}
        self.done: dict[str, Any] | None = None
        self.info: dict[str, Any] = {}  # the process's "ready" message
        self._log = None

    @property
    def incarnation(self) -> int:
        return len(self.lives) - 1

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        inc = len(self.lives)
        if self._log:
            self._log.close()
        self._log = open(os.path.join(self.log_dir, f"{self.name}-i{inc}.log"), "wb")
        self.ready.clear()
        self.done = None
        self.progress = {"p": 0, "e": 0, "s": 0, "t": 0}
        piped = self.piped
        self.proc = subprocess.Popen(self.cmd(inc), env=self.env,
                                     stdin=subprocess.PIPE if piped else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE if piped else self._log,
                                     stderr=self._log, text=piped)
        self.lives.append(Life(inc, self.proc.pid, time.monotonic_ns()))
        self.paused = False
        if piped:
            threading.Thread(target=self._read_stdout, args=(self.proc,), daemon=True,
                             name=f"{self.name}-out").start()

    def _read_stdout(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if proc is not self.proc:
                return
            if "ready" in msg:
                self.info = msg
                self.ready.set()
            elif "p" in msg:
                self.progress = dict(msg, t=time.monotonic_ns())
            elif "done" in msg:
                self.done = msg

    def ended(self, cause: str) -> None:
        if self.lives and self.lives[-1].t_end is None:
            life = self.lives[-1]
            life.t_end = time.monotonic_ns()
            life.rc = self.proc.returncode if self.proc else None
            life.cause = cause

    def signal(self, sig: int) -> None:
        if self.alive():
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def close_stdin(self) -> None:
        """Ask a piped process to finish (its stdin reaches EOF)."""
        if self.alive() and self.proc.stdin:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def wait_or_kill(self, timeout: float) -> bool:
        """Wait for the process to exit; SIGKILL it after ``timeout``. True if it exited by itself."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)
            return False

    def close_log(self) -> None:
        if self._log:
            self._log.close()
            self._log = None


def proc_stats(pid: int) -> tuple[int, int] | None:
    """(RSS kB, open fds) of ``pid`` from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next((int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")), 0)
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return None


def _etcd_post(endpoint: str, path: str, body: dict, timeout: float = 1.0) -> dict:
    req = urllib.request.Request(f"http://{endpoint}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def etcd_get(endpoints: list[str], key: str) -> str | None:
    """Value of ``key`` from the first etcd member that answers (None: absent/unreachable)."""
    for ep in endpoints:
        try:
            kvs = _etcd_post(ep, "/v3/kv/range", {"key": base64.b64encode(key.encode()).decode()}).get("kvs")
        except OSError:
            continue
        return base64.b64decode(kvs[0]["value"]).decode(errors="replace") if kvs else None
    return None


@dataclass
class ClusterConfig:
    clients: int = 4
    threads: int = 2
    ha: bool = False
    #: where the HA masters elect their leader: "etcd" (etcd_members members) or "redis" (one
    #: redis-server, which also holds the Transfer Engine metadata; ours only)
    ha_backend: str = "etcd"
    etcd_members: int = 3
    segment: int = 16 << 20
    local_buffer: int = 16 << 20
    keys: int = 1000
    min_value: int = 1 << 10
    max_value: int = 256 << 10
    mix: str = ""
    rate: float = 0.0  # ops/s per load thread, 0 = unthrottled
    seed: int = 1
    lease_ttl_ms: int = 1000
    client_ttl_s: int = 5
    transfer_timeout_s: float = 10.0
    rpc_timeout_s: float = 5.0
    force_tcp: bool = True
    metadata: str = "auto"  # auto: master's HTTP server (single) / etcd (HA)
    stop_timeout_s: float = 30.0


class Cluster:
    """etcd (HA only) + masters + clients of one implementation, on ``host_ip``."""

    def __init__(self, impl: Impl, cfg: ClusterConfig, workdir: str, host_ip: str = "127.0.0.1",
                 client_ips: list[str] | None = None, exec_prefix: Callable[[int], list[str]] | None = None,
                 sample_every: float = 2.0):
        self.impl, self.cfg, self.dir = impl, cfg, workdir
        self.host_ip = host_ip
        self.client_ips = client_ips or [host_ip] * cfg.clients
        self.exec_prefix = exec_prefix or (lambda i: [])
        self.oplog_dir = os.path.join(workdir, "ops")
        self.log_dir = os.path.join(workdir, "logs")
        os.makedirs(self.oplog_dir, exist_ok=True)
        os.makedirs(self.log_dir, exist_ok=True)
        self.lock = threading.RLock()
        #: the coordination service's processes: etcd members, or the Redis server (--ha-backend redis)
        self.etcd: list[Slot] = []
        self.masters: list[Slot] = []
        self.clients: list[Slot] = []
        self.extra: list[Slot] = []  # other processes to sample and stop (the soak's TE load)
        self.sample_every = sample_every
        self.events: list[dict[str, Any]] = []  # unexpected exits and restarts
        self.samples: list[tuple[int, str, int, int, int]] = []  # (t, slot, pid, rss kB, fds)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.etcd_endpoints: list[str] = []
        self.redis_endpoint = ""
        self.master_ports: list[int] = []
        self.metrics_ports: list[int] = []
        #: ns at which a leading master of ours stopped serving for good (stepped down or
        #: died): the moment its state -- and any removal notice not yet delivered -- was lost
        self.leader_losses: list[int] = []
        self.leader_loss_spans: list[tuple[int, int]] = []  # (last seen leading, first seen not)

    # ------------------------------------------------------------------ addresses
    @property
    def master_addr(self) -> str:
        if self.cfg.ha and self.cfg.ha_backend == "redis":
            return f"redis://{self.redis_endpoint}"
        if self.cfg.ha:
            return "etcd://" + ";".join(self.etcd_endpoints)
        return f"{self.host_ip}:{self.master_ports[0]}"

    @property
    def metadata(self) -> str:
        m = self.cfg.metadata
        if m == "auto":
            m = (self.cfg.ha_backend if self.cfg.ha else "master")
        if m == "redis":
            if not (self.cfg.ha and self.cfg.ha_backend == "redis"):
                raise ValueError("--metadata redis needs --ha --ha-backend redis (Redis runs only then)")
            return f"redis://{self.redis_endpoint}"
        if m == "master":
            if self.cfg.ha:
                raise ValueError("--metadata master needs a single master (use etcd or p2p with --ha)")
            return f"http://{self.host_ip}:{self._http_port}/metadata"
        if m == "etcd":
            if not self.cfg.ha or self.cfg.ha_backend != "etcd":
                raise ValueError("--metadata etcd needs --ha (etcd runs only then)")
            return "etcd://" + ";".join(self.etcd_endpoints)
        if m == "p2p":
            return "P2PHANDSHAKE"
        raise ValueError(f"unknown metadata backend {m!r} (auto, master, etcd, redis, p2p)")

    # ------------------------------------------------------------------ start
    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.impl.env)
        env.update(extra or {})
        env["PYTHONPATH"] = repo_pythonpath(env.get("PYTHONPATH", ""))  # the workers import mooncake_lab
        return env

    def start(self, ready_timeout: float = 90.0) -> None:
        cfg = self.cfg
        if cfg.ha and cfg.ha_backend == "redis":
            if self.impl.name != "ours":
                raise ValueError("--ha-backend redis: the original's PyPI build elects on etcd only here")
            self._start_redis()
        elif cfg.ha:
            self._start_etcd()
        self._http_port = free_port(self.host_ip)
        n_masters = 2 if cfg.ha else 1
        self.master_ports = [free_port(self.host_ip) for _ in range(n_masters)]
        metrics = self.metrics_ports = [free_port(self.host_ip) for _ in range(n_masters)]
        for i in range(n_masters):
            args = [f"--port={self.master_ports[i]}", f"--rpc_address={self.host_ip}",
                    f"--metrics_port={metrics[i]}", f"--default_kv_lease_ttl={cfg.lease_ttl_ms}",
                    f"--client_ttl={cfg.client_ttl_s}"]
            if cfg.ha and cfg.ha_backend == "redis":
                args += ["--enable_ha", "--ha_backend_type=redis", f"--ha_backend_connstring={self.master_addr}"]
            elif cfg.ha:
                args += ["--enable_ha", f"--etcd_endpoints={';'.join(self.etcd_endpoints)}"]
            else:
                args += ["--enable_http_metadata_server=true", f"--http_metadata_server_host={self.host_ip}",
                         f"--http_metadata_server_port={self._http_port}"]
            slot = Slot(f"master{i}", "master", i, lambda inc, a=args: self.impl.master_cmd + a,
                        self._env(), self.log_dir)
            self.masters.append(slot)
            slot.start()
            if i == 0:
                wait_for_port(self.host_ip, self.master_ports[0], 60, slot.proc)
                if not cfg.ha:
                    wait_for_port(self.host_ip, self._http_port, 30, slot.proc)
                if cfg.ha:
                    self._wait_leader(30)
        for i in range(cfg.clients):
            self.clients.append(self._client_slot(i))
            self.clients[-1].start()
        deadline = time.monotonic() + ready_timeout
        for c in self.clients:
            while not c.ready.wait(0.5):
                if not c.alive():
                    raise RuntimeError(f"{c.name} exited with {c.proc.returncode} during start-up "
                                       f"(log {self.log_dir}/{c.name}-i0.log)")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{c.name} not ready after {ready_timeout:.0f}s "
                                       f"(log {self.log_dir}/{c.name}-i0.log)")
        loops = [self._supervise, self._sample_loop]
        if self.impl.name == "ours":
            loops.append(self._leader_watch)
        for target in loops:
            t = threading.Thread(target=target, daemon=True, name=target.__name__)
            t.start()
            self._threads.append(t)

    def _start_etcd(self) -> None:
        n = self.cfg.etcd_members
        ports = [(free_port(self.host_ip), free_port(self.host_ip)) for _ in range(n)]
        cluster = ",".join(f"e{i}=http://{self.host_ip}:{p}" for i, (_, p) in enumerate(ports))
        token = f"mcx-{os.getpid()}-{time.monotonic_ns()}"
        for i, (cport, pport) in enumerate(ports):
            data = os.path.join(self.dir, f"etcd{i}")
            cmd = ["etcd", "--name", f"e{i}", "--data-dir", data,
                   "--listen-client-urls", f"http://{self.host_ip}:{cport}",
                   "--advertise-client-urls", f"http://{self.host_ip}:{cport}",
                   "--listen-peer-urls", f"http://{self.host_ip}:{pport}",
                   "--initial-advertise-peer-urls", f"http://{self.host_ip}:{pport}",
                   "--initial-cluster", cluster, "--initial-cluster-token", token,
                   "--initial-cluster-state", "new", "--heartbeat-interval", "100",
                   "--election-timeout", "1000"]
            slot = Slot(f"etcd{i}", "etcd", i, lambda inc, c=cmd: c, self._env(), self.log_dir)
            self.etcd.append(slot)
            slot.start()
            self.etcd_endpoints.append(f"{self.host_ip}:{cport}")
        for i, slot in enumerate(self.etcd):
            wait_for_port(self.host_ip, ports[i][0], 30, slot.proc)
        deadline = time.monotonic() + 30
        while self.etcd_leader() is None:
            if time.monotonic() > deadline:
                raise TimeoutError("the etcd cluster elected no leader within 30 s")
            time.sleep(0.2)

    def _start_redis(self) -> None:
        port = free_port(self.host_ip)
        data = os.path.join(self.dir, "redis")
        os.makedirs(data, exist_ok=True)
        cmd = ["redis-server", "--port", str(port), "--bind", self.host_ip, "--save", "", "--appendonly", "no",
               "--dir", data, "--protected-mode", "no"]
        slot = Slot("redis0", "redis", 0, lambda inc, c=cmd: c, self._env(), self.log_dir)
        self.etcd.append(slot)
        slot.start()
        self.redis_endpoint = f"{self.host_ip}:{port}"
        wait_for_port(self.host_ip, port, 30, slot.proc)

    def _wait_leader(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.leader_master() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no master became leader within {timeout:.0f}s "
                                   f"(logs in {self.log_dir})")
            time.sleep(0.2)

    def _client_slot(self, i: int) -> Slot:
        cfg = self.cfg

        def cmd(inc: int) -> list[str]:
            args = [self.impl.python, *WORKER, "--impl", self.impl.name, "--master", self.master_addr,
                    "--meta", self.metadata, "--host", self.client_ips[i], "--segment", str(cfg.segment),
                    "--local-buffer", str(cfg.local_buffer), "--threads", str(cfg.threads),
                    "--keys", str(cfg.keys), "--min-value", str(cfg.min_value),
                    "--max-value", str(cfg.max_value), "--seed", str(cfg.seed), "--writer", str(i),
                    "--incarnation", str(inc), "--logdir", self.oplog_dir,
                    "--stop-timeout", str(cfg.stop_timeout_s)]
            if cfg.mix:
                args += ["--mix", cfg.mix]
            if cfg.rate:
                args += ["--rate", str(cfg.rate)]
            return self.exec_prefix(i) + args

        env = {"MC_TRANSFER_TIMEOUT": str(cfg.transfer_timeout_s), "MC_STORE_RPC_TIMEOUT": str(cfg.rpc_timeout_s),
               "PYTHONUNBUFFERED": "1"}
        if cfg.force_tcp:
            env["MC_FORCE_TCP"] = "1"
        return Slot(f"client{i}", "client", i, cmd, self._env(env), self.log_dir)

    # ------------------------------------------------------------------ who leads
    def leader_master(self) -> Slot | None:
        if not self.cfg.ha:
            return self.masters[0] if self.masters and self.masters[0].alive() else None
        if self.cfg.ha_backend == "redis":
            from mooncake_core.store.ha import leader_resolver

            resolve = leader_resolver(self.master_addr)
            assert resolve is not None
            try:
                val = resolve(1.0)
            except ConnectionError:
                val = None
        else:
            key = OURS_LEADER_KEY if self.impl.name == "ours" else REF_VIEW_KEY
            val = etcd_get(self.etcd_endpoints, key)
        if not val:
            return None
        for m, port in zip(self.masters, self.master_ports):
            if f"{self.host_ip}:{port}" in val and m.alive():
                return m
        return None

    def etcd_leader(self) -> Slot | None:
        for slot, ep in zip(self.etcd, self.etcd_endpoints):
            if not slot.alive() or slot.paused:
                continue
            try:
                st = _etcd_post(ep, "/v3/maintenance/status", {}, timeout=1.0)
            except OSError:
                continue
            leader = st.get("leader")
            for s2, ep2 in zip(self.etcd, self.etcd_endpoints):
                if not s2.alive():
                    continue
                try:
                    if _etcd_post(ep2, "/v3/maintenance/status", {}, timeout=1.0)["header"]["member_id"] == leader:
                        return s2
                except (OSError, KeyError):
                    continue
            return None
        return None

    def _is_leader(self, i: int) -> bool | None:
        """Our master's ``mooncake_master_is_leader`` gauge (it turns 0 the moment the master
        stops serving); None when it does not answer (paused, dead, starting)."""
        try:
            with urllib.request.urlopen(f"http://{self.host_ip}:{self.metrics_ports[i]}/metrics", timeout=0.5) as r:
                text = r.read().decode(errors="replace")
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("mooncake_master_is_leader "):
                return float(line.split()[1]) > 0
        return None

    def _leader_watch(self, every: float = 0.2) -> None:
        """Record when a master that was serving stopped serving for good: seen not leading
        any more, or its process replaced. A pause it comes back from still leading is none."""
        seen: dict[int, tuple[int, int]] = {}  # master index -> (pid, last ns seen leading)
        while not self._stop.wait(every):
            for i, m in enumerate(self.masters):
                pid = m.lives[-1].pid if m.lives else 0
                last = seen.get(i)
                if last is not None and last[0] != pid:  # killed / exited and restarted
                    self.leader_losses.append(last[1])
                    self.leader_loss_spans.append((last[1], time.monotonic_ns()))
                    del seen[i]
                    last = None
                state = self._is_leader(i) if m.alive() and not m.paused else None
                if state:
                    seen[i] = (pid, time.monotonic_ns())
                elif state is False and last is not None:
                    self.leader_losses.append(last[1])
                    self.leader_loss_spans.append((last[1], time.monotonic_ns()))
                    del seen[i]

    def master_identity(self) -> tuple:
        """Changes whenever a master process changes or another one leads."""
        lead = self.leader_master()
        return (lead.name if lead else None, lead.pid if lead else None,
                tuple(len(m.lives) for m in self.masters))

    # ------------------------------------------------------------------ faults
    def kill(self, slot: Slot, hold_down: bool = True) -> None:
        with self.lock:
            slot.down = hold_down
            if slot.paused:
                slot.signal(signal.SIGCONT)
            slot.signal(signal.SIGKILL)
            if slot.proc:
                try:
                    slot.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
            slot.ended("killed")

    def restart(self, slot: Slot) -> None:
        with self.lock:
            if slot.alive():
                return
            slot.start()
            slot.down = False

    def pause(self, slot: Slot) -> None:
        with self.lock:
            slot.signal(signal.SIGSTOP)
            slot.paused = True

    def resume(self, slot: Slot) -> None:
        with self.lock:
            slot.signal(signal.SIGCONT)
            slot.paused = False

    # ------------------------------------------------------------------ background
    def _supervise(self) -> None:
        while not self._stop.wait(0.2):
            for slot in self.etcd + self.masters + self.clients:
                with self.lock:
                    if self._stop.is_set() or slot.down or slot.proc is None or slot.proc.poll() is None:
                        continue
                    rc = slot.proc.returncode
                    cause = "stepped down" if (slot.kind == "master" and rc == 3) else "crashed"
                    slot.ended(cause)
                    self.events.append({"slot": slot.name, "event": cause, "rc": rc,
                                        "t": time.monotonic_ns(), "incarnation": slot.incarnation})
                    log.warning("process exited unexpectedly; restarting it",
                                extra={"slot": slot.name, "rc": rc, "cause": cause})
                    slot.start()

    def sample(self) -> None:
        t = time.monotonic_ns()
        for slot in self.etcd + self.masters + self.clients + self.extra:
            pid = slot.pid
            st = proc_stats(pid) if pid else None
            if st and st[0] > 0:  # no VmRSS: the process is exiting
                self.samples.append((t, slot.name, pid, st[0], st[1]))

    def _sample_loop(self) -> None:
        self.sample()
        while not self._stop.wait(self.sample_every):
            self.sample()

    # ------------------------------------------------------------------ stop
    def stop_clients(self) -> None:
        """Ask every client to finish (stdin closed), wait, kill the ones that do not."""
        with self.lock:
            for c in self.clients:
                c.down = True  # an exit from here on is the one we asked for
        for c in self.clients:
            if c.paused:
                self.resume(c)
            c.close_stdin()
        deadline = time.monotonic() + self.cfg.stop_timeout_s + 20
        for c in self.clients:
            if c.proc is None:
                continue
            if c.wait_or_kill(max(0.1, deadline - time.monotonic())):
                c.ended("stopped")
            else:
                log.warning("client did not stop; killed it", extra={"slot": c.name})
                self.events.append({"slot": c.name, "event": "did not stop", "t": time.monotonic_ns()})
                c.ended("killed at stop")

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        with self.lock:
            if any(c.alive() for c in self.clients):
                self.stop_clients()
            for slot in self.extra:
                slot.close_stdin()
            for slot in self.extra:
                slot.wait_or_kill(20)
                slot.ended("stopped")
            for slot in self.masters + self.etcd:
                if slot.paused:
                    slot.signal(signal.SIGCONT)
                slot.signal(signal.SIGTERM)
                slot.wait_or_kill(10)
                slot.ended("stopped")
            for slot in self.etcd + self.masters + self.clients + self.extra:
                slot.close_log()
