"""Proxy overhead benchmark: direct vs. our proxy vs. a minimal FastAPI+httpx forwarder.

One run measures, against the same fake engine processes (prefill + decode, each its own
process, streaming SSE answers):

* ``direct``: the client calls the decode engine itself (one request, no hand-off);
* ``mooncake_proxy``: our proxy (vllm hand-off: prefill with max_tokens=1, then decode);
* ``toy_fastapi``: a FastAPI + httpx + uvicorn forwarder doing the same two calls the way vLLM's
  ``toy_proxy_server.py`` does (written here from that description, not copied).

For each: sequential latency (p50/p99 over ``--requests``), then max requests/s with
``--concurrency`` concurrent streams for ``--duration`` seconds. Prints added p50/p99 (vs direct)
and the req/s ratio of our proxy to the toy forwarder. Targets: added p50 < 2 ms; ratio ≥ 1.5.

    python3 -m bench.proxy.bench_proxy                 # ~1 minute
    python3 -m bench.proxy.bench_proxy --quick         # ~20 s smoke run
"""



import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

import numpy as np

from mooncake_core.utils.net import free_port
from mooncake_core.utils.proc import spawn_until, stop_process

PY = sys.executable


# ----------------------------------------------------------------------------- toy forwarder
def serve_toy(host: str, port: int, prefill: str, decode: str) -> None:
    """vLLM-toy-proxy-style forwarder: FastAPI app, one pooled httpx client per instance."""
    import httpx
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse

    app = FastAPI()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    pclient = httpx.AsyncClient(timeout=None, base_url=prefill, limits=limits)
    dclient = httpx.AsyncClient(timeout=None, base_url=decode, limits=limits)

    async def handle(api: str, request: Request):
        body = await request.json()
        rid = request.headers.get("X-Request-Id") or os.urandom(8).hex()
        pbody = dict(body, stream=False, max_tokens=1,
                     kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False,
                                         "remote_engine_id": None, "remote_block_ids": None,
                                         "remote_host": None, "remote_port": None})
        pbody.pop("stream_options", None)
        r = await pclient.post(api, json=pbody, headers={"X-Request-Id": rid})
        r.raise_for_status()
        params = r.json().get("kv_transfer_params")
        dbody = dict(body)
        if params:
            dbody["kv_transfer_params"] = params

        async def gen():
            async with dclient.stream("POST", api, json=dbody, headers={"X-Request-Id": rid}) as resp:
                resp.raise_for_status()
                async for chunk in resp.aiter_bytes():
                    yield chunk

        return StreamingResponse(gen(), media_type="application/json")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle("/v1/completions", request)

    print(f"toy_fastapi listening on http://{host}:{port}", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


# ----------------------------------------------------------------------------- processes
def spawn(args, pattern: str, timeout: float = 30):
    proc, m = spawn_until([PY, "-u", *args], pattern + r" listening on http://[^:]+:(\d+)", timeout,
                          env={**os.environ, "MC_LOG_LEVEL": "WARNING"}, what=pattern)
    return proc, int(m.group(1))


# ----------------------------------------------------------------------------- load
async def one(session, url: str, body: bytes) -> float:
    t = time.perf_counter()
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}: {await r.text()}")
        async for _ in r.content.iter_any():
            pass
    return time.perf_counter() - t


