"""A DistServe node built from LMDeploy 0.18's real pieces; only the model and scheduler are stand-ins.

Runs in the LMDeploy venv (started by lmdeploy_scenario.py). Real LMDeploy code on the PD path:

* the ``/distserve/*`` routes (``lmdeploy.serve.openai.endpoints.distserve.register``) over the real
  ``AsyncEngine`` -> ``Engine`` -> ``EngineP2PConnection`` -> ``UniExecutor`` -> ``CacheEngine``
  methods (objects made with ``__new__``, since their constructors load a model onto a GPU);
* a ``CacheEngine`` over a CPU pool realised by LMDeploy's ``PackedBlockCacheLayout``
  (``(num_layers, num_blocks, block_bytes)`` uint8, entry axis 1), so ``p2p_initialize`` /
  ``p2p_connect`` / ``migrate`` and the assignment planning are LMDeploy's;
* the decode's migration step is ``EngineLoop._migration_loop_migrate`` (migrate, then the ZMQ
  free message to the prefill, received by the prefill's ``EngineP2PConnection.handle_zmq_recv``
  which calls ``Engine.end_session``);
* the migration backend is whatever ``MIGRATION_BACKENDS.module_dict['Mooncake']`` is after
  ``import mooncake_connectors.lmdeploy`` (ours, or LMDeploy's own with
  ``MOONCAKE_LMDEPLOY_BACKEND=lmdeploy``; the latter needs an ``ibv_devices`` on PATH);
* request/response models (``CompletionRequest``, ``CompletionResponse``, ``MigrationRequest``,
  ``create_error_response``) and the node registration body of ``register_to_proxy``.

Stand-ins (test code): a block allocator with sessions (the scheduler) and a "model" that writes
random KV into the prefill's blocks and, on the decode, answers with digests of the KV it holds
after migration -- so a completion through the proxy shows which bytes arrived. When a migration
raises, the stand-in does what LMDeploy 0.18's migration loop does not (it lets the exception end
its loop): it fails that request, frees the decode's blocks and sends the prefill the usual free
message.

Test-only endpoints: ``/test/state`` (free blocks, sessions, counters), ``/test/digests``,
``/test/pause_next`` + ``/test/go`` (hold the next migration until told to go, so the scenario can
freeze or kill the prefill mid-migration), ``/test/backend``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import sys
import time
from types import SimpleNamespace
from typing import Any

import mooncake_connectors.lmdeploy  # noqa: F401  (registers the Mooncake backend; LMDeploy has no plugin hook)
import lmdeploy.pytorch.engine  # noqa: E402,F401  (before engine_conn: LMDeploy's circular import)
import numpy as np
import requests
import torch
import uvicorn
from fastapi import APIRouter, FastAPI, Request
from lmdeploy.messages import PytorchEngineConfig
from lmdeploy.pytorch.config import CacheConfig
from lmdeploy.pytorch.disagg.backend.backend import MIGRATION_BACKENDS
from lmdeploy.pytorch.disagg.config import EngineRole, MigrationBackend
from lmdeploy.pytorch.disagg.conn.engine_conn import EngineP2PConnection
from lmdeploy.pytorch.disagg.conn.protocol import MigrationRequest
from lmdeploy.pytorch.engine.cache_engine import CacheEngine
from lmdeploy.pytorch.engine.cache_engine.layout import PackedBlockCacheLayout
from lmdeploy.pytorch.engine.cache_engine.schema import CacheDesc, CacheTensorSpec
from lmdeploy.pytorch.engine.engine import Engine
from lmdeploy.pytorch.engine.engine_loop import EngineLoop
from lmdeploy.pytorch.engine.executor.uni_executor import UniExecutor
from lmdeploy.serve.core.async_engine import AsyncEngine
from lmdeploy.serve.openai.endpoints import distserve
from lmdeploy.serve.openai.errors import create_error_response
from lmdeploy.serve.openai.protocol import CompletionRequest, CompletionResponse, CompletionResponseChoice, UsageInfo

BLOCK_TOKENS = 16
MODEL = "tiny-standin"


def emit(event: str, **kw: Any) -> None:
    print(json.dumps({"event": event, **kw}), flush=True)


class StandInScheduler:
    """Blocks and sessions, the parts of LMDeploy's scheduler the PD path touches."""

    def __init__(self, num_blocks: int, seed: int, scatter: bool):
        self.num_blocks = num_blocks
        self.free_ids = list(range(num_blocks))
        self.rng = np.random.default_rng(seed)
        self.scatter = scatter  # decode: random free blocks; prefill: lowest free ids (runs merge)
        self.sessions: dict[int, SimpleNamespace] = {}
        self.next_id = 1
        self.ended: list[int] = []

    def alloc(self, n: int) -> list[int]:
        if n > len(self.free_ids):
            raise RuntimeError(f"out of KV blocks: need {n}, {len(self.free_ids)} free")
        if self.scatter:
            pick = sorted(self.rng.choice(len(self.free_ids), size=n, replace=False).tolist(), reverse=True)
            out = [self.free_ids.pop(i) for i in pick]
        else:
            self.free_ids.sort()
            out, self.free_ids = self.free_ids[:n], self.free_ids[n:]
        return out

    def new_session(self, blocks: list[int]) -> SimpleNamespace:
        s = SimpleNamespace(session_id=self.next_id, blocks=blocks, sequences={})
        self.next_id += 1
        self.sessions[s.session_id] = s
        return s

    # what Engine.end_session calls
    def get_session(self, session_id: int) -> SimpleNamespace | None:
        return self.sessions.get(session_id)

    def end_session(self, session_id: int) -> None:
        s = self.sessions.pop(session_id)
        self.free_ids.extend(s.blocks)
        self.ended.append(session_id)

    # what EngineLoop._migration_loop_migrate calls
    def get_block_tables(self, seqs: list[Any]) -> list[list[int]]:
        return [seq.block_ids for seq in seqs]


