#!/usr/bin/env python3
"""LMCache benchmark: store then retrieve >= 1 GB of KV chunks through LMCache 0.5.6, in one run,
on four backends:

* ``builtin/ours``      LMCache's own ``mooncakestore://`` adapter on this project's store;
* ``native/ours``       our ``MooncakeCoreConnectorAdapter`` (``remote_storage_plugins``);
* ``builtin/original``  LMCache's adapter on the original Mooncake 0.3.13
                        (``mooncake-transfer-engine-non-cuda`` in ``--ref-venv``, its own
                        ``mooncake_master``; driven over tcp on loopback);
* ``disk``              LMCache's local-disk backend (a floor: no store, same process).

Topology per store backend: a master (embedded HTTP metadata), a *holder* process that
contributes the memory (``bench/reference/ref_mooncake_store.py holder``), a writer and a reader process
running LMCache engines (``mooncake_lab/lmcache_peer.py``) that contribute none, so every chunk
crosses processes both ways. The writer stores ``--requests`` prompts of ``--tokens`` tokens
(256-token chunks of a scaled-down layer shape, ``--layers`` x ``--hidden`` fp16); store time
runs from ``LMCacheEngine.store`` until LMCache's asynchronous puts finished. The reader then
looks each prompt up and retrieves it (``LMCacheEngine.retrieve``, timed alone) and checks it
byte for byte; a row's GB/s is that of its median prompt. The rows of one mode run side by side, prompt by prompt in rotating order (the
built-in and native engines in the same processes on one store of ours, the original's in its
own processes and store), so load drift on a shared machine hits every row alike; every
mode gets fresh stores. Printed: GB/s per row (median over ``--rounds``), and the ratios the
issue targets (native >= 1.5x built-in on the original, >= 1.0x built-in on ours, for store
and retrieve).

    python3 -m bench.frameworks.bench_lmcache                 # ~5 minutes on 2 cores: 1 GiB per row
    python3 -m bench.frameworks.bench_lmcache --quick         # 256 MiB per row
    python3 -m bench.frameworks.bench_lmcache --modes meta    # LMCache's default mode only

The original: ``python3 -m venv /work/venvs/mooncake-ref && /work/venvs/mooncake-ref/bin/pip install
mooncake-transfer-engine-non-cuda==0.3.13 nvidia-cuda-runtime-cu12 numpy`` (its ``store.so`` links
libcudart, which this script puts on ``LD_LIBRARY_PATH``; apt: libibverbs1 ibverbs-providers
librdmacm1 libnuma1).

``--modes``: ``meta`` = ``save_chunk_meta: true`` (LMCache's default: a metadata header stored
with each chunk), ``zc`` = ``save_chunk_meta: false`` (LMCache's zero-copy layout).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mooncake_lab.lmcache_harness import LmcPeer, lmcache_python, peer_env, shim_pythonpath

from mooncake_core.utils.net import free_port, wait_for_port
from mooncake_core.utils.proc import readline_timeout, stop_process
from mooncake_core.utils.progress import Progress

HOLDER = os.path.join(ROOT, "bench", "reference", "ref_mooncake_store.py")
GB = 1e9


def original_env(ref_venv: str, tmp: str) -> dict[str, str]:
    """Run LMCache (from the LMCache venv) against the *original* ``mooncake`` package: a path
    entry holding only that package (and its bundled libs), plus its libcudart."""
    site = glob.glob(os.path.join(ref_venv, "lib", "python3*", "site-packages"))[0]
    shim = tempfile.mkdtemp(prefix="orig-shim-", dir=tmp)
    for name in ("mooncake", "mooncake_transfer_engine_non_cuda.libs"):
        if os.path.exists(os.path.join(site, name)):
            os.symlink(os.path.join(site, name), os.path.join(shim, name))
    libs = [os.path.dirname(p) for p in glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcudart.so*"))]
    ld = os.pathsep.join(libs + [os.environ.get("LD_LIBRARY_PATH", "")]).strip(os.pathsep)
    return {"PYTHONPATH": os.pathsep.join([shim, shim_pythonpath()]), "LD_LIBRARY_PATH": ld,
            "MC_TCP_BIND_ADDRESS": "127.0.0.1"}


class StoreCluster:
    """master + holder for one implementation; stopped on exit."""

    def __init__(self, impl: str, args: Any, logdir: str, env: dict[str, str], rows: int = 1):
        self.procs: list[subprocess.Popen] = []
        port, http, metrics = free_port(), free_port(), free_port()
        if impl == "ours":
            master, holder_py, holder_impl = [sys.executable, "-m", "mooncake_core.store.master_main"], sys.executable, "ours"
        else:
            master = [os.path.join(args.ref_venv, "bin", "mooncake_master")]
            holder_py, holder_impl = os.path.join(args.ref_venv, "bin", "python"), "ref"
        with open(os.path.join(logdir, f"{impl}-master.log"), "w") as log:
            self.procs.append(subprocess.Popen(master + [
                f"--port={port}", f"--metrics_port={metrics}", "--rpc_address=127.0.0.1",
                "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
                f"--http_metadata_server_port={http}",
            ], stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **env)))
        wait_for_port("127.0.0.1", port, 30, self.procs[0])
        wait_for_port("127.0.0.1", http, 30, self.procs[0])
        self.addr, self.meta = f"127.0.0.1:{port}", f"http://127.0.0.1:{http}/metadata"
        with open(os.path.join(logdir, f"{impl}-holder.log"), "w") as log:
            h = subprocess.Popen([holder_py, HOLDER, "holder", "--impl", holder_impl, "--master", self.addr,
                                  "--meta", self.meta, "--segment", str(args.segment * rows)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                 env=dict(os.environ, **env))
        self.procs.append(h)
        if "ready" not in (readline_timeout(h, 120, what=f"{impl} holder") or ""):
            raise RuntimeError(f"{impl} holder did not start (logs in {logdir})")

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.stdin:
                try:
                    p.stdin.close()
                except OSError:
                    pass
            stop_process(p)


@dataclass
class Row:
    """One measured backend: its engine in a writer and a reader process, and its tallies."""

    label: str
    backend: str
    meta: bool
    writer: LmcPeer
    reader: LmcPeer
    cluster: StoreCluster | None = None
    disk_dir: str = ""
    store_each: list[float] = field(default_factory=list)  # seconds per prompt
    retrieve_each: list[float] = field(default_factory=list)
    lookup_each: list[float] = field(default_factory=list)
    got_tokens: int = 0
    exact: bool = True

    def open(self, args: Any) -> None:
        common: dict[str, Any] = dict(backend=self.backend, chunk_meta=self.meta, cpu_gb=args.cpu_gb,
                                      blocking_timeout=60)
        if self.cluster is not None:
            # Mooncake 0.3.13's setup(dict) reads the master from "master_server_addr" and ignores
            # the "master_server_address" LMCache passes (it would dial 127.0.0.1:50051); LMCache
            # forwards mooncake_<key> as <key>, so both implementations get both spellings
            common.update(master=self.cluster.addr, meta=self.cluster.meta,
                          extra={"local_buffer_size": str(1 << 30),
                                 "mooncake_master_server_addr": self.cluster.addr})
        if self.backend == "disk":
            common.update(disk_dir=self.disk_dir)
        for p in self.peers():
            p.send("open", name=self.label, **common)
        for p in self.peers():
            p.recv(300)

    def peers(self) -> list[LmcPeer]:
        return [self.writer] if self.reader is self.writer else [self.writer, self.reader]

    def first(self, i: int) -> int:
        return 1_000_000 * (i + 1)

    def warm_up(self, args: Any) -> None:
        """Untimed: connections, the first use of every buffer; and a first byte-exact check."""
        self.writer.cmd("store", name=self.label, first=7, n=args.tokens, kv_seed=99, timeout=600)
        got = self.reader.cmd("retrieve", name=self.label, first=7, n=args.tokens, kv_seed=99, timeout=600)
        if not (got["exact"] and got["got"] == args.tokens):
            raise RuntimeError(f"{self.label}: the warm-up prompt did not come back intact: {got}")

    def store(self, i: int, args: Any) -> None:
        self.store_each.append(self.writer.cmd("store", name=self.label, first=self.first(i), n=args.tokens,
                                               kv_seed=i, timeout=600)["secs"])

    def retrieve(self, i: int, args: Any) -> None:
        self.lookup_each.append(self.reader.cmd("lookup", name=self.label, first=self.first(i), n=args.tokens,
                                                timeout=600)["secs"])
        got = self.reader.cmd("retrieve", name=self.label, first=self.first(i), n=args.tokens, kv_seed=i,
                              timeout=600)
        self.retrieve_each.append(got["secs"])
        self.got_tokens += got["got"]
        self.exact = self.exact and bool(got["exact"])

    def result(self, args: Any) -> dict[str, Any]:
        """GB/s of the median prompt (a load spike of the shared machine lands on a few prompts;
        the median ignores them) and of the whole run (total bytes / total seconds)."""
        import statistics

        for p in self.peers():
            p.cmd("close", name=self.label, timeout=300)
        prompt = (args.tokens // 256) * 2 * args.layers * 256 * args.hidden * 2
        want = args.requests * args.tokens
        return {"label": self.label, "bytes": prompt * args.requests,
                "store_gbps": prompt / statistics.median(self.store_each) / GB,
                "retrieve_gbps": prompt / statistics.median(self.retrieve_each) / GB,
                "store_total_gbps": prompt * len(self.store_each) / sum(self.store_each) / GB,
                "retrieve_total_gbps": prompt * len(self.retrieve_each) / sum(self.retrieve_each) / GB,
                "lookup_ms": 1000 * statistics.median(self.lookup_each), "complete": self.got_tokens == want,
                "exact": self.exact, "store_s": self.store_each, "retrieve_s": self.retrieve_each}


def run_interleaved(rows: list[Row], args: Any) -> list[dict]:
    """Every row stores prompt i, in an order that rotates with i; then every row looks up and
    retrieves prompt i, rotating again. Load drift on a shared machine then hits all rows alike."""
    for row in rows:
        row.open(args)
    for row in rows:
        row.warm_up(args)
    for step in ("store", "retrieve"):
        prog = Progress(f"  {step}", args.requests * len(rows), unit="prompts")
        for i in range(args.requests):
            for k in range(len(rows)):
                row = rows[(i + k) % len(rows)]
                getattr(row, step)(i, args)
                prog.add()
        prog.finish()
    return [row.result(args) for row in rows]


def medians(runs: list[dict]) -> list[dict]:
    """One row per label: the median of its rounds (exact only if every round was)."""
    import statistics

    rows: dict[str, list[dict]] = {}
    for r in runs:
        rows.setdefault(r["label"], []).append(r)
    out = []
    for label, rs in rows.items():
        row = dict(rs[0], rounds=len(rs), exact=all(r["exact"] for r in rs),
                   complete=all(r["complete"] for r in rs))
        for k in ("store_gbps", "retrieve_gbps", "store_total_gbps", "retrieve_total_gbps", "lookup_ms"):
            row[k] = statistics.median(r[k] for r in rs)
            row[k + "_all"] = [round(r[k], 3) for r in rs]
        out.append(row)
    return out


class ImplPeers:
    """A store cluster and a writer + reader LMCache process for one implementation."""

    def __init__(self, impl: str, args: Any, py: str, logdir: str, rows: int):
        self.impl = impl
        self.name = "ours" if impl == "ours" else "original"
        env = {} if impl == "ours" else original_env(args.ref_venv, logdir)
        self.cluster = StoreCluster(impl, args, logdir, env, rows=rows)
        peer_args = ["--impl", self.name, "--tokens", str(args.tokens), "--layers", str(args.layers),
                     "--hidden", str(args.hidden)]
        pe = peer_env(env)
        self.writer = LmcPeer(py, os.path.join(logdir, f"{impl}-writer.log"), *peer_args, env=pe, ready_timeout=None)
        self.reader = LmcPeer(py, os.path.join(logdir, f"{impl}-reader.log"), *peer_args, env=pe, ready_timeout=None)

    def wait(self) -> None:
        self.writer.wait_ready(180), self.reader.wait_ready(180)

    def row(self, backend: str, meta: bool) -> Row:
        return Row(f"{backend}/{self.name}/{'meta' if meta else 'zc'}", backend, meta, self.writer, self.reader,
                   self.cluster)

    def close(self) -> None:
        self.writer.close(60)
        self.reader.close(60)
        self.cluster.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-venv", default="/work/venvs/mooncake-ref",
                    help="venv with the original Mooncake 0.3.13 (skipped when absent)")
    ap.add_argument("--modes", default="meta,zc", help="comma list of meta (save_chunk_meta true) / zc")
    ap.add_argument("--requests", type=int, default=8, help="prompts stored and retrieved per backend")
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per prompt (a multiple of 256)")
    ap.add_argument("--layers", type=int, default=16, help="layers of the scaled-down model")
    ap.add_argument("--hidden", type=int, default=256, help="KV hidden size per layer (kv heads x head dim)")
    ap.add_argument("--cpu-gb", type=float, default=0.3, help="LMCache max_local_cpu_size of each engine")
    ap.add_argument("--segment", type=int, default=0, help="bytes the holder contributes per row (default: 1.5x its data)")
    ap.add_argument("--no-ref", action="store_true", help="skip the original Mooncake")
    ap.add_argument("--no-disk", action="store_true", help="skip the local-disk floor")
    ap.add_argument("--rounds", type=int, default=1, help="measurements per row (the median is printed)")
    ap.add_argument("--quick", action="store_true", help="2 prompts (256 MiB per backend)")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    if args.quick:
        args.requests = 2
    if args.tokens % 256:
        ap.error("--tokens must be a multiple of 256 (LMCache's chunk size here)")
    chunk_bytes = 2 * args.layers * 256 * args.hidden * 2
    data = args.requests * (args.tokens // 256) * chunk_bytes
    args.segment = args.segment or int(1.5 * (data + args.tokens // 256 * chunk_bytes))
    modes = [m.strip() == "meta" for m in args.modes.split(",") if m.strip()]
    py = lmcache_python()
    if py is None:
        print("LMCache venv not found: run scripts/install_lmcache.sh", file=sys.stderr)
        return 2
    logdir = tempfile.mkdtemp(prefix="bench-lmcache-")
    print(f"{data / GB:.2f} GB per backend ({args.requests} x {args.tokens} tokens, {chunk_bytes >> 20} MiB "
          f"chunks); logs in {logdir}", flush=True)
    results: list[dict] = []
    failures: list[str] = []
    t0 = time.monotonic()
    have_ref = not args.no_ref and os.path.exists(os.path.join(args.ref_venv, "bin", "mooncake_master"))
    if not args.no_ref and not have_ref:
        print(f"original not measured: {args.ref_venv} missing", flush=True)
    for rnd in range(args.rounds):
        for meta in modes:
            mode = "meta" if meta else "zc"
            print(f"round {rnd + 1}/{args.rounds}, mode {mode}: built-in and native on ours"
                  f"{', built-in on the original' if have_ref else ''}, interleaved", flush=True)
            ours = ImplPeers("ours", args, py, logdir, rows=2)
            orig = None
            try:
                if have_ref:
                    try:
                        orig = ImplPeers("original", args, py, logdir, rows=1)
                        orig.wait()
                    except Exception as e:  # noqa: BLE001 - report, still measure ours
                        print(f"original failed to start: {e}", flush=True)
                        failures.append(f"original/{mode}")
                        if orig is not None:
                            orig.close()
                        orig = None
                ours.wait()
                rows = [ours.row("builtin", meta), ours.row("native", meta)]
                if orig is not None:
                    rows.append(orig.row("builtin", meta))
                results += run_interleaved(rows, args)
            finally:
                ours.close()
                if orig is not None:
                    orig.close()
    if not args.no_disk:
        print("LMCache's local disk:", flush=True)
        disk = tempfile.mkdtemp(prefix="lmcache-disk-", dir=logdir)
        p = LmcPeer(py, os.path.join(logdir, "disk.log"), "--tokens", str(args.tokens), "--layers",
                    str(args.layers), "--hidden", str(args.hidden), env=peer_env(), ready_timeout=180)
        try:
            for rnd in range(args.rounds):
                row = Row("disk", "disk", False, p, p, disk_dir=tempfile.mkdtemp(prefix=f"r{rnd}-", dir=disk))
                results += run_interleaved([row], args)
        finally:
            p.close(60)
    results = medians(results)
    by = {r["label"]: r for r in results}
    print(f"\nLMCache 0.5.6, {data / GB:.2f} GB per row, median of {args.rounds} round(s), "
          f"{time.monotonic() - t0:.0f} s")
    print("GB/s of the median prompt (in brackets: total bytes / total time); lookup: median ms per prompt")
    print(f"{'backend/store/mode':<24} {'store GB/s':>16} {'retrieve GB/s':>16} {'lookup ms':>10}  exact")
    for r in results:
        print(f"{r['label']:<24} {r['store_gbps']:>7.2f} ({r['store_total_gbps']:>5.2f}) "
              f"{r['retrieve_gbps']:>8.2f} ({r['retrieve_total_gbps']:>5.2f}) {r['lookup_ms']:>10.2f}  "
              f"{'yes' if r['exact'] and r['complete'] else 'NO'}")
    print("\nratios (targets: native >= 1.5x builtin/original, >= 1.0x builtin/ours)")
    for m in ("meta", "zc"):
        n = by.get(f"native/ours/{m}")
        for ref, target in ((f"builtin/original/{m}", 1.5), (f"builtin/ours/{m}", 1.0)):
            b = by.get(ref)
            if n and b:
                rs = n["store_gbps"] / max(b["store_gbps"], 1e-9)
                rr = n["retrieve_gbps"] / max(b["retrieve_gbps"], 1e-9)
                ok = "ok" if rs >= target and rr >= target else "BELOW TARGET"
                print(f"native/ours/{m} vs {ref:<22} store {rs:5.2f}x  retrieve {rr:5.2f}x  ({ok})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    bad = [r["label"] for r in results if not (r["exact"] and r["complete"])]
    if bad or failures:
        print(f"\nNOT byte-exact / incomplete: {bad}; failed: {failures}; logs kept in {logdir}", file=sys.stderr)
        return 1
    shutil.rmtree(logdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
