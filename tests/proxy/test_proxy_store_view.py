"""The proxy with ``--store-master``: its store tier follows a real master, and a prefill that
lacks a prefix the store holds gets the ``mooncake_store_prefix`` hint in kv_transfer_params."""

from __future__ import annotations

import asyncio

import pytest

from mooncake_lab.master_proc import MasterProc
from mooncake_core.pd.store_hint import HINT_KEY
from mooncake_core.store.master_client import MasterClient
from mooncake_core.store.protocol import ReplicateConfigMsg
from mooncake_core.utils.net import free_port
from mooncake_proxy.store_view import StoreBlockHasher, store_key

pytestmark = pytest.mark.integration

TAG = "tiny|torch.float32"
BS = 16


@pytest.fixture
def master(tmp_path):
    port = free_port()
    m = MasterProc([f"--port={port}", "--rpc_address=127.0.0.1", f"--metrics_port={free_port()}",
                    "--client_ttl=600"], port, 0, str(tmp_path / "master.log")).wait_ready()
    yield m.addr
    m.kill()


async def test_store_prefix_hint_follows_the_real_store(make_env, master):
    env = await make_env(n_prefill=1, policy="conductor", block_size=BS, store_master=master,
                         store_model_tag=TAG)
    prompt = [(i * 7919) % 30000 + 3 for i in range(BS * 64)]
    blocks = StoreBlockHasher(TAG, BS).hash_tokens(prompt)
    with MasterClient(master) as c:
        c.mount_segment("writer", "127.0.0.1:7001", 0x7F0000000000, 64 << 20)
        for h in blocks[:40]:
            c.put_start("writer", store_key(h), 4096, ReplicateConfigMsg())
            c.put_end("writer", store_key(h))
    cl = env.server.cluster
    for _ in range(200):
        if cl.store_hit_blocks(blocks) == 40:
            break
        await asyncio.sleep(0.01)
    assert cl.store_hit_blocks(blocks) == 40, "the proxy's store view did not follow the master"
    body = {"model": "m", "prompt": prompt, "max_tokens": 2}
    await env.post_ok(body, 1)
    params = env.prefills[0].records[-1].body.get("kv_transfer_params") or {}
    assert params.get(HINT_KEY) == {"num_blocks": 40, "block_size": BS}, params
    # the same prompt again: the prefill now holds it itself, no hint
    await env.post_ok(body, 1)
    assert HINT_KEY not in (env.prefills[0].records[-1].body.get("kv_transfer_params") or {})
    # an unrelated prompt: nothing in the store, no hint
    await env.post_ok({"model": "m", "prompt": [5] * (BS * 8), "max_tokens": 2}, 1)
    assert HINT_KEY not in (env.prefills[0].records[-1].body.get("kv_transfer_params") or {})


async def test_store_master_needs_model_tag(make_env, master):
    with pytest.raises(ValueError, match="--store-model-tag"):
        await make_env(store_master=master)