def make_cache_engine(role: EngineRole, layers: int, blocks: int, entry_bytes: int,
                      seed: int) -> tuple[CacheEngine, torch.Tensor]:
    """A real ``CacheEngine`` (made with ``__new__``: its constructor needs a CUDA stream) over a CPU
    pool realised by LMDeploy's own ``PackedBlockCacheLayout``, filled with random bytes."""
    half = entry_bytes // 2
    layout = PackedBlockCacheLayout(tensor_specs=(CacheTensorSpec("k_cache", CacheDesc([half], torch.uint8)),
                                                  CacheTensorSpec("v_cache", CacheDesc([half], torch.uint8))),
                                    num_layers=layers)
    allocation = layout.allocate(blocks, "cpu")
    pool = allocation.pools[0].tensor  # (layers, blocks, entry bytes): LMDeploy's PD layout
    pool.copy_(torch.randint(0, 256, pool.shape, dtype=torch.uint8,
                             generator=torch.Generator().manual_seed(seed)))  # no block starts out as zeros
    cache_config = CacheConfig(max_batches=8, block_size=BLOCK_TOKENS, num_cpu_blocks=0, num_gpu_blocks=blocks,
                               role=role, migration_backend=MigrationBackend.Mooncake)
    ce = CacheEngine.__new__(CacheEngine)
    ce.rank, ce.tp_rank, ce.cache_config, ce.gpu_allocation = 0, 0, cache_config, allocation
    ce.migration_backend_impl, ce._pd_cache_pool_infos, ce._remote_pd_cache_pool_infos = None, None, {}
    return ce, pool


