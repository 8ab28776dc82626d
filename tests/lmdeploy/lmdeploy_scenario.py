"""Drive one DistServe scenario inside a loopback-only network namespace; print what happened.

Started by tests/lmdeploy/test_lmdeploy_pd.py as ``unshare -n <lmdeploy venv python> lmdeploy_scenario.py
NAME --logdir DIR``. It brings ``lo`` up, starts the real ``lmdeploy serve proxy --serving-strategy
DistServe`` through our launcher and node processes (lmdeploy_node.py), sends completions through
the proxy, and prints one JSON line ``{"facts": {...}}``: responses, timings, node states, block
digests. It decides nothing; the pytest side asserts on the facts.

Scenarios:
  ours      our backend on both sides, decode with LMDEPLOY_USE_ASYNC_MIGRATION=1 (the mode in which
            LMDeploy's own backend never returns); sequential and concurrent requests, the
            free-cache route, one engine per process.
  failures  decode on forced tcp with a 4 s deadline: prefill frozen mid-migration (deadline),
            prefill killed mid-migration, a replacement prefill, a prefill whose engine address is
            unreachable, and a request after that.
  mixed     LMDeploy's own MooncakeBackend on our engine (stand-in ibv_devices on PATH and a default
            route through lo, which it needs) for both sides, then each side paired with ours.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
NODE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "mooncake_lab", "lmdeploy_node.py")
FAKE_IBV = os.path.join(HERE, "fake_ibv")
MODEL = "tiny-standin"
PY = sys.executable


def lo_up(default_route: bool) -> None:
    """Bring loopback up in the fresh namespace (and optionally a default route through it)."""
    ip = shutil.which("ip") or "/sbin/ip"
    subprocess.run([ip, "link", "set", "lo", "up"], check=True)
    if default_route:
        subprocess.run([ip, "route", "add", "default", "dev", "lo", "src", "127.0.0.1"], check=True)


def route_address() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("8.8.8.8", 80))
            return s.getsockname()[0]
    except OSError:
        return None


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphan outlives the scenario


_next_port = [20000]


def port() -> int:
    _next_port[0] += 1  # a fresh namespace: every port is ours
    return _next_port[0]


class Child:
    def __init__(self, name: str, args: list[str], env: dict[str, str], logdir: str):
        self.name = name
        self.log_path = os.path.join(logdir, f"{name}.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log, env=env,
                                     preexec_fn=_die_with_parent)
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith(b"{"):
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    pass

    def wait_event(self, name: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in self.events:
                if ev.get("event") == name:
                    return ev
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: no {name!r} event (exit {self.proc.poll()}); log {self.log_path}")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(10)


class Cluster:
    def __init__(self, logdir: str):
        self.logdir = logdir
        self.children: list[Child] = []
        self.proxy = ""

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"PYTHONWARNINGS": "ignore", "MC_LOG_LEVEL": "INFO"})
        env.update(extra)
        return env

    def start_proxy(self) -> None:
        p = port()
        self.proxy = f"http://127.0.0.1:{p}"
        c = Child("proxy", [PY, "-m", "mooncake_connectors.lmdeploy", "serve", "proxy", "--server-name", "127.0.0.1",
                            "--server-port", str(p), "--serving-strategy", "DistServe", "--routing-strategy", "random",
                            "--disable-cache-status", "--log-level", "INFO"], self.env(), self.logdir)
        self.children.append(c)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                requests.get(f"{self.proxy}/nodes/status", timeout=2)
                return
            except requests.RequestException:
                if c.proc.poll() is not None:
                    break
                time.sleep(0.2)
        raise RuntimeError(f"proxy did not come up; log {c.log_path}")

    def start_node(self, name: str, role: str, *, register: bool = True, seed: int = 1, **env: str) -> str:
        p = port()
        args = [PY, NODE, "--role", role, "--port", str(p), "--seed", str(seed)]
        if register:
            args += ["--proxy-url", self.proxy]
        c = Child(name, args, self.env(**env), self.logdir)
        self.children.append(c)
        setattr(self, name, c)
        c.url = f"http://127.0.0.1:{p}"
        return c.url

    def ready(self, *names: str) -> None:
        for n in names:
            getattr(self, n).wait_event("ready", 120)

    def add(self, url: str, role: int) -> None:
        requests.post(f"{self.proxy}/nodes/add", timeout=10,
                      json={"url": url, "status": {"models": [MODEL], "role": role}}).raise_for_status()

    def remove(self, url: str) -> None:
        requests.post(f"{self.proxy}/nodes/remove", timeout=30, json={"url": url}).raise_for_status()

    def complete(self, prompt: str, timeout: float = 60) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            r = requests.post(f"{self.proxy}/v1/completions", timeout=timeout,
                              json={"model": MODEL, "prompt": prompt, "max_tokens": 8})
            body: Any = r.json()
        except (requests.RequestException, ValueError) as e:
            body = {"client_error": repr(e)}
        return {"prompt_len": len(prompt.encode()), "body": body, "seconds": time.monotonic() - t0}

    def state(self, url: str) -> dict[str, Any]:
        return requests.get(f"{url}/test/state", timeout=10).json()

    def close(self) -> None:
        for c in self.children:
            try:
                c.stop()
            except Exception:
                pass


def prompt(n_blocks: int, tag: str) -> str:
    return (tag * (16 * n_blocks))[: 16 * n_blocks - 3]  # just under n blocks of 16 tokens


def no_ibv_path() -> str:
    """PATH without any directory holding an ibv_devices (a host with rdma-core tools installed)."""
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not os.path.exists(os.path.join(d, "ibv_devices")))


def scenario_ours(cl: Cluster) -> dict[str, Any]:
    path = no_ibv_path()
    facts: dict[str, Any] = {"route": route_address(), "ibv_devices": shutil.which("ibv_devices", path=path)}
    cl.start_proxy()
    p = cl.start_node("prefill", "Prefill", seed=11, PATH=path)
    d = cl.start_node("decode", "Decode", seed=22, LMDEPLOY_USE_ASYNC_MIGRATION="1", PATH=path)
    cl.ready("prefill", "decode")
    facts["backends"] = [requests.get(f"{u}/test/backend", timeout=5).json() for u in (p, d)]
    facts["sequential"] = [cl.complete(prompt(n, t)) for n, t in ((1, "a"), (3, "bc"), (7, "def"))]
    out: list[Any] = [None] * 4
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, cl.complete(prompt(2 + i, "xyz"[i % 3]))))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    facts["concurrent"] = out
    time.sleep(0.5)  # the decode's free messages travel over ZMQ
    facts["prefill_state"], facts["decode_state"] = cl.state(p), cl.state(d)
    # LMDeploy's free-cache route: a preserved prefill freed by POST /distserve/free_cache
    r = requests.post(f"{p}/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": prompt(2, "q"), "max_tokens": 1, "with_cache": True, "preserve_cache": True}).json()
    before = cl.state(p)["free_blocks"]
    fr = requests.post(f"{p}/distserve/free_cache", timeout=10,
                       json={"remote_engine_id": p, "remote_session_id": int(r["id"])}).json()
    facts["free_cache"] = {"blocks": r["cache_block_ids"], "free_before": before, "reply": fr,
                           "free_after": cl.state(p)["free_blocks"]}
    return facts


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    return t, box


def _wait_paused(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if requests.get(f"{url}/test/state", timeout=5).json()["paused"]:
            return
        time.sleep(0.05)
    raise RuntimeError("decode never reached the migration")


def scenario_failures(cl: Cluster) -> dict[str, Any]:
    facts: dict[str, Any] = {"route": route_address()}
    cl.start_proxy()
    p1 = cl.start_node("p1", "Prefill", seed=31)
    d = cl.start_node("decode", "Decode", seed=32, MC_FORCE_TCP="1", MC_TRANSFER_TIMEOUT="4")
    p2 = cl.start_node("p2", "Prefill", register=False, seed=33)
    p3 = cl.start_node("p3", "Prefill", register=False, seed=34,
                       MOONCAKE_LOCAL_HOSTNAME="192.0.2.1", MC_TCP_BIND_ADDRESS="127.0.0.1")
    cl.ready("p1", "decode", "p2", "p3")
    facts["p1"], facts["p2"], facts["p3"] = p1, p2, p3
    facts["r1"] = cl.complete(prompt(3, "ok"))

    # prefill frozen mid-migration: the decode gives up at its deadline, and keeps answering meanwhile
    requests.post(f"{d}/test/pause_next", timeout=5)
    t, box = _in_thread(lambda: cl.complete(prompt(4, "fz")))
    _wait_paused(d)
    cl.p1.signal(signal.SIGSTOP)
    time.sleep(0.3)
    requests.post(f"{d}/test/go", timeout=5)
    t_go = time.monotonic()
    health = []
    for _ in range(3):
        time.sleep(0.5)
        h0 = time.monotonic()
        requests.get(f"{d}/health", timeout=5)
        health.append(time.monotonic() - h0)
    t.join(60)
    facts["frozen"] = {"response": box[0] if box else None, "seconds_after_go": time.monotonic() - t_go,
                       "health_seconds": health}
    cl.p1.signal(signal.SIGCONT)
    time.sleep(1.0)  # the free message queued while it was stopped
    facts["p1_after_frozen"] = cl.state(p1)

    # prefill killed mid-migration
    requests.post(f"{d}/test/pause_next", timeout=5)
    t, box = _in_thread(lambda: cl.complete(prompt(4, "kl")))
    _wait_paused(d)
    cl.p1.signal(signal.SIGSTOP)
    requests.post(f"{d}/test/go", timeout=5)
    time.sleep(1.0)
    cl.p1.signal(signal.SIGKILL)
    t_kill = time.monotonic()
    t.join(60)
    facts["killed"] = {"response": box[0] if box else None, "seconds_after_kill": time.monotonic() - t_kill}

    # the operator replaces the dead prefill; the decode serves the next request
    cl.remove(p1)
    cl.add(p2, 2)
    facts["r4"] = cl.complete(prompt(5, "nx"))

    # a prefill whose engine advertises an address the decode cannot reach (wrong MOONCAKE_LOCAL_HOSTNAME)
    cl.remove(p2)
    cl.add(p3, 2)
    facts["unreachable"] = cl.complete(prompt(2, "ur"))
    time.sleep(0.5)
    facts["p3_after"] = cl.state(p3)
    cl.remove(p3)
    cl.add(p2, 2)
    facts["r6"] = cl.complete(prompt(2, "af"))
    time.sleep(0.5)
    facts["p2_after"], facts["decode_after"] = cl.state(p2), cl.state(d)
    return facts


def scenario_mixed(cl: Cluster) -> dict[str, Any]:
    facts: dict[str, Any] = {"route": route_address()}
    # LMDeploy's backend hard-codes protocol "rdma" with a NIC from ibv_devices (the stand-in's mlx5_0); on
    # this host without RDMA our engine refuses that NIC unless MC_FORCE_TCP=1 says "rdma over tcp", as the original
    theirs = {"MOONCAKE_LMDEPLOY_BACKEND": "lmdeploy", "PATH": f"{FAKE_IBV}:{os.environ.get('PATH', '')}",
              "MC_FORCE_TCP": "1"}
    cl.start_proxy()
    pl = cl.start_node("pl", "Prefill", seed=41, **theirs)
    dl = cl.start_node("dl", "Decode", seed=42, **theirs)
    pc = cl.start_node("pc", "Prefill", register=False, seed=43)
    dc = cl.start_node("dc", "Decode", register=False, seed=44)
    cl.ready("pl", "dl", "pc", "dc")
    facts["backends"] = {n: requests.get(f"{u}/test/backend", timeout=5).json()
                         for n, u in (("pl", pl), ("dl", dl), ("pc", pc), ("dc", dc))}
    facts["lmdeploy_lmdeploy"] = [cl.complete(prompt(n, "ll")) for n in (2, 5)]
    cl.remove(dl)
    cl.add(dc, 3)
    facts["lmdeploy_core"] = [cl.complete(prompt(n, "lc")) for n in (3, 4)]
    cl.remove(pl)
    cl.add(pc, 2)
    cl.remove(dc)
    cl.add(dl, 3)
    facts["core_lmdeploy"] = [cl.complete(prompt(n, "cl")) for n in (1, 6)]
    time.sleep(0.5)
    facts["states"] = {n: cl.state(u) for n, u in (("pl", pl), ("dl", dl), ("pc", pc), ("dc", dc))}
    return facts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenario", choices=["ours", "failures", "mixed"])
    ap.add_argument("--logdir", required=True)
    a = ap.parse_args()
    lo_up(default_route=a.scenario == "mixed")
    cl = Cluster(a.logdir)
    try:
        facts = {"ours": scenario_ours, "failures": scenario_failures, "mixed": scenario_mixed}[a.scenario](cl)
    finally:
        cl.close()
    print(json.dumps({"facts": facts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
