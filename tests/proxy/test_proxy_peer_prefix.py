"""``--peer-prefix``: the Conductor plans a prefix load from a peer instance with a queue; the proxy has
the peer export the prefix and hands its answer to the chosen prefill as ``mooncake_peer_prefix``
(mooncake_core/pd/peer_prefix.py; the connector side runs on real vLLM in
tests/vllm/test_vllm_p2p_e2e.py). Fake engines stand in for vLLM: their answers carry
kv_transfer_params as vLLM's do, and they record what they received."""

from __future__ import annotations

import asyncio

from mooncake_core.pd.peer_prefix import PEER_KEY
from mooncake_proxy.fake_engine import Behaviour

BS = 16
SHARED = [(i * 7919) % 30000 + 3 for i in range(BS * 40)]  # 40 blocks both prompts start with


def _prompt(tail_seed: int, tail_len: int) -> list[int]:
    return SHARED + [(i * 104729 + tail_seed) % 30000 + 3 for i in range(tail_len)]


def _exports(engine) -> list:
    return [r for r in engine.records if r.body.get("max_tokens") == 1 and r.body.get("prompt") == SHARED]


async def _holder_busy(env) -> tuple[object, object, list[asyncio.Task]]:
    """X puts the shared prefix on one prefill (the holder); L1 (the prefix and a short tail) and L2
    (the prefix and a long tail) queue on the holder. Returns (holder, other, the L tasks)."""
    await env.post_ok({"model": "m", "prompt": _prompt(1, 8), "max_tokens": 2}, 1)
    holder = next(e for e in env.prefills if e.records)
    other = next(e for e in env.prefills if e is not holder)
    queued = []
    for seed, tail in ((2, 8), (4, BS * 200)):
        queued.append(asyncio.create_task(env.post_ok({"model": "m", "prompt": _prompt(seed, tail),
                                                       "max_tokens": 2}, 1)))
        for _ in range(200):  # admitted and running on the holder
            if len(holder.records) == len(queued) + 1:
                break
            await asyncio.sleep(0.01)
        assert len(holder.records) == len(queued) + 1, "L did not go to the instance holding its prefix"
    return holder, other, queued


async def _holder_busy_then_y(env) -> tuple[object, object, list[int]]:
    """The holder is busy (``_holder_busy``) and Y (the prefix plus a short tail) is sent meanwhile. The
    holder would answer an export after its short head (L1), but Y itself only after L2 too: the
    Conductor sends Y to the other prefill with the holder as its prefix source."""
    holder, other, queued = await _holder_busy(env)
    y = _prompt(3, 8)
    await env.post_ok({"model": "m", "prompt": y, "max_tokens": 2}, 1)
    await asyncio.gather(*queued)
    return holder, other, y


async def test_busy_holder_exports_the_prefix_to_the_chosen_prefill(make_env):
    env = await make_env(n_prefill=2, policy="conductor", block_size=BS, peer_prefix=True,
                         prefill_behaviour=Behaviour(prefill_delay=0.4))
    holder, other, y = await _holder_busy_then_y(env)
    exports = _exports(holder)
    assert len(exports) == 1, [r.body for r in holder.records]
    assert exports[0].body["kv_transfer_params"] == {"do_remote_decode": True}
    got = other.records[-1].body
    assert got["prompt"] == y
    hint = got["kv_transfer_params"][PEER_KEY]
    assert hint["do_remote_prefill"] is True and hint["remote_engine_id"] == holder.behaviour.engine_id
    assert got["kv_transfer_params"]["do_remote_decode"] is True  # still this request's own hand-off
    text = await (await env.session.get(env.url + "/metrics")).text()
    assert 'mooncake_proxy_peer_prefix_exports_total{outcome="exported"} 1.0' in text


async def test_an_export_past_its_timeout_leaves_the_prefill_to_compute(make_env):
    env = await make_env(n_prefill=2, policy="conductor", block_size=BS, peer_prefix=True,
                         peer_prefix_timeout=0.1, prefill_behaviour=Behaviour(prefill_delay=0.4))
    holder, other, y = await _holder_busy_then_y(env)
    assert len(_exports(holder)) == 1  # asked, but the answer came too late
    got = other.records[-1].body
    assert got["prompt"] == y and PEER_KEY not in got["kv_transfer_params"]
    text = await (await env.session.get(env.url + "/metrics")).text()
    assert 'mooncake_proxy_peer_prefix_exports_total{outcome="failed"} 1.0' in text


async def test_without_the_flag_no_peer_is_asked(make_env):
    env = await make_env(n_prefill=2, policy="conductor", block_size=BS,
                         prefill_behaviour=Behaviour(prefill_delay=0.4))
    holder, other, y = await _holder_busy_then_y(env)
    assert not _exports(holder)
    assert all(PEER_KEY not in (r.body.get("kv_transfer_params") or {}) for e in env.prefills for r in e.records)


async def test_a_prefix_the_store_also_holds_is_loaded_from_the_store(make_env, tmp_path):
    """The store's copy costs nobody, a peer's export costs the busy peer a request: when the real
    store holds the planned prefix too, the chosen prefill gets the store hint and no peer is asked."""
    from mooncake_lab.master_proc import MasterProc
    from mooncake_core.pd.store_hint import HINT_KEY
    from mooncake_core.store.master_client import MasterClient
    from mooncake_core.store.protocol import ReplicateConfigMsg
    from mooncake_core.utils.net import free_port
    from mooncake_proxy.store_view import StoreBlockHasher, store_key

    tag = "tiny|torch.float32"
    port = free_port()
    m = MasterProc([f"--port={port}", "--rpc_address=127.0.0.1", f"--metrics_port={free_port()}",
                    "--client_ttl=600"], port, 0, str(tmp_path / "master.log")).wait_ready()
    try:
        # L1 and L2 run long enough for the store to be filled while they do
        env = await make_env(n_prefill=2, policy="conductor", block_size=BS, peer_prefix=True, store_master=m.addr,
                             store_model_tag=tag, prefill_behaviour=Behaviour(prefill_delay=2.0))
        # the holder is loaded before the store holds the prefix: with the store's copy, the conductor
        # could as well have sent L1 and L2 to the other prefill
        holder, other, queued = await _holder_busy(env)
        blocks = StoreBlockHasher(tag, BS).hash_tokens(SHARED)
        with MasterClient(m.addr) as c:
            c.mount_segment("writer", "127.0.0.1:7001", 0x7F0000000000, 64 << 20)
            for h in blocks:
                c.put_start("writer", store_key(h), 4096, ReplicateConfigMsg())
                c.put_end("writer", store_key(h))
        for _ in range(200):
            if env.server.cluster.store_hit_blocks(blocks) == len(blocks):
                break
            await asyncio.sleep(0.01)
        y = _prompt(3, 8)
        await env.post_ok({"model": "m", "prompt": y, "max_tokens": 2}, 1)
        await asyncio.gather(*queued)
        assert not _exports(holder)
        assert other.records[-1].body["prompt"] == y
        params = other.records[-1].body["kv_transfer_params"]
        assert PEER_KEY not in params and params[HINT_KEY] == {"num_blocks": 40, "block_size": BS}, params
    finally:
        m.kill()
