#!/usr/bin/env python3
"""Where a disaggregated vLLM request's time goes: one request at a time through prefill -> hand-off
-> decode, with wall-clock timestamps from the client and from both engines' connectors.

    python3 -m bench.diagnostics.trace_vllm_pd --requests 12          # client does the two hops itself
    python3 -m bench.diagnostics.trace_vllm_pd --via-proxy            # ... through mooncake_proxy (concurrent hand-off)
    python3 -m bench.diagnostics.trace_vllm_pd --via-proxy --handoff vllm   # ... sequential hand-off

Starts one prefill and one decode vLLM-CPU instance (tiny model, one core each) with
``bench/diagnostics/trace_connector.py``'s ``TracingMooncakeConnector`` (the production connector plus trace
events), sends ``--requests`` prompts one at a time and prints, per phase, the median and spread
of the milliseconds between consecutive events (the first request, a warm-up, is dropped).
Events are matched per request by order (requests are serial). Needs the vLLM venv.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from bench.frameworks.bench_vllm_pd import bench_env, start_proxy, stream_request
from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.vllm_harness import VllmServer, free_port, start_all


def cfg(role: str, trace: Path) -> dict:
    return {"kv_connector": "TracingMooncakeConnector", "kv_connector_module_path": "trace_connector",
            "kv_role": role, "kv_connector_extra_config": {"local_hostname": "127.0.0.1",
                                                           "trace_file": str(trace)}}


def post(url: str, body: dict, timeout: float = 120.0) -> dict:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def stream_timed(url: str, body: dict, timeout: float = 120.0) -> tuple[float, float]:
    """(unix time of the first text chunk, unix time of the end)."""
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    first = None
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if first is None and line.startswith("data:") and line != "data: [DONE]":
                c = json.loads(line[5:])
                if c.get("choices") and c["choices"][0].get("text"):
                    first = time.time()
    return (first or float("nan")), time.time()


def one(p_url: str, d_url: str, prompt: list[int], max_tokens: int) -> dict[str, float]:
    base = {"model": "tiny", "prompt": prompt, "temperature": 0, "ignore_eos": True}
    t = {"client.send": time.time()}
    pr = post(p_url, dict(base, max_tokens=1, kv_transfer_params={"do_remote_decode": True,
                                                                  "do_remote_prefill": False}))
    t["client.prefill_answer"] = time.time()
    t["client.first_token"], t["client.end"] = stream_timed(
        d_url, dict(base, max_tokens=max_tokens, stream=True, kv_transfer_params=pr["kv_transfer_params"]))
    return t


def load_events(path: Path, who: str) -> list[list[dict]]:
    """Events grouped per request id, in order of first appearance."""
    by: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines():
        e = json.loads(line)
        if e["rid"]:
            by.setdefault(e["rid"], []).append(dict(e, ev=f"{who}.{e['ev']}"))
    return list(by.values())


def trace_env(logs_arg: str | None, prefix: str) -> tuple[str, Path, Path, Path, Path, dict] | None:
    """(vLLM python, logs dir, tiny model, prefill trace, decode trace, server env that finds
    ``trace_connector``) -- or None without a vLLM venv; the trace files start empty."""
    env = bench_env(logs_arg, prefix)
    if env is None:
        return None
    py, logs, model = env
    tp, td = logs / "trace_p.jsonl", logs / "trace_d.jsonl"
    for f in (tp, td):
        f.write_text("")
    return py, logs, model, tp, td, {"PYTHONPATH": shim_pythonpath() + ":" + str(REPO / "bench" / "diagnostics")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=12, help="requests (the first is a warm-up; default 12)")
    ap.add_argument("--prompt-len", type=int, default=400, help="tokens per prompt (default 400)")
    ap.add_argument("--max-tokens", type=int, default=32, help="output tokens (default 32)")
    ap.add_argument("--via-proxy", action="store_true", help="send through mooncake_proxy")
    ap.add_argument("--handoff", default="mooncake-core", choices=["vllm", "mooncake-core"],
                    help="the proxy's --handoff with --via-proxy (default mooncake-core: concurrent)")
    ap.add_argument("--logs", default=None, help="directory for logs and traces (default: a temp dir)")
    a = ap.parse_args(argv)
    te = trace_env(a.logs, "trace-vllm-")
    if te is None:
        return 2
    py, logs, model, tp, td, env = te
    servers = [VllmServer(py, model, free_port(), 0, logs / "p.log", cfg("kv_producer", tp), env=env),
               VllmServer(py, model, free_port(), 1, logs / "d.log", cfg("kv_consumer", td), env=env)]
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 300) for _ in range(a.prompt_len)] for _ in range(a.requests)]
    client: list[dict[str, float]] = []
    proxy = None
    try:
        start_all(servers)
        if a.via_proxy:
            proxy, url = start_proxy(servers[0], servers[1], a.handoff, logs / "proxy.log")
        for pr in prompts:
            if a.via_proxy:
                t0 = time.time()
                ttft, e2e, _n = stream_request(url, pr, a.max_tokens)
                client.append({"client.send": t0, "client.first_token": t0 + ttft, "client.end": t0 + e2e})
            else:
                client.append(one(servers[0].url, servers[1].url, pr, a.max_tokens))
            time.sleep(0.05)
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(10)
        for s in servers:
            s.stop()
    pe, de = load_events(tp, "P"), load_events(td, "D")
    rows = []
    for i, c in enumerate(client):
        evs = [{"t": v, "ev": k} for k, v in c.items()]
        evs += pe[i] if i < len(pe) else []
        evs += de[i] if i < len(de) else []
        # first occurrence of each event name, in time order
        first: dict[str, float] = {}
        for e in sorted(evs, key=lambda e: e["t"]):
            first.setdefault(e["ev"], e["t"])
        rows.append(first)
    order = sorted(rows[-1], key=lambda k: statistics.median(r[k] - r["client.send"] for r in rows[1:] if k in r))
    print(f"{len(rows) - 1} requests (warm-up dropped), ms since client.send: median [min..max], "
          f"and the step from the previous event; logs in {logs}")
    prev = None
    for k in order:
        xs = [(r[k] - r["client.send"]) * 1e3 for r in rows[1:] if k in r]
        step = ""
        if prev is not None:
            ds = [(r[k] - r[prev]) * 1e3 for r in rows[1:] if k in r and prev in r]
            step = f"   +{statistics.median(ds):6.2f}"
        print(f"{k:26} {statistics.median(xs):8.2f} [{min(xs):7.2f}..{max(xs):8.2f}]{step}")
        prev = k
    return 0


if __name__ == "__main__":
    sys.exit(main())
