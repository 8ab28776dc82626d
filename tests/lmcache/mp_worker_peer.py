"""An engine worker of LMCache's multiprocess mode, in the LMCache venv: a CPU paged KV cache
registered with an LMCache MP server through LMCache's own client classes (``RequestClientFactory``,
``create_transfer_context`` in ``lmcache_driven`` mode: the CPU device spec's POSIX shared-memory
KV wrappers), driven over stdin/stdout with one JSON command per line.

Commands: ``store`` (requests' chunks from their source blocks), ``lookup`` (chunks hit, L1 or
L2), ``retrieve`` (into other blocks; ``exact`` says whether they now equal the source blocks).
Request ``r`` uses source blocks ``[r * B, (r + 1) * B)`` and destination blocks
``[(R + r) * B, ...)``: B blocks per request, R requests.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from lmcache.utils import EngineType
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.group_view import EngineGroupInfo
from lmcache.v1.multiprocess.transfer_context import create_transfer_context
from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

MODEL = "mooncake-l2-test"
TIMEOUT = 30.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--chunks", type=int, default=2, help="chunks per request")
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    blocks_in_chunk = a.chunk_size // a.block_size
    per_req = a.chunks * blocks_in_chunk
    nb = 2 * a.requests * per_req + 1  # block 0 is LMCache's null block
    g = torch.Generator().manual_seed(a.seed)
    kv = {f"layer.{i}": torch.randn((2, nb, a.block_size, 2, 32), generator=g, dtype=torch.float16)
          for i in range(a.layers)}
    client = RequestClientFactory.create(a.url)
    ctx = create_transfer_context(kv, instance_id=4242, req_client=client, mode="lmcache_driven")
    # a generous first wait: the worker may start together with the server (ZeroMQ holds the request)
    ctx.register(kv, MODEL, 1, blocks_in_chunk, 4 * TIMEOUT, layout_hints={"kv_layout": "NHD"},
                 engine_group_infos=[EngineGroupInfo(0, tuple(range(a.layers)), a.block_size)],
                 engine_type=EngineType.VLLM)

    def tokens(r: int) -> tuple[int, ...]:
        return tuple((r * 7919 + t * 31) % 30000 for t in range(a.chunks * a.chunk_size))

    def key(r: int, rid: str) -> IPCCacheServerKey:
        return IPCCacheServerKey(model_name=MODEL, world_size=1, num_kv_readers=1, worker_id=0,
                                 token_ids=tokens(r), start=0, end=a.chunks * a.chunk_size, request_id=rid)

    def blocks(r: int, dest: bool) -> list[int]:
        first = 1 + ((a.requests + r) if dest else r) * per_req
        return list(range(first, first + per_req))

    print(json.dumps({"ready": True, "kv_bytes": sum(t.numel() * t.element_size() for t in kv.values())}),
          flush=True)
    n = 0
    for line in sys.stdin:
        cmd = json.loads(line)
        op, reqs = cmd.get("op"), cmd.get("requests", [])
        n += 1
        try:
            if op == "exit":
                break
            if op == "store":
                ok = []
                for r in reqs:
                    ev = ctx.create_recorded_event()
                    fut = ctx.submit_store(f"s{n}-{r}", key(r, f"s{n}-{r}"), kv, [blocks(r, False)], ev,
                                           blocks_in_chunk)
                    ok.append(bool(fut.result(timeout=TIMEOUT)))
                out = {"stored": ok}
            elif op == "lookup":
                hits = []
                for r in reqs:
                    rid = f"l{n}-{r}"
                    client.lookup(key(r, rid), 1).result(timeout=TIMEOUT)
                    deadline, got = time.monotonic() + TIMEOUT, None
                    while got is None and time.monotonic() < deadline:
                        got = client.query_prefetch_status(rid).result(timeout=TIMEOUT)
                        if got is None:
                            time.sleep(0.05)
                    hits.append(got)
                out = {"hits": hits}
            elif op == "retrieve":
                exact = []
                for r in reqs:
                    rid = f"l{cmd['lookup_n']}-{r}"  # the lookup that prefetched (and locked) them
                    dst = blocks(r, True)
                    for t in kv.values():
                        t[:, dst].zero_()
                    ev = ctx.create_recorded_event()
                    fut = ctx.submit_retrieve(rid, key(r, rid), kv, [dst], ev, blocks_in_chunk)
                    res = fut.result(timeout=TIMEOUT)
                    same = all(torch.equal(t[:, blocks(r, False)], t[:, dst]) for t in kv.values())
                    exact.append({"result": repr(res), "exact": same})
                out = {"retrieved": exact}
            else:
                out = {"error": f"unknown op {op!r}"}
        except Exception as e:  # the driver reports it with this peer's log
            out = {"error": f"{type(e).__name__}: {e}"}
        out["n"] = n
        print(json.dumps(out), flush=True)
    try:
        fut = ctx.unregister()
        if fut is not None:
            fut.result(timeout=TIMEOUT)
    finally:
        ctx.close()
        client.close()


if __name__ == "__main__":
    main()
