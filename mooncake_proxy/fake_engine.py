"""A small stand-in for a vLLM / SGLang OpenAI server, for tests, benchmarks and dry runs.

It speaks the routes the proxy uses (``/v1/completions``, ``/v1/chat/completions``,
``/generate``, ``/health``, ``/v1/models``), answers a prefill request (``do_remote_decode``)
with ``kv_transfer_params`` as vLLM's NixlConnector does, streams SSE chunks with a configurable
delay, and records what it received so tests can assert on the exact fields. Behaviour can be
changed at run time (``POST /_control``) to fail, hang or fail health checks, and
``GET /_records`` returns what was received — so it works as a separate process too:

    python -m mooncake_proxy.fake_engine --port 8100 --chunks 5 --chunk-delay 0.01
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

_dec = msgspec.json.Decoder()
_enc = msgspec.json.Encoder()


@dataclass
class Behaviour:
    chunks: int = 4              # SSE data chunks per streamed answer
    chunk_delay: float = 0.0     # seconds between chunks
    fail_status: int = 0         # answer completions with this HTTP status (0 = succeed)
    hang: bool = False           # never answer completions (for timeout tests)
    health_status: int = 200     # status of GET /health
    health_delay: float = 0.0    # seconds before answering GET /health (a busy engine)
    prefill_delay: float = 0.0   # extra delay before a non-streamed answer
    first_chunk_delay: float = 0.0  # delay before a stream's first chunk (a decode's KV pull)
    first_chunk_serial: bool = False  # those delays one stream after another (pulls queue up)
    model: str = "fake-model"
    engine_id: str = "fake-engine"
    dp_size: int = 1              # data-parallel ranks reported by the bootstrap /query route
    query_status: int = 200       # status of GET /query (404 = connector without it)
    no_kv_params: bool = False    # prefill answers without kv_transfer_params (its connector held no KV)
    #: engines sharing this Behaviour share cores: while k other prefills run on them, a prefill's
    #: ``prefill_delay`` advances 1 + prefill_contention * k times slower (processor sharing)
    prefill_contention: float = 0.0
    #: a decode sharing a core with the prefills of this Behaviour: while one of them runs, each gap
    #: between chunks is ``chunk_delay`` x ``shared_core_slowdown``
    shares_core_with: "Behaviour | None" = field(default=None, repr=False)
    shared_core_slowdown: float = 1.0
    _prefills_running: int = field(default=0, repr=False)


@dataclass
class Record:
    path: str
    request_id: str | None
    body: dict[str, Any]
    t: float
    cancelled: bool = False
    finished: bool = False
    t_end: float = 0.0
    dp_rank: str | None = None    # X-data-parallel-rank header, if any


@dataclass
class FakeEngine:
    name: str = "fake"
    behaviour: Behaviour = field(default_factory=Behaviour)
    records: list[Record] = field(default_factory=list)
    record: bool = True
    _first_chunk_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
            app.router.add_post(path, self._complete)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/query", self._query)  # MooncakeConnector bootstrap server API
        app.router.add_get("/_records", self._get_records)
        app.router.add_post("/_control", self._control)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        if self.behaviour.health_delay > 0:
            await asyncio.sleep(self.behaviour.health_delay)
        return web.Response(status=self.behaviour.health_status, text="")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.behaviour.model, "object": "model", "owned_by": self.name}]})

    async def _query(self, request: web.Request) -> web.Response:
        b = self.behaviour
        if b.query_status != 200:
            return web.Response(status=b.query_status)
        return web.json_response({str(r): {"engine_id": f"{b.engine_id}-dp{r}"} for r in range(b.dp_size)})

    async def _get_records(self, request: web.Request) -> web.Response:
        return web.json_response([{"path": r.path, "request_id": r.request_id, "body": r.body,
                                   "cancelled": r.cancelled, "finished": r.finished, "dp_rank": r.dp_rank}
                                  for r in self.records])

    async def _control(self, request: web.Request) -> web.Response:
        data = _dec.decode(await request.read())
        for k, v in data.items():
            if k.startswith("_") or not hasattr(self.behaviour, k):
                return web.json_response({"error": f"unknown behaviour field {k!r}"}, status=400)
            setattr(self.behaviour, k, v)
        if data.get("clear_records"):
            self.records.clear()
        return web.json_response({"ok": True})

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = _dec.decode(await request.read())
        rec = Record(request.path, request.headers.get("X-Request-Id"), body, time.monotonic(),
                     dp_rank=request.headers.get("X-data-parallel-rank"))
        if self.record:
            self.records.append(rec)
        b = self.behaviour
        answer_id = _answer_id(request.path, rec.request_id)
        try:
            if b.hang:
                await asyncio.sleep(3600)
            if b.fail_status:
                return web.json_response({"error": {"message": f"{self.name} configured to fail",
                                                    "type": "internal_error", "code": b.fail_status}},
                                         status=b.fail_status)
            params = body.get("kv_transfer_params") or {}
            if not body.get("stream"):
                if b.prefill_delay:
                    b._prefills_running += 1
                    try:
                        if b.prefill_contention:
                            await _shared_core_prefill(b)
                        else:
                            await asyncio.sleep(b.prefill_delay)
                    finally:
                        b._prefills_running -= 1
                out: dict[str, Any] = {"id": answer_id, "object": "text_completion",
                                       "model": b.model, "served_by": self.name,
                                       "choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}
                if params.get("do_remote_decode") and not b.no_kv_params:
                    out["kv_transfer_params"] = {
                        "do_remote_prefill": True, "do_remote_decode": False,
                        "remote_engine_id": b.engine_id, "remote_block_ids": [1, 2, 3],
                        "remote_host": request.host.split(":")[0], "remote_port": 5600,
                        "remote_request_id": rec.request_id}
                rec.finished = True
                rec.t_end = time.monotonic()
                return web.Response(body=_enc.encode(out), content_type="application/json")
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            if b.first_chunk_delay and b.first_chunk_serial:
                async with self._first_chunk_lock:
                    await asyncio.sleep(b.first_chunk_delay)
            elif b.first_chunk_delay:
                await asyncio.sleep(b.first_chunk_delay)
            for i in range(b.chunks):
                if i and b.chunk_delay:
                    other = b.shares_core_with
                    slow = b.shared_core_slowdown if other is not None and other._prefills_running else 1.0
                    await asyncio.sleep(b.chunk_delay * slow)
                chunk = {"id": answer_id, "served_by": self.name, "seq": i,
                         "t": time.time(), "choices": [{"index": 0, "text": f"tok{i} "}]}
                await resp.write(b"data: " + _enc.encode(chunk) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            rec.finished = True
            rec.t_end = time.monotonic()
            return resp
        except asyncio.CancelledError:
            rec.cancelled = True
            raise


def _answer_id(path: str, request_id: str | None) -> str:
    """The ``id`` vLLM's OpenAI server gives an answer: its route's prefix on the caller's
    ``X-Request-Id`` (a random one without it), so ids look as a client behind the proxy sees them."""
    prefix = "chatcmpl-" if path.endswith("/chat/completions") else "cmpl-"
    return prefix + (request_id or uuid.uuid4().hex)


async def _shared_core_prefill(b: Behaviour) -> None:
    """``b.prefill_delay`` of work done at the speed the other running prefills leave (see
    ``Behaviour.prefill_contention``; the caller counts this one in ``_prefills_running``), in 5 ms
    steps."""
    done, t = 0.0, time.monotonic()
    while done < b.prefill_delay:
        await asyncio.sleep(0.005)
        now = time.monotonic()
        done += (now - t) / (1.0 + b.prefill_contention * (b._prefills_running - 1))
        t = now


async def start_fake(engine: FakeEngine, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, int]:
    """Start in the running loop; returns (runner, bound port)."""
    runner = web.AppRunner(engine.make_app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    return runner, runner.addresses[0][1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Fake vLLM/SGLang-like engine for proxy tests and benchmarks")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=0, help="port (0 = any; the chosen one is printed)")
    p.add_argument("--name", default="fake", help="name reported in answers (served_by)")
    p.add_argument("--chunks", type=int, default=4, help="SSE chunks per streamed answer")
    p.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between chunks")
    p.add_argument("--no-record", action="store_true", help="do not keep received requests (benchmarks)")
    a = p.parse_args(argv)
    try:
        import uvloop  # type: ignore[import-not-found]

        uvloop.install()
    except ImportError:
        pass
    eng = FakeEngine(a.name, Behaviour(chunks=a.chunks, chunk_delay=a.chunk_delay), record=not a.no_record)

    async def run() -> None:
        runner, port = await start_fake(eng, a.host, a.port)
        print(f"fake_engine listening on http://{a.host}:{port}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
