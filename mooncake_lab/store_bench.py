"""Shared harness of the store benchmarks: one implementation's master + holder + runner.

For one implementation (ours or the original, each with its own ``mooncake_master`` and
Python), start the master with its embedded HTTP metadata server, a *holder* process that
contributes memory, and a *runner* process without memory, so every byte crosses processes.
Both processes run the same workload script (``holder`` / ``run`` subcommands with
``--impl --master --meta``); the runner's last JSON line is the result. Every wait is
bounded and every process is stopped on the way out.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from typing import Any, Callable

from mooncake_core.utils.net import free_port, wait_for_port
from mooncake_core.utils.proc import readline_timeout, stop_process


def start_master(impl: str, master_cmd: list[str], logdir: str, procs: list[subprocess.Popen]) -> list[str]:
    """Start one implementation's master with its HTTP metadata server (appended to
    ``procs``, which the caller stops); returns the workload's common arguments."""
    port, http, metrics = free_port(), free_port(), free_port()
    with open(os.path.join(logdir, f"{impl}-master.log"), "w") as mlog:
        procs.append(subprocess.Popen(master_cmd + [
            f"--port={port}", f"--metrics_port={metrics}", "--rpc_address=127.0.0.1",
            "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={http}", "--default_kv_lease_ttl=2000",
        ], stdout=mlog, stderr=subprocess.STDOUT))
    wait_for_port("127.0.0.1", port, 30, procs[-1])
    wait_for_port("127.0.0.1", http, 30, procs[-1])
    return ["--impl", impl, "--master", f"127.0.0.1:{port}", "--meta", f"http://127.0.0.1:{http}/metadata"]


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Stop ``procs`` newest first (closing stdin of the ones waiting on it)."""
    for p in reversed(procs):
        if p.poll() is None:
            if p.stdin:
                try:
                    p.stdin.close()
                except OSError:
                    pass
            stop_process(p)


def run_workload(impl: str, python: str, master_cmd: list[str], workload: str, *, logdir: str,
                 holder_args: list[str], runner_args: list[str], timeout: float) -> dict[str, Any]:
    """Start master + holder, run the workload's runner, return its JSON result."""
    procs: list[subprocess.Popen] = []
    try:
        common = start_master(impl, master_cmd, logdir, procs)
        with open(os.path.join(logdir, f"{impl}-holder.log"), "w") as hlog:
            holder = subprocess.Popen([python, workload, "holder", *common, *holder_args],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=hlog, text=True)
        procs.append(holder)
        line = readline_timeout(holder, 60, what=f"{impl} holder")
        if "ready" not in (line or ""):
            raise RuntimeError(f"{impl} holder failed: {line!r} (logs in {logdir})")
        with open(os.path.join(logdir, f"{impl}-runner.log"), "w") as rlog:
            runner = subprocess.Popen([python, workload, "run", *common, *runner_args],
                                      stdout=subprocess.PIPE, stderr=rlog, text=True)
        procs.append(runner)
        out, _ = runner.communicate(timeout=timeout)
        if runner.returncode != 0:
            raise RuntimeError(f"{impl} runner failed with {runner.returncode} (logs in {logdir})")
        return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
    finally:
        stop_all(procs)


def measure_ours_and_ref(run_impl: Callable[..., dict[str, Any]], args: Any,
                         logdir: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Run ``run_impl(impl, python, master_cmd, args, logdir)`` for this project, then for the
    original from ``args.ref_venv`` (its own python and ``mooncake_master``) unless
    ``args.no_ref`` or the venv is absent. ``args.force_tcp`` sets MC_FORCE_TCP=1 for ours
    only. Returns (ours, original or None); a failed reference run is reported, not raised."""
    if args.force_tcp:
        os.environ["MC_FORCE_TCP"] = "1"  # inherited by our holder/runner
    print(f"measuring this project (logs in {logdir}) ...", flush=True)
    try:
        ours = run_impl("ours", sys.executable, [sys.executable, "-m", "mooncake_core.store.master_main"],
                        args, logdir)
    finally:
        os.environ.pop("MC_FORCE_TCP", None)
    ref = None
    ref_py = os.path.join(args.ref_venv, "bin", "python")
    ref_master = os.path.join(args.ref_venv, "bin", "mooncake_master")
    if not args.no_ref and os.path.exists(ref_py) and os.path.exists(ref_master):
        print("measuring the original Mooncake ...", flush=True)
        # its wheel links libcudart.so.12, which the venv carries under site-packages/nvidia/*/lib
        libs = glob.glob(os.path.join(args.ref_venv, "lib", "python3*", "site-packages", "nvidia", "*", "lib"))
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(libs + [os.environ.get("LD_LIBRARY_PATH", "")]).strip(os.pathsep)
        try:
            ref = run_impl("ref", ref_py, [ref_master], args, logdir)
        except Exception as e:  # noqa: BLE001 - report, still print ours
            print(f"reference run failed: {e}", flush=True)
    elif not args.no_ref:
        print(f"reference venv {args.ref_venv} not found: printing this project only", flush=True)
    return ours, ref


def finish(ours: dict[str, Any], ref: dict[str, Any] | None, json_path: str | None) -> int:
    """A store bench's ending: print each side's reported errors, write both results to
    ``json_path`` when given; the exit code (1 when ours reported errors)."""
    for name, res in (("ours", ours), ("original", ref)):
        if res and res.get("errors"):
            print(f"{name} reported errors: {res['errors']}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"ours": ours, "original": ref}, f, indent=2)
    return 1 if ours.get("errors") else 0
