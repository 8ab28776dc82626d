"""SGLang PD KV hand-off: SGLang's Mooncake backend on our engine vs SGLang's NIXL backend (UCX).

    python3 -m bench.frameworks.bench_sglang_handoff [--quick] [--passes 2] [--layers 32] [--pages 512] [--page-kib 16]

Each variant runs tests/sglang/peer_pd.py twice (prefill + decode processes, SGLang venv:
scripts/install_sglang.sh; NIXL: ``pip install nixl-cu13 && pip install --no-deps nixl`` in that
venv) over the same page set: ``layers x 2`` KV buffers of ``pages`` pages, every page moved,
destination pages a random permutation of the source pages (decode allocates pages wherever they
are free, so SGLang cannot merge them into large blocks), plus the aux rows. A round is timed on
the decode side from ``send_metadata`` to ``KVPoll.Success`` -- what a decode request waits for.
The first round (connection set-up) is dropped; the median of the rest is reported, next to a
one-thread numpy memcpy of the same bytes measured in the same run. Variants:

* ``mooncake``      -- ``--disaggregation-transfer-backend mooncake`` with our plugin: our engine,
                       same-host transport chosen by the engine (cma: process_vm_writev);
* ``mooncake-tcp``  -- the same with ``MC_FORCE_TCP=1`` (what two hosts would use);
* ``nixl``          -- ``--disaggregation-transfer-backend nixl``, UCX on host memory (DRAM).

Prints a table and the ratios mooncake/nixl (target >= 1.5x). A shared 2-core box is noisy:
compare ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from mooncake_core.utils.net import listen_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER = os.path.join(REPO, "tests", "sglang", "peer_pd.py")


def venv_python() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    venv = os.environ.get("SGLANG_VENV") or os.path.join(cache, "mooncake-core", "venvs", "sglang")  # as install_sglang.sh
    py = os.path.join(venv, "bin", "python")
    if not os.access(py, os.X_OK):
        raise SystemExit(f"no SGLang venv python at {py}: run scripts/install_sglang.sh (or set SGLANG_VENV)")
    return py


def has_nixl(py: str) -> bool:
    r = subprocess.run([py, "-c", "import nixl._api"], capture_output=True, timeout=120, check=False)
    return r.returncode == 0


def run_variant(py: str, name: str, a: argparse.Namespace) -> dict:
    backend = "nixl" if name == "nixl" else "mooncake"
    env = dict(os.environ, SGLANG_HOST_IP="127.0.0.1", PYTHONWARNINGS="ignore",
               SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT="300", SGLANG_DISAGGREGATION_WAITING_TIMEOUT="300")
    if name == "mooncake-tcp":
        env["MC_FORCE_TCP"] = "1"
    rng = np.random.default_rng(0)
    src = list(range(a.pages))
    dst = rng.permutation(a.pages).tolist()
    args = ["--backend", backend, "--bootstrap-port", str(listen_port()), "--rooms", "7",
            "--layers", str(a.layers), "--pages", str(a.pages), "--page-bytes", str(a.page_kib * 1024),
            "--pages-map", f"{','.join(map(str, src))}:{','.join(map(str, dst))}", "--aux-map", "1:2",
            "--repeat", str(a.rounds + 1), "--deadline", str(a.deadline)]
    procs = []
    try:
        for role, seed in (("prefill", 1), ("decode", 2)):
            procs.append(subprocess.Popen([py, PEER, "--role", role, "--seed", str(seed), *args], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                          start_new_session=True))
        out, _ = procs[1].communicate(timeout=a.deadline + 120)
        p_out, _ = procs[0].communicate(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
    res = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    res = [r for r in res if r.get("event") == "result"]
    if not res or not res[-1].get("ok"):
        return {"variant": name, "ok": False, "error": res[-1].get("errors") if res else "no result"}
    r = res[-1]
    p_res = [json.loads(line) for line in p_out.splitlines() if line.startswith("{")]
    transports = sorted({t for e in p_res if e.get("event") == "result" for t in e.get("transports", {}).values()})
    times = r["rounds"][1:]  # drop the warm-up round
    med = statistics.median(times)
    return {"variant": name, "ok": True, "bytes": r["bytes_per_round"], "median_s": med, "best_s": min(times),
            "gbps": r["bytes_per_round"] / med / 1e9, "best_gbps": r["bytes_per_round"] / min(times) / 1e9,
            "transport": ",".join(transports) or backend, "rounds_s": r["rounds"]}


def _pool(variant: str, runs: list[dict]) -> dict:
    """One variant's passes pooled: median/best over all timed rounds of all passes."""
    bad = [r for r in runs if not r["ok"]]
    if bad:
        return bad[0]
    times = [t for r in runs for t in r["rounds_s"][1:]]
    nbytes = runs[0]["bytes"]
    med = statistics.median(times)
    return {**runs[0], "median_s": med, "best_s": min(times), "gbps": nbytes / med / 1e9,
            "best_gbps": nbytes / min(times) / 1e9, "rounds_s": [t for r in runs for t in r["rounds_s"]],
            "passes": len(runs)}


