#!/usr/bin/env python3
"""TTFT and end-to-end latency of 1P1D vLLM (CPU, tiny model) with our connector vs NixlConnector
vs no disaggregation -- all measured in the same run, same prompts.

    python3 -m bench.frameworks.bench_vllm_pd                 # 32 x 400-token prompts, 32 output tokens
    python3 -m bench.frameworks.bench_vllm_pd --requests 8 --modes ours nodisagg   # quick
    python3 -m bench.frameworks.bench_vllm_pd --tp 2 --modes nodisagg ours --requests 8 --warmup-lens 1 16 64 200 400

Modes (each starts its own servers, runs the prompts one at a time, stops them):
  nodisagg  one vLLM instance (core 0), requests sent to it directly
  ours      prefill (core 0) + decode (core 1) with MooncakeCoreConnector, through mooncake_proxy
            (``--handoff vllm``: prefill first, then the decode with the prefill's answer)
  ours-conc same, ``--handoff mooncake-core``: prefill and decode sent at once (after the first)
  ours-ft   same as ours plus ``--prefill-first-token``: the proxy streams the prefill's own first
            token, the decode continues from the prompt + that token (mooncake_proxy/first_token.py)
  nixl      same with vLLM's NixlConnector (needs ``pip install --no-deps nixl-cu12==1.5.1
            nixl==1.5.1`` in the vLLM venv: ``scripts/install_vllm.sh --with-nixl``), UCX over tcp
  nixl-mc   NixlConnector with "backends": ["MooncakeCore"] (our NIXL plugin: scripts/install_nixl.sh)
  builtin   same with vLLM's built-in MooncakeConnector running on our engine via the alias

TTFT = time to the first streamed token at the client; E2E = time to the last. Prints p50/mean
per mode for the requests sent one at a time, then p50s with ``--concurrency`` requests in flight
(another prompt set of the same size, so neither instance has them cached), the ratio of ours to nixl and to nodisagg, and the KV bytes our decode pulled per
request next to the bytes of the blocks the prompt needs. Needs the vLLM venv
(scripts/install_vllm.sh); the tiny model is built on the fly.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from mooncake_lab import no_spin as no_spin_patch
from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.vllm_harness import (VllmServer, free_port, make_tiny_model, p2p_config, start_all,
                          start_proxy, stop_proxy, tp_args, vllm_python)

from mooncake_core.utils.progress import Progress


def sse_chunks(url: str, body: dict, timeout: float = 300.0) -> Iterator[tuple[float, dict]]:
    """(perf_counter at arrival, chunk) for each ``data:`` chunk of a streamed completion."""
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if line.startswith("data:") and line != "data: [DONE]":
                yield time.perf_counter(), json.loads(line[5:])


def stream_request(url: str, prompt: list[int], max_tokens: int, timeout: float = 300.0) -> tuple[float, float, int]:
    """(ttft_s, e2e_s, tokens) of one streamed completion (tokens from the final usage chunk: the
    server may coalesce several tokens into one chunk)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = None
    n = 0
    for t, chunk in sse_chunks(url, body, timeout):
        if chunk.get("choices") and chunk["choices"][0].get("text") and ttft is None:
            ttft = t - t0
        if chunk.get("usage"):
            n = int(chunk["usage"].get("completion_tokens") or 0)
    return (ttft if ttft is not None else float("nan")), time.perf_counter() - t0, n