def build(args: argparse.Namespace) -> tuple[FastAPI, dict[str, Any]]:
    role = EngineRole[args.role]
    ce, pool = make_cache_engine(role, args.layers, args.blocks, args.entry_bytes, args.seed)

    sched = StandInScheduler(args.blocks, args.seed, scatter=role == EngineRole.Decode)
    executor = UniExecutor.__new__(UniExecutor)
    executor.model_agent = SimpleNamespace(cache_engine=ce)
    engine = Engine.__new__(Engine)
    engine.scheduler, engine.executor = sched, executor
    engine.engine_conn = EngineP2PConnection(engine)
    async_engine = AsyncEngine.__new__(AsyncEngine)
    async_engine.engine = engine
    loop_obj = EngineLoop.__new__(EngineLoop)
    loop_obj.scheduler, loop_obj.executor, loop_obj.engine_conn = sched, executor, engine.engine_conn

    engine_config = PytorchEngineConfig(tp=1, dp=1, ep=1, block_size=BLOCK_TOKENS, num_cpu_blocks=0,
                                        num_gpu_blocks=args.blocks, role=role,
                                        migration_backend=MigrationBackend.Mooncake)
    ctx = SimpleNamespace(engine_config=engine_config, async_engine=async_engine)
    url = f"http://127.0.0.1:{args.port}"

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        if args.proxy_url:  # the body LMDeploy's register_to_proxy posts (role: 2 Prefill, 3 Decode)
            r = await asyncio.to_thread(requests.post, f"{args.proxy_url}/nodes/add", timeout=10, json={
                "url": url, "status": {"models": [MODEL], "role": role.value}})
            r.raise_for_status()
        cls = MIGRATION_BACKENDS.module_dict["Mooncake"]
        emit("ready", url=url, pid=os.getpid(), backend=f"{cls.__module__}.{cls.__qualname__}")
        yield

    app = FastAPI(lifespan=lifespan)
    router = APIRouter()
    distserve.register(router, ctx)  # the real /distserve/* routes
    app.include_router(router)

    state: dict[str, Any] = {"requests": 0, "migrations": 0, "failed": 0, "paused": False, "go": None,
                             "pause_next": False, "decodes": [], "prefills": {}, "errors": [], "failures": []}

    def block_digests(ids: list[int]) -> list[str]:
        return [hashlib.sha256(pool[:, b, :].numpy().tobytes()).hexdigest()[:16] for b in ids]

    def all_digests() -> list[str]:
        return block_digests(list(range(args.blocks)))

    def tokens_of(prompt: str) -> list[int]:
        return list(prompt.encode())

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/test/state")
    async def test_state() -> dict[str, Any]:
        backend = ce.migration_backend_impl
        holder = getattr(backend, "_holder", None)
        return {"free_blocks": len(sched.free_ids), "num_blocks": args.blocks,
                "sessions": sorted(sched.sessions), "ended": sched.ended, "requests": state["requests"],
                "migrations": state["migrations"], "failed": state["failed"], "paused": state["paused"],
                "links": sorted(getattr(backend, "links", {}) or {}),
                "engine_users": holder.users if holder is not None else None,
                "registered": len(holder.registered()) if holder is not None else None,
                "decodes": state["decodes"], "prefills": state["prefills"], "errors": state["errors"],
                "failures": state["failures"]}

    @app.get("/test/backend")
    async def test_backend() -> dict[str, Any]:
        cls = MIGRATION_BACKENDS.module_dict.get("Mooncake")
        impl = ce.migration_backend_impl
        return {"registered": f"{cls.__module__}.{cls.__qualname__}",
                "instance": type(impl).__module__ + "." + type(impl).__qualname__ if impl else None}

    @app.get("/test/digests")
    async def test_digests() -> list[str]:
        return all_digests()

    @app.post("/test/pause_next")
    async def pause_next() -> dict[str, bool]:
        state["pause_next"] = True
        return {"ok": True}

    @app.post("/test/go")
    async def go() -> dict[str, bool]:
        if state["go"] is not None:
            state["go"].set()
        return {"ok": state["go"] is not None}

    async def prefill(req: CompletionRequest, tokens: list[int]) -> dict[str, Any]:
        n = max(1, -(-len(tokens) // BLOCK_TOKENS))
        blocks = sched.alloc(n)
        sess = sched.new_session(blocks)
        # the stand-in model: this prompt's KV, different for every request
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + sess.session_id)
        for b in blocks:
            pool[:, b, :] = torch.randint(0, 256, (args.layers, pool.shape[2]), dtype=torch.uint8, generator=g)
        digests = block_digests(blocks)
        state["prefills"][str(sess.session_id)] = {"blocks": blocks, "digests": digests}
        first = int(digests[0][:2], 16)
        resp = CompletionResponse(id=str(sess.session_id), model=req.model,
                                  choices=[CompletionResponseChoice(index=0, text=f"<{first}>", finish_reason="length")],
                                  usage=UsageInfo(prompt_tokens=len(tokens), completion_tokens=1,
                                                  total_tokens=len(tokens) + 1)).model_dump()
        resp["cache_block_ids"] = blocks
        resp["remote_token_ids"] = [first]
        return resp

    async def decode(req: CompletionRequest, mr: MigrationRequest, tokens: list[int]) -> Any:
        blocks = sched.alloc(len(mr.remote_block_ids))
        sess = sched.new_session(blocks)
        msg = SimpleNamespace(session_id=sess.session_id, migration_request=mr, block_ids=blocks)
        before = all_digests()
        if state["pause_next"]:
            state["pause_next"], state["paused"], state["go"] = False, True, asyncio.Event()
            emit("paused", session_id=sess.session_id)
            await state["go"].wait()
            state["paused"], state["go"] = False, None
        t0 = time.monotonic()
        try:
            await loop_obj._migration_loop_migrate([msg])  # LMDeploy's: migrate, then tell the prefill to free
        except Exception as e:  # LMDeploy 0.18 would end its migration loop here; fail this request only
            took = time.monotonic() - t0
            state["failed"] += 1
            sched.end_session(sess.session_id)
            try:
                await asyncio.wait_for(engine.engine_conn.zmq_send(remote_engine_id=mr.remote_engine_id,
                                                                   remote_session_id=mr.remote_session_id), 1)
            except Exception as ze:  # the prefill is gone: nothing left to free there
                state["errors"].append(f"free after failure not sent: {ze!r}")
            err = f"{type(e).__name__}: {e}"
            state["errors"].append(err)
            state["failures"].append({"error": err, "seconds": took})
            emit("migration_failed", error=err, seconds=took)
            return create_error_response(500, f"KV migration failed after {took:.2f} s: {err}")
        took = time.monotonic() - t0
        state["migrations"] += 1
        after = all_digests()
        changed = [i for i in range(args.blocks) if before[i] != after[i]]
        got = block_digests(blocks)
        state["decodes"].append({"remote_session_id": mr.remote_session_id, "remote_engine_id": mr.remote_engine_id,
                                 "remote_block_ids": mr.remote_block_ids, "local_block_ids": blocks,
                                 "digests": got, "changed": changed, "seconds": took})
        text = "kv=" + ",".join(got)  # the stand-in model "generates" from the KV it holds
        sched.end_session(sess.session_id)  # generation done: the decode frees its blocks
        return CompletionResponse(id=str(sess.session_id), model=req.model,
                                  choices=[CompletionResponseChoice(index=0, text=text, finish_reason="length")],
                                  usage=UsageInfo(prompt_tokens=len(tokens), completion_tokens=len(got),
                                                  total_tokens=len(tokens) + len(got))).model_dump()

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Any:
        body = await raw.json()
        migration_request = body.pop("migration_request", None)
        with_cache = body.pop("with_cache", False)
        body.pop("preserve_cache", None)
        req = CompletionRequest.model_validate(body)
        state["requests"] += 1
        prompt = req.prompt if isinstance(req.prompt, str) else str(req.prompt[0])
        tokens = tokens_of(prompt)
        if migration_request:
            return await decode(req, MigrationRequest.model_validate(migration_request), tokens)
        if with_cache:
            return await prefill(req, tokens)
        return create_error_response(400, "this stand-in node serves DistServe requests only")

    return app, {"pool": pool, "engine": engine}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", choices=["Prefill", "Decode"], required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--proxy-url", default="")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=48)
    ap.add_argument("--entry-bytes", type=int, default=4096, help="bytes per block per layer (k + v)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    app, _ = build(args)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    sys.exit(main())
