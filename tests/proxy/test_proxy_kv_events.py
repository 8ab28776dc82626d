"""vLLM KV cache events (ZMQ PUB, msgpack KVEventBatch) keep the proxy's prefix index in sync."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import msgspec
import pytest
import zmq

from mooncake_core.utils.net import free_port
from mooncake_proxy.kv_events import KvEventApplier, continue_chain, parse_config
from mooncake_proxy.scheduling import BlockHasher, ClusterState, InstanceInfo


# vLLM's wire format (vllm/distributed/kv_events.py), re-declared as a test fixture.
class _Ev(msgspec.Struct, tag=True, omit_defaults=True):
    pass


class BlockStored(_Ev):
    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


class BlockRemoved(_Ev):
    block_hashes: list[Any]
    medium: str | None = None


class AllBlocksCleared(_Ev):
    pass


class KVEventBatch(msgspec.Struct, omit_defaults=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


class KVEventBatchArray(msgspec.Struct, array_like=True):  # older vLLM encoding
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


def test_continue_chain_matches_block_hasher() -> None:
    for bs in (1, 4, 16):
        h = BlockHasher(block_size=bs, seed="m")
        toks = [random.randrange(-2**40, 2**40) for _ in range(bs * 5)]
        keys, prev = [], None
        for i in range(5):
            prev = continue_chain(h, prev, toks[i * bs:(i + 1) * bs])
            keys.append(prev)
        assert keys == h.hash_tokens(toks)


def _one_instance() -> tuple[ClusterState, KvEventApplier, list[int], list[int]]:
    """A cluster with prefill "p", its applier (block size 4), 12 random tokens and their keys."""
    cluster = ClusterState(block_size=4)
    cluster.add_instance(InstanceInfo("p", "prefill"))
    hasher = BlockHasher(block_size=4)
    toks = [random.randrange(50_000) for _ in range(12)]
    return cluster, KvEventApplier(cluster, hasher, "p"), toks, hasher.hash_tokens(toks)


def test_applier_store_remove_clear_both_encodings() -> None:
    for array_form in (False, True):
        cluster, ap, toks, keys = _one_instance()
        events = [BlockStored([b"a" * 32, b"b" * 32], None, toks[:8], 4),
                  BlockStored([b"c" * 32], b"b" * 32, toks[8:], 4)]
        batch = (KVEventBatchArray(1.0, events) if array_form else KVEventBatch(1.0, events))
        ap.apply_payload(msgspec.msgpack.encode(batch))
        assert cluster.prefix_hit_blocks("p", keys) == 3
        ap.apply_payload(msgspec.msgpack.encode(KVEventBatch(2.0, [BlockRemoved([b"b" * 32])])))
        assert cluster.prefix_hit_blocks("p", keys) == 1
        ap.apply_payload(msgspec.msgpack.encode(KVEventBatch(3.0, [AllBlocksCleared()])))
        assert cluster.prefix_hit_blocks("p", keys) == 0
        # other block size: skipped, not mis-keyed
        ap.apply_payload(msgspec.msgpack.encode(KVEventBatch(4.0, [BlockStored([1], None, toks[:16], 16)])))
        assert cluster.prefix_hit_blocks("p", keys) == 0 and ap.stats.skipped == 1
    with pytest.raises(ValueError, match="KVEventBatch"):
        ap.apply_payload(msgspec.msgpack.encode("nope"))


def test_applier_skips_salted_and_adapter_blocks() -> None:
    """Blocks keyed by more than their tokens (cache salt, LoRA) match no plain prompt: they and
    their children stay out of the index instead of posing as the plain prefix."""
    cluster, ap, toks, keys = _one_instance()
    salted = {"type": "BlockStored", "block_hashes": [b"s1", b"s2"], "parent_block_hash": None,
              "token_ids": toks[:8], "block_size": 4, "extra_keys": [["salt"], None]}
    child = {"type": "BlockStored", "block_hashes": [b"s3"], "parent_block_hash": b"s2",
             "token_ids": toks[8:], "block_size": 4}
    lora = {"type": "BlockStored", "block_hashes": [b"l1"], "parent_block_hash": None,
            "token_ids": toks[:4], "block_size": 4, "lora_id": 3}
    ap.apply_payload(msgspec.msgpack.encode([1.0, [salted, child, lora]]))
    assert cluster.prefix_hit_blocks("p", keys) == 0 and ap.stats.skipped == 4
    plain = {"type": "BlockStored", "block_hashes": [b"a1", b"a2"], "parent_block_hash": None,
             "token_ids": toks[:8], "block_size": 4, "extra_keys": [None, None]}
    ap.apply_payload(msgspec.msgpack.encode([2.0, [plain]]))
    assert cluster.prefix_hit_blocks("p", keys) == 2


def test_parse_config_errors(tmp_path) -> None:
    f = tmp_path / "kv.json"
    f.write_text(json.dumps({"http://h:1": {"endpoint": "tcp://h:5557", "topic": "kv"}}))
    [src] = parse_config(str(f))
    assert src.endpoint == "tcp://h:5557" and src.topic == "kv" and src.role == "prefill"
    with pytest.raises(ValueError, match="endpoint"):
        parse_config('{"http://h:1": {"topic": "x"}}')
    with pytest.raises(ValueError, match="JSON"):
        parse_config("{nope")


@pytest.mark.integration
async def test_proxy_follows_kv_events_over_zmq(make_env) -> None:
    port = free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    seq = 0

    def publish(*events: Any) -> None:
        nonlocal seq
        pub.send_multipart([b"", seq.to_bytes(8, "big"), msgspec.msgpack.encode(KVEventBatch(time.time(), list(events)))])
        seq += 1

    try:
        env = await make_env(n_prefill=2, policy="cache_aware", block_size=4,
                             kv_events_for=lambda purls: json.dumps({purls[0]: f"tcp://127.0.0.1:{port}"}))
        srv = env.server
        iid = f"prefill@{env.prefill_urls[0]}"
        hasher = BlockHasher(block_size=4)
        toks = [random.randrange(50_000) for _ in range(12)]
        keys = hasher.hash_tokens(toks)
        stored = [BlockStored([b"x1", b"x2"], None, toks[:8], 4), BlockStored([b"x3"], b"x2", toks[8:], 4)]

        async def until(cond, what: str) -> None:
            deadline = time.monotonic() + 5
            while not cond():
                if time.monotonic() > deadline:
                    raise AssertionError(f"timed out waiting for {what}")
                await asyncio.sleep(0.05)

        async def publish_until(events, cond, what):
            deadline = time.monotonic() + 5
            while not cond():
                if time.monotonic() > deadline:
                    raise AssertionError(f"timed out waiting for {what}")
                publish(*events)
                await asyncio.sleep(0.05)

        await publish_until(stored, lambda: srv.cluster.prefix_hit_blocks(iid, keys) == 3, "BlockStored")
        publish(BlockRemoved([b"x2"]))
        await until(lambda: srv.cluster.prefix_hit_blocks(iid, keys) == 1, "BlockRemoved")
        publish(AllBlocksCleared())
        await until(lambda: srv.cluster.prefix_hit_blocks(iid, keys) == 0, "AllBlocksCleared")
        publish(*stored)
        await until(lambda: srv.cluster.prefix_hit_blocks(iid, keys) == 3, "BlockStored again")
        # the cache-aware scheduler now sends this prompt (as token ids) to prefill0
        for i in range(3):
            async with env.session.post(env.url + "/v1/completions",
                                        json={"prompt": toks + [7, i], "max_tokens": 2}) as r:
                assert r.status == 200
        assert len(env.prefills[0].records) == 3 and env.prefills[1].records == []
        async with env.session.get(env.url + "/metrics") as r:
            text = await r.text()
        assert f'mooncake_proxy_kv_events_total{{instance="{iid}",type="cleared"}} 1.0' in text
        # the admin view of the index: prefill0 holds the prompt's 3 blocks, prefill1 none
        async with env.session.post(env.url + "/admin/prefix", json={"prompt": toks + [7]}) as r:
            view = await r.json()
        assert view["blocks"] == 3 and view["prompt_tokens"] == 13 and view["block_size"] == 4
        assert view["instances"] == {iid: 3, f"prefill@{env.prefill_urls[1]}": 0}
        async with env.session.post(env.url + "/admin/prefix", json={"prompt": 5}) as r:
            assert r.status == 400 and "prompt" in (await r.text())
    finally:
        pub.close(0)
        ctx.term()