def servers_for(mode: str, py: str, model: Path, logs: Path, tp: int = 1) -> tuple[list[VllmServer], dict]:
    args, tenv = tp_args(tp, pin=True)  # the figures in BENCHMARKS were taken with rank r on core r
    if mode == "nodisagg":
        return [VllmServer(py, model, free_port(), 0, logs / "single.log", env=tenv, args=args)], {}
    if mode in OURS:
        return [VllmServer(py, model, free_port(), 0, logs / f"{mode}_p.log", p2p_config("kv_producer"),
                           env=tenv, args=args),
                VllmServer(py, model, free_port(), 1, logs / f"{mode}_d.log", p2p_config("kv_consumer"),
                           env=tenv, args=args)], {}
    if tp != 1:
        raise ValueError(f"mode {mode!r} runs with --tp 1 only in this bench")
    if mode in ("nixl", "nixl-mc"):
        env = {"UCX_NET_DEVICES": "lo", "UCX_TLS": "tcp,self,sm", "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
               "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1"}

        def cfg(role: str) -> dict:
            c = {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}
            if mode == "nixl-mc":  # NIXL on our backend plugin (scripts/install_nixl.sh)
                c["kv_connector_extra_config"] = {"backends": ["MooncakeCore"]}
            return c

        return [VllmServer(py, model, free_port(), 0, logs / f"{mode}_p.log", cfg("kv_producer"),
                           env=dict(env, VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()))),
                VllmServer(py, model, free_port(), 1, logs / f"{mode}_d.log", cfg("kv_consumer"),
                           env=dict(env, VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port())))], {}
    if mode == "builtin":
        b = free_port()
        env = {"MOONCAKE_VLLM_CPU_SHIM": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_MOONCAKE_BOOTSTRAP_PORT": str(b)}

        def cfg(role: str) -> dict:
            return {"kv_connector": "MooncakeConnector", "kv_role": role,
                    "kv_connector_extra_config": {"mooncake_protocol": "tcp"}}

        return [VllmServer(py, model, free_port(), 0, logs / "builtin_p.log", cfg("kv_producer"), env=env),
                VllmServer(py, model, free_port(), 1, logs / "builtin_d.log", cfg("kv_consumer"), env=env)], \
            {"bootstrap": b}
    raise ValueError(f"unknown mode {mode!r}")


OURS = ("ours", "ours-conc", "ours-ft")  # MooncakeCoreConnector on both instances
HANDOFF = {"builtin": "mooncake", "ours-conc": "mooncake-core"}  # the proxy's --handoff (default: vllm)
PROXY_FLAGS = {"ours-ft": ("--prefill-first-token",)}  # more proxy flags per mode


def warm_up(servers: list[VllmServer], lens: list[int], concurrency: int, seed: int) -> None:
    """Send every instance, directly and one instance at a time, a prompt of each length in ``lens``
    and then ``concurrency`` prompts at once, before anything is timed.

    Why: vLLM CPU compiles (torch.compile / inductor) graphs for new batch shapes when a request
    first brings one, and the instances (and their TP ranks) serialize on inductor's cache lock:
    on a loaded 2-core box that stalled a TP 2 engine for ~30 s at request time, longer than the
    prefill's lease. Warming one instance at a time keeps them from waiting on each other here.
    Random prompts (none shares a prefix with another or with the timed ones) so that every one
    is computed in full."""
    rng = random.Random(seed ^ 0x5EED)
    for s in servers:
        t0 = time.monotonic()
        prog = Progress(f"  warm-up {s.log_path.name}", len(lens) + (1 if concurrency > 1 else 0), unit="steps")
        for n in lens:
            stream_request(s.url, [rng.randrange(3, 300) for _ in range(n)], 4)
            prog.add()
        if concurrency > 1:
            burst = [[rng.randrange(3, 300) for _ in range(max(lens))] for _ in range(concurrency)]
            with ThreadPoolExecutor(concurrency) as ex:
                list(ex.map(lambda p: stream_request(s.url, p, 4), burst))
            prog.add()
        prog.finish()
        print(f"  warm-up of {s.log_path.name}: {time.monotonic() - t0:.1f} s", file=sys.stderr)


def run_concurrent(url: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> dict:
    """TTFT / E2E p50 with ``concurrency`` requests in flight (a closed loop over ``prompts``)."""
    prog = Progress(f"  {concurrency} in flight", len(prompts), unit="requests")
    res = []
    with ThreadPoolExecutor(concurrency) as ex:
        for r in ex.map(lambda p: stream_request(url, p, max_tokens), prompts):
            res.append(r)
            prog.add()
    prog.finish()
    bad = [n for _t, _e, n in res if n != max_tokens]
    return {"c_ttft_p50": statistics.median(t for t, _e, _n in res),
            "c_e2e_p50": statistics.median(e for _t, e, _n in res),
            "c_error": f"{len(bad)} of {len(res)} requests short" if bad else ""}


def run_mode(mode: str, py: str, model: Path, logs: Path, prompts: list[list[int]], max_tokens: int,
             cprompts: list[list[int]], concurrency: int, tp: int = 1, warmup_lens: list[int] | None = None,
             seed: int = 0, pin: bool = False, gap: float = 0.0, no_spin: bool = False) -> dict:
    servers, extra = servers_for(mode, py, model, logs, tp)
    for s in servers:
        s.pin_all = pin
        if no_spin:
            s.env = {**s.env, "PYTHONPATH": no_spin_patch.pythonpath(shim_pythonpath())}
    proxy = None
    try:
        start_all(servers)
        if no_spin:
            no_spin_patch.check_applied(servers)
        if warmup_lens:
            warm_up(servers, warmup_lens, concurrency, seed)
        if mode == "nodisagg":
            url = servers[0].url
        else:
            proxy, url = start_proxy(servers[0], servers[1], HANDOFF.get(mode, "vllm"),
                                     logs / f"{mode}_proxy.log", extra.get("bootstrap"),
                                     extra=PROXY_FLAGS.get(mode, ()))
        stream_request(url, [5] * 64, 2)  # warm-up (first request compiles / connects)
        ttfts, e2es = [], []
        error = ""
        prog = Progress(f"[{mode}]", len(prompts), unit="requests")
        for i, p in enumerate(prompts):
            if gap and i:
                time.sleep(gap)  # let vLLM CPU's post-message spin end (see --gap)
            try:
                t, e, n = stream_request(url, p, max_tokens)
                if n != max_tokens:
                    raise RuntimeError(f"got {n} tokens, expected {max_tokens}")
            except Exception as ex:  # keep what was measured; report the failure next to it
                error = f"request {len(ttfts) + 1} failed: {ex}"
                print(f"[{mode}] {error}", file=sys.stderr)
                break
            ttfts.append(t)
            e2es.append(e)
            prog.add()
        prog.finish()
        if not ttfts:
            raise RuntimeError(error or "no request completed")
        out = {"ttft_p50": statistics.median(ttfts), "ttft_mean": statistics.fmean(ttfts),
               "e2e_p50": statistics.median(e2es), "e2e_mean": statistics.fmean(e2es), "n": len(ttfts),
               "error": error}
        if concurrency > 1 and cprompts:
            try:
                out.update(run_concurrent(url, cprompts, max_tokens, concurrency))
            except Exception as ex:
                out["c_error"] = f"concurrent run failed: {ex}"
                print(f"[{mode}] {out['c_error']}", file=sys.stderr)
        if mode in OURS:
            per_tid: dict[str, int] = {}  # one line per decode rank: sum them per transfer
            for tid, b in re.findall(r"kv pulled request=\S+ transfer=(\S+) blocks=\d+ bytes=(\d+)",
                                     servers[1].log_text()):
                per_tid[tid] = per_tid.get(tid, 0) + int(b)
            pulled = list(per_tid.values())
            out["kv_bytes_per_req"] = statistics.fmean(pulled[1:]) if len(pulled) > 1 else float("nan")
        return out
    finally:
        if proxy is not None:
            stop_proxy(proxy)
        for s in servers:
            s.stop()


def bench_env(logs_arg: str | None, prefix: str) -> tuple[str, Path, Path] | None:
    """(vLLM venv python, logs directory, tiny model) -- or None, said on stderr, without a venv."""
    py = vllm_python()
    if py is None:
        print("vLLM venv not found: run scripts/install_vllm.sh (or set VLLM_VENV)", file=sys.stderr)
        return None
    logs = Path(logs_arg or tempfile.mkdtemp(prefix=prefix))
    logs.mkdir(parents=True, exist_ok=True)
    return py, logs, make_tiny_model(py, logs / "tiny-llama")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32, help="prompts per mode (default 32)")
    ap.add_argument("--prompt-len", type=int, default=400, help="tokens per prompt (default 400)")
    ap.add_argument("--max-tokens", type=int, default=32, help="output tokens per request (default 32)")
    ap.add_argument("--modes", nargs="+", default=["nodisagg", "ours", "nixl"],
                    choices=["nodisagg", *OURS, "nixl", "nixl-mc", "builtin"],
                    help="modes to run, in order: nodisagg (one plain instance), ours (MooncakeCoreConnector, "
                         "proxy --handoff vllm), ours-conc (--handoff mooncake-core, concurrent), ours-ft "
                         "(--handoff vllm --prefill-first-token: the prefill's token streamed at once), nixl "
                         "(NixlConnector on UCX), nixl-mc (NixlConnector on our MooncakeCore backend), builtin "
                         "(vLLM's MooncakeConnector on our engine)")
    ap.add_argument("--concurrency", type=int, default=8,
                    help="requests in flight for the second column (default 8; 1 skips it)")
    ap.add_argument("--seed", type=int, default=0, help="prompt RNG seed")
    ap.add_argument("--tp", type=int, default=1,
                    help="tensor_parallel_size of every instance of the nodisagg and ours* modes (default 1; "
                         "2 on a 2-core box puts rank r on core r)")
    ap.add_argument("--warmup-lens", type=int, nargs="+", default=None, metavar="N",
                    help="before timing, send every instance directly (one instance at a time) a prompt of each of "
                         "these lengths in tokens, then --concurrency prompts of the longest at once, so that vLLM "
                         "CPU's torch.compile of new shapes happens before the clock runs (default: none, only one "
                         "64-token request through the proxy; e.g. --warmup-lens 1 16 64 200 400 for --tp 2)")
    ap.add_argument("--pin-instances", action="store_true",
                    help="confine each vLLM instance's every process (API server and engine core too, not only the "
                         "worker's threads) to its core: nodisagg and prefill core 0, decode core 1; the proxy and "
                         "this client float. Why: vLLM CPU's engine core and worker spin (sched_yield) on their "
                         "shared-memory queue for 1 s after every message, so an idle-again prefill takes CPU from "
                         "the decode's processes on a 2-core box -- a co-location cost, not the hand-off's "
                         "(docs/benchmarks-log.md, issue 19 decode phase). --tp 1 only")
    ap.add_argument("--gap", type=float, default=0.0, metavar="S",
                    help="seconds of idle between the one-at-a-time requests (default 0: back to back). Why: vLLM "
                         "CPU's engine core and worker spin (sched_yield) for 1 s after every message, so on a 2-core "
                         "box a request sent right after the previous one finished competes with the other "
                         "instance's spin; --gap 1.2 measures the hand-off without that co-location cost")
    ap.add_argument("--no-idle-spin", action="store_true",
                    help="diagnostic: start every vLLM process of every mode with mooncake_lab/vllm_no_spin on PYTHONPATH, "
                         "whose sitecustomize cuts vLLM CPU's 1 s post-message spin on its shared-memory queues to "
                         "2 ms (BENCH_VLLM_SPIN_S). Why: on a 2-core box that spin is what two co-located instances "
                         "cost each other; with and without it separates that from the hand-off's own cost. vLLM "
                         "itself is not changed on disk")
    ap.add_argument("--logs", default=None, help="directory for server logs (default: a temp dir)")
    a = ap.parse_args(argv)
    if a.pin_instances and a.tp != 1:
        ap.error("--pin-instances needs --tp 1 (TP ranks are bound to cores by VLLM_CPU_OMP_THREADS_BIND)")
    env = bench_env(a.logs, "bench-vllm-")
    if env is None:
        return 2
    py, logs, model = env
    rng = random.Random(a.seed)
    prompts = [[rng.randrange(3, 300) for _ in range(a.prompt_len)] for _ in range(a.requests)]
    cprompts = [[rng.randrange(3, 300) for _ in range(a.prompt_len)] for _ in range(a.requests)]
    res: dict[str, dict] = {}
    load0 = os.getloadavg()
    for m in a.modes:
        try:
            res[m] = run_mode(m, py, model, logs, prompts, a.max_tokens, cprompts, a.concurrency, a.tp,
                              a.warmup_lens, a.seed, a.pin_instances, a.gap, a.no_idle_spin)
        except Exception as e:
            print(f"[{m}] failed: {e}", file=sys.stderr)
    print(f"\n{a.requests} requests x {a.prompt_len} prompt tokens, {a.max_tokens} output tokens, TP {a.tp}"
          f"{', instances pinned whole' if a.pin_instances else ''}"
          f"{', vLLM idle spin cut to 2 ms (--no-idle-spin)' if a.no_idle_spin else ''}, one at a time "
          f"(then {a.concurrency} in flight: cN columns); logs in {logs}")
    print("load average (1, 5, 15 min) at start %.1f %.1f %.1f, at end %.1f %.1f %.1f" % (*load0, *os.getloadavg()))
    print(f"{'mode':10} {'TTFT p50 ms':>12} {'TTFT mean':>10} {'E2E p50 ms':>11} {'E2E mean':>9} {'done':>5}"
          f" {'cN TTFT p50':>12} {'cN E2E p50':>11}")
    for m, r in res.items():
        conc = (f" {r['c_ttft_p50'] * 1e3:12.1f} {r['c_e2e_p50'] * 1e3:11.1f}" if "c_ttft_p50" in r
                else f" {'-':>12} {'-':>11}")
        errs = "; ".join(e for e in (r["error"], r.get("c_error", "")) if e)
        print(f"{m:10} {r['ttft_p50'] * 1e3:12.1f} {r['ttft_mean'] * 1e3:10.1f} {r['e2e_p50'] * 1e3:11.1f} "
              f"{r['e2e_mean'] * 1e3:9.1f} {r['n']:5d}" + conc + (f"  ({errs})" if errs else ""))
    for ours in OURS:
        if ours not in res:
            continue
        for ref in ("nodisagg", "nixl", "builtin", *OURS):
            if ref in res and ref != ours:
                o, f = res[ours], res[ref]
                line = (f"{ours} / {ref}: TTFT p50 {o['ttft_p50'] / f['ttft_p50']:.2f}x, "
                        f"E2E p50 {o['e2e_p50'] / f['e2e_p50']:.2f}x")
                if "c_ttft_p50" in o and "c_ttft_p50" in f:
                    line += (f"; {a.concurrency} in flight: TTFT p50 {o['c_ttft_p50'] / f['c_ttft_p50']:.2f}x, "
                             f"E2E p50 {o['c_e2e_p50'] / f['c_e2e_p50']:.2f}x")
                print(line)
        need = -(-a.prompt_len // 32) * 16384 * 2  # blocks x bytes/block/layer x layers (tiny model)
        print(f"{ours}: KV bytes pulled per request {res[ours].get('kv_bytes_per_req', float('nan')):.0f} "
              f"(blocks the prompt needs: {need})")
    return 0 if len(res) == len(a.modes) and not any(r["error"] or r.get("c_error") for r in res.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