async def measure(url: str, n_seq: int, duration: float, concurrency: int) -> dict:
    import aiohttp

    body = json.dumps({"model": "m", "prompt": "benchmark prompt " * 64, "max_tokens": 16,
                       "stream": True}).encode()
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:
        for _ in range(50):  # warm-up: connections, JIT-ish caches
            await one(s, url, body)
        lat = [await one(s, url, body) for _ in range(n_seq)]
        done = 0
        stop = time.perf_counter() + duration

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                await one(s, url, body)
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    a = np.asarray(lat) * 1000
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "rps": done / wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=400, help="sequential requests for latency percentiles")
    ap.add_argument("--duration", type=float, default=6.0, help="seconds of the concurrent throughput phase")
    ap.add_argument("--concurrency", type=int, default=64, help="concurrent streams in the throughput phase")
    ap.add_argument("--chunks", type=int, default=4, help="SSE chunks per fake decode answer")
    ap.add_argument("--quick", action="store_true", help="short smoke run (100 requests, 2 s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--serve-toy", nargs=3, metavar=("PORT", "PREFILL_URL", "DECODE_URL"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve_toy:
        serve_toy("127.0.0.1", int(a.serve_toy[0]), a.serve_toy[1], a.serve_toy[2])
        return 0
    if a.quick:
        a.requests, a.duration = 100, 2.0
    try:
        import uvloop  # type: ignore[import-not-found]

        uvloop.install()
    except ImportError:
        pass
    procs: list[subprocess.Popen] = []
    try:
        pre, pport = spawn(["-m", "mooncake_proxy.fake_engine", "--no-record", "--chunks", str(a.chunks)],
                           "fake_engine")
        procs.append(pre)
        dec, dport = spawn(["-m", "mooncake_proxy.fake_engine", "--no-record", "--chunks", str(a.chunks)],
                           "fake_engine")
        procs.append(dec)
        purl, durl = f"http://127.0.0.1:{pport}", f"http://127.0.0.1:{dport}"
        prox, xport = spawn(["-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", "0",
                             "--prefill", purl, "--decode", durl, "--policy", "round_robin"], "mooncake_proxy")
        procs.append(prox)
        toy_port = free_port()
        toy, tport = spawn([os.path.abspath(__file__), "--serve-toy", str(toy_port), purl, durl], "toy_fastapi")
        procs.append(toy)
        from mooncake_core.utils.net import wait_for_port

        wait_for_port("127.0.0.1", tport, 30, toy)  # uvicorn prints before it binds
        targets = {"direct": durl, "mooncake_proxy": f"http://127.0.0.1:{xport}",
                   "toy_fastapi": f"http://127.0.0.1:{tport}"}
        res = {}
        for name, base in targets.items():
            res[name] = asyncio.run(measure(base + "/v1/completions", a.requests, a.duration, a.concurrency))
            if not a.json:
                r = res[name]
                print(f"{name:>15}: p50 {r['p50_ms']:7.3f} ms  p99 {r['p99_ms']:7.3f} ms  "
                      f"{r['rps']:8.1f} req/s ({a.concurrency} streams)", flush=True)
    finally:
        for p in procs:
            stop_process(p, 5)
    d, m, t = res["direct"], res["mooncake_proxy"], res["toy_fastapi"]
    summary = {
        **{f"{k}_{m_}": v[m_] for k, v in res.items() for m_ in v},
        "proxy_added_p50_ms": m["p50_ms"] - d["p50_ms"],
        "proxy_added_p99_ms": m["p99_ms"] - d["p99_ms"],
        "toy_added_p50_ms": t["p50_ms"] - d["p50_ms"],
        "toy_added_p99_ms": t["p99_ms"] - d["p99_ms"],
        "rps_ratio_proxy_vs_toy": m["rps"] / t["rps"] if t["rps"] else float("inf"),
        "latency_ratio_toy_vs_proxy_added_p50": ((t["p50_ms"] - d["p50_ms"]) / (m["p50_ms"] - d["p50_ms"])
                                                 if m["p50_ms"] > d["p50_ms"] else float("inf")),
    }
    if a.json:
        print(json.dumps(summary))
    else:
        print(f"added latency (vs direct; includes the prefill round trip of the PD hand-off):\n"
              f"  mooncake_proxy p50 +{summary['proxy_added_p50_ms']:.3f} ms  p99 +{summary['proxy_added_p99_ms']:.3f} ms"
              f"   (target p50 < 2 ms)\n"
              f"  toy_fastapi    p50 +{summary['toy_added_p50_ms']:.3f} ms  p99 +{summary['toy_added_p99_ms']:.3f} ms\n"
              f"requests/s ratio mooncake_proxy / toy_fastapi: {summary['rps_ratio_proxy_vs_toy']:.2f}x"
              f"   (target >= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
