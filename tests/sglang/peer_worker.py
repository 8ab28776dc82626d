"""An in-test SGLang PD worker: SGLang's HTTP surface the router talks to, SGLang's real Mooncake
KV manager behind it, our engine underneath -- no model (none runs on this CPU).

Run by tests/sglang/test_sglang_router.py with the SGLang venv's python, for sglang-router's PD
mode (``--pd-disaggregation --prefill URL BOOTSTRAP_PORT --decode URL``). The router injects
``bootstrap_host`` / ``bootstrap_port`` / ``bootstrap_room`` into each ``/generate`` body and sends
it to one prefill and one decode worker at once; here the prefill worker creates a sender for
that room and pushes ``--pages-per-req`` random KV pages, and the decode worker creates a
receiver against the bootstrap address the router gave it and answers with the SHA-256 of the
pages it received. ``GET /kv_digest?room=R`` on the prefill worker returns the digest of what it
sent, so the test can check the hand-off byte for byte through the router.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sglang_side import build_side, failure_text, wait_states


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=["prefill", "decode"], required=True, help="worker role")
    p.add_argument("--http-port", type=int, required=True, help="HTTP port the router talks to")
    p.add_argument("--bootstrap-port", type=int, default=0, help="prefill: bootstrap server port")
    p.add_argument("--pages", type=int, default=64, help="KV pages per buffer")
    p.add_argument("--layers", type=int, default=2, help="layers (2 KV buffers each)")
    p.add_argument("--page-bytes", type=int, default=4096, help="bytes of one page in one buffer")
    p.add_argument("--pages-per-req", type=int, default=4, help="pages each request hands off")
    p.add_argument("--seed", type=int, default=3, help="random fill seed")
    p.add_argument("--deadline", type=float, default=60.0, help="per-request deadline (s)")
    a = p.parse_args(argv)
    import numpy as np
    from aiohttp import web

    side = build_side(a.role, a.bootstrap_port, layers=a.layers, pages=a.pages, page_bytes=a.page_bytes,
                      seed=a.seed, http_port=a.http_port)
    KVPoll = side.KVPoll
    lock = threading.Lock()
    free_pages = list(range(a.pages))
    free_rows = list(range(8))
    digests: dict[int, str] = {}
    rng = np.random.default_rng(a.seed)

    def take(k: int) -> tuple[list[int], int]:
        with lock:
            if len(free_pages) < k or not free_rows:
                raise RuntimeError("worker out of KV pages / metadata rows")
            idx = sorted(rng.choice(len(free_pages), k, replace=False).tolist(), reverse=True)
            pages = [free_pages.pop(i) for i in idx]
            return pages, free_rows.pop(0)

    def give(pages: list[int], row: int) -> None:
        with lock:
            free_pages.extend(pages)
            free_rows.append(row)

    def digest(pages: list[int]) -> str:
        h = hashlib.sha256()
        for t in side.kv:
            buf = t.numpy().reshape(a.pages, a.page_bytes)
            for pg in pages:
                h.update(buf[pg].tobytes())
        return h.hexdigest()

    def handoff(body: dict) -> dict:
        room = int(body["bootstrap_room"])
        addr = f"{body['bootstrap_host']}:{body['bootstrap_port']}"
        deadline = time.monotonic() + a.deadline
        pages, row = take(a.pages_per_req)
        try:
            if a.role == "prefill":
                snd = side.sender_cls(side.mgr, addr, room)
                st = wait_states([snd], KVPoll.WaitingForInput, KVPoll.Failed, deadline, "decode metadata")[0]
                if st == KVPoll.Failed:
                    raise RuntimeError(failure_text(snd))
                digests[room] = digest(pages)
                snd.init(len(pages), row)
                snd.send(np.asarray(pages, dtype=np.int32))
                st = wait_states([snd], KVPoll.Success, KVPoll.Failed, deadline, "transfer")[0]
                if st != KVPoll.Success:
                    raise RuntimeError(failure_text(snd))
                snd.clear()
                return {"text": "", "meta_info": {"id": body.get("rid", str(room)), "completion_tokens": 1,
                                                  "finish_reason": {"type": "length", "length": 1}}}
            while not side.mgr.try_ensure_parallel_info(addr):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"prefill bootstrap {addr} never became ready")
                time.sleep(0.1)
            rcv = side.receiver_cls(side.mgr, addr, room)
            rcv.init(0)
            wait_states([rcv], KVPoll.WaitingForInput, KVPoll.Failed, deadline, "bootstrap")
            rcv.send_metadata(np.asarray(pages, dtype=np.int32), row, None)
            st = wait_states([rcv], KVPoll.Success, KVPoll.Failed, deadline, "KV pages")[0]
            if st != KVPoll.Success:
                raise RuntimeError(failure_text(rcv))
            d = digest(pages)
            rcv.clear()
            return {"text": f"kv:{d}", "meta_info": {"id": body.get("rid", str(room)), "kv_sha256": d,
                                                     "bootstrap_room": room, "completion_tokens": 1,
                                                     "finish_reason": {"type": "length", "length": 1}}}
        finally:
            give(pages, row)

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        missing = [k for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room") if k not in body]
        if missing:
            return web.json_response({"error": f"missing {missing} (not routed in PD mode?)"}, status=400)
        try:
            out = await asyncio.get_running_loop().run_in_executor(None, handoff, body)
        except Exception as e:  # noqa: BLE001 - any failure becomes the request's 500 answer
            return web.json_response({"error": str(e)}, status=500)
        return web.json_response(out)

    async def ok(_request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def model_info(_request: web.Request) -> web.Response:
        return web.json_response({"model_path": "dummy", "tokenizer_path": None, "is_generation": True})

    async def server_info(_request: web.Request) -> web.Response:
        return web.json_response({"model_path": "dummy", "disaggregation_mode": a.role,
                                  "disaggregation_bootstrap_port": a.bootstrap_port})

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "dummy", "object": "model"}]})

    async def kv_digest(request: web.Request) -> web.Response:
        room = int(request.query["room"])
        return web.json_response({"room": room, "kv_sha256": digests.get(room)})

    app = web.Application()
    app.router.add_post("/generate", generate)
    for path in ("/health", "/health_generate"):
        app.router.add_get(path, ok)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/model_info", model_info)
    app.router.add_get("/get_server_info", server_info)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/kv_digest", kv_digest)
    print(json.dumps({"event": "ready", "role": a.role, "http_port": a.http_port}), flush=True)
    web.run_app(app, host="127.0.0.1", port=a.http_port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
