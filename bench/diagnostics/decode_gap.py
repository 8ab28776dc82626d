#!/usr/bin/env python3
"""Where a disaggregated vLLM decode's per-token time goes: the same prompts' decode phase
(time from the first streamed token to the last, per token) measured at the client against
several paths, in one run, plus the decode engine's own step times from the connector's trace.

    python3 -m bench.diagnostics.decode_gap --requests 12

Paths (one request at a time, ``--prompt-len`` prompts, ``--max-tokens`` output tokens):
  plain-c0   a vLLM instance without a KV connector on core 0 (bench_vllm_pd's nodisagg)
  plain-c1   the same on core 1 (the decode's core)
  conn-c1    the decode instance (MooncakeCoreConnector, kv_consumer, core 1) sent a plain request
  plain-c1-pbusy, conn-c1-pbusy   the same, each right after a 1-token request to the prefill
             instance (so that its engine processes are in vLLM's post-step busy-wait meanwhile)
  2hop       client -> prefill (core 0), then client -> decode directly with the prefill's params
  proxy      through mooncake_proxy ``--handoff mooncake-core`` (the concurrent hand-off)

Requests are ``--gap`` seconds apart (default 1.5: longer than the 1 s that vLLM's engine core and
worker spin on their shared-memory queue after a message, so one request's path does not slow
the next one's).

For each: TTFT p50, decode ms/token p50 (E2E - TTFT over tokens - 1), chunks per request (vLLM
merges tokens into one chunk when its API server falls behind) and, for the connector paths,
the decode engine's step interval p50 (from ``bench/diagnostics/trace_connector.py``'s ``scheduled`` events).
A diagnostic, not a target bench; needs the vLLM venv.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path


from bench.frameworks.bench_vllm_pd import sse_chunks, start_proxy, stop_proxy, warm_up
from bench.diagnostics.trace_vllm_pd import cfg, post, trace_env
from mooncake_lab.vllm_harness import VllmServer, free_port, p2p_config, start_all


def stream_chunks(url: str, body: dict, timeout: float = 120.0) -> tuple[float, list[tuple[float, int]]]:
    """(send time, [(arrival, tokens in chunk)]) of one streamed completion (perf_counter clock)."""
    t0 = time.perf_counter()
    out = [(t, len(c["choices"][0].get("token_ids") or ()))
           for t, c in sse_chunks(url, dict(body, stream=True, return_token_ids=True), timeout) if c.get("choices")]
    return t0, [(t, n) for t, n in out if n]


def summarize(runs: list[tuple[float, list[tuple[float, int]]]]) -> dict[str, float]:
    ttft, per_tok, chunks = [], [], []
    for t0, ch in runs[1:]:  # first: warm-up
        if not ch:
            continue
        ttft.append((ch[0][0] - t0) * 1e3)
        ntok = sum(n for _t, n in ch)
        if ntok > 1:
            per_tok.append((ch[-1][0] - ch[0][0]) * 1e3 / (ntok - 1))
        chunks.append(len(ch))
    return {"ttft": statistics.median(ttft), "per_tok": statistics.median(per_tok),
            "chunks": statistics.median(chunks)}


def step_gaps(trace: Path, since: float) -> float:
    """Median interval between the decode engine's consecutive steps of one request (wall clock),
    over the requests traced after ``since`` (unix)."""
    by: dict[str, list[float]] = {}
    for line in trace.read_text().splitlines():
        e = json.loads(line)
        if e["ev"] == "sched.scheduled" and e["t"] >= since and e.get("n") == 1:
            by.setdefault(e["rid"], []).append(e["t"])
    gaps = [(b - a) * 1e3 for ts in by.values() for a, b in zip(ts, ts[1:])]
    return statistics.median(gaps) if gaps else float("nan")


def handoff_steps(trace_p: Path, trace_d: Path, since: float) -> list[tuple[str, float]]:
    """Concurrent hand-off, per transfer id (median ms between consecutive events): the prefill
    worker sending ``ready``, the decode's rpc server thread receiving it, the decode's step
    taking it and reading, the prefill's server thread receiving the decode's ``done``."""
    by: dict[str, dict[str, float]] = {}
    for who, path in (("P", trace_p), ("D", trace_d)):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            tid = e.get("tid")
            if not tid or e["t"] < since:
                continue
            name = f"{who}.{e['ev']}" + (f".{e['kind']}" if "kind" in e else "")
            by.setdefault(tid, {}).setdefault(name, e["t"])
    order = ["P.worker.ready_send", "D.worker.notify_in.ready", "P.worker.ready_sent", "D.worker.ready_recv",
             "D.worker.read_done", "P.worker.notify_in.done"]
    full = [r for r in by.values() if all(k in r for k in order)]
    return [(f"{a} -> {b}", statistics.median((r[b] - r[a]) * 1e3 for r in full)) for a, b in zip(order, order[1:])
            if full]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=12, help="requests per path (first is a warm-up; default 12)")
    ap.add_argument("--prompt-len", type=int, default=400, help="tokens per prompt (default 400)")
    ap.add_argument("--max-tokens", type=int, default=32, help="output tokens (default 32)")
    paths = ["plain-c0", "plain-c1", "conn-c1", "plain-c1-pbusy", "conn-c1-pbusy", "2hop", "proxy"]
    ap.add_argument("--paths", nargs="+", default=paths[1:], choices=paths, help="paths to measure, in order")
    ap.add_argument("--gap", type=float, default=1.5, help="seconds between requests (default 1.5)")
    ap.add_argument("--trace", action="store_true",
                    help="run prefill and decode with bench/diagnostics/trace_connector.py's TracingMooncakeConnector "
                         "(engine step times; costs a little per step) instead of MooncakeCoreConnector")
    ap.add_argument("--extra", default="{}", help="JSON merged into both connectors' kv_connector_extra_config "
                                                  "(e.g. '{\"sync_load_max_bytes\": 0}')")
    ap.add_argument("--logs", default=None, help="directory for logs and traces (default: a temp dir)")
    a = ap.parse_args(argv)
    env = trace_env(a.logs, "decode-gap-")
    if env is None:
        return 2
    py, logs, model, tp, td, tenv = env

    def kv(role: str, trace: Path) -> dict:
        c = cfg(role, trace) if a.trace else p2p_config(role)
        c["kv_connector_extra_config"].update(json.loads(a.extra))
        return c

    p = VllmServer(py, model, free_port(), 0, logs / "p.log", kv("kv_producer", tp), env=tenv)
    d = VllmServer(py, model, free_port(), 1, logs / "d.log", kv("kv_consumer", td), env=tenv)
    n0 = VllmServer(py, model, free_port(), 0, logs / "n0.log")
    n1 = VllmServer(py, model, free_port(), 1, logs / "n1.log")
    servers = [p, d] + ([n0] if "plain-c0" in a.paths else []) + ([n1] if any(x.startswith("plain-c1") for x in a.paths) else [])
    rng = random.Random(0)
    base = {"model": "tiny", "temperature": 0, "ignore_eos": True, "max_tokens": a.max_tokens}
    proxy = None
    res: dict[str, dict[str, float]] = {}
    try:
        start_all(servers)
        warm_up(servers, [1, 16, 64, 200, 400], 1, 0)
        proxy, purl = start_proxy(p, d, "mooncake-core", logs / "proxy.log")
        for path in a.paths:
            prompts = [[rng.randrange(3, 300) for _ in range(a.prompt_len)] for _ in range(a.requests)]
            since = time.time()
            runs = []
            for pr in prompts:
                body = dict(base, prompt=pr)
                if path.endswith("-pbusy"):
                    post(p.url, dict(body, max_tokens=1, prompt=pr[:64]))
                if path == "plain-c0":
                    runs.append(stream_chunks(n0.url, body))
                elif path.startswith("plain-c1"):
                    runs.append(stream_chunks(n1.url, body))
                elif path.startswith("conn-c1"):
                    runs.append(stream_chunks(d.url, body))
                elif path == "2hop":
                    t_send = time.perf_counter()
                    ans = post(p.url, dict(body, max_tokens=1, kv_transfer_params={"do_remote_decode": True}))
                    _t, ch = stream_chunks(d.url, dict(body, kv_transfer_params=ans["kv_transfer_params"]))
                    runs.append((t_send, ch))
                else:
                    runs.append(stream_chunks(purl, body))
                time.sleep(a.gap)
            res[path] = summarize(runs)
            if a.trace and not path.startswith("plain"):
                res[path]["step"] = step_gaps(td, since)
            if a.trace and path == "proxy":
                for k, v in handoff_steps(tp, td, since):
                    print(f"  hand-off {k}: {v:.2f} ms", file=sys.stderr)
            print(f"  {path}: {res[path]}", file=sys.stderr)
    finally:
        if proxy is not None:
            stop_proxy(proxy)
        for s in servers:
            s.stop()
    print(f"\n{a.requests - 1} requests per path x {a.prompt_len} prompt tokens, {a.max_tokens} output tokens; "
          f"logs in {logs}")
    print(f"{'path':10} {'TTFT p50 ms':>12} {'ms/token p50':>13} {'chunks p50':>11} {'engine step p50 ms':>19}")
    for path, r in res.items():
        print(f"{path:10} {r['ttft']:12.1f} {r['per_tok']:13.2f} {r['chunks']:11.0f} {r.get('step', float('nan')):19.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