def memcpy_gbps(nbytes: int) -> float:
    src = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=32, help="model layers (2 KV buffers each); default 32")
    p.add_argument("--pages", type=int, default=512, help="pages per buffer, all moved; default 512")
    p.add_argument("--page-kib", type=int, default=16, help="KiB per page per buffer; default 16")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round; default 3")
    p.add_argument("--variants", default="mooncake,mooncake-tcp,nixl",
                   help="comma list of mooncake, mooncake-tcp, nixl (nixl skipped if not installed)")
    p.add_argument("--passes", type=int, default=1,
                   help="run the variant list this many times, interleaved, and pool the rounds "
                        "(evens out load from other processes on a shared box); default 1")
    p.add_argument("--deadline", type=float, default=300, help="seconds allowed per variant")
    p.add_argument("--quick", action="store_true", help="8 layers x 128 pages, 2 rounds (smoke run)")
    p.add_argument("--json", default="", help="also write the results here")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if a.quick:
        a.layers, a.pages, a.rounds = 8, 128, 2
    py = venv_python()
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    if "nixl" in variants and not has_nixl(py):
        print("nixl is not importable in the SGLang venv; skipping it "
              "(pip install nixl-cu13 && pip install --no-deps nixl)", file=sys.stderr)
        variants.remove("nixl")
    total = a.layers * 2 * a.pages * a.page_kib * 1024
    print(f"KV hand-off: {a.layers} layers x 2 x {a.pages} pages x {a.page_kib} KiB = {total / 2**20:.0f} MiB "
          f"per round, scattered destination pages, {a.rounds} timed rounds", flush=True)
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for _ in range(max(1, a.passes)):
        for v in variants:
            runs[v].append(run_variant(py, v, a))
    results = [_pool(v, rs) for v, rs in runs.items()]
    for r in results:
        v = r["variant"]
        if r["ok"]:
            print(f"  {v:14s} median {r['median_s'] * 1e3:8.1f} ms  {r['gbps']:6.2f} GB/s  "
                  f"(best {r['best_gbps']:.2f} GB/s, transport {r['transport']})", flush=True)
        else:
            print(f"  {v:14s} FAILED: {r['error']}", flush=True)
    ref = memcpy_gbps(min(total, 1 << 30))
    print(f"  {'memcpy (ref)':14s} {'':17s}{ref:6.2f} GB/s  (numpy, one thread, same bytes)")
    by = {r["variant"]: r for r in results if r["ok"]}
    ratios = {}
    for v in ("mooncake", "mooncake-tcp"):
        if v in by and "nixl" in by:
            ratios[f"{v}/nixl"] = by[v]["gbps"] / by["nixl"]["gbps"]
    for k, x in ratios.items():
        print(f"  ratio {k:20s} {x:5.2f}x   (target >= 1.5x)")
    for v, r in by.items():
        print(f"  ratio {v + '/memcpy':20s} {r['gbps'] / ref:5.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "results": results, "memcpy_gbps": ref, "ratios": ratios}, f, indent=1)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
