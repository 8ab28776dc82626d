"""Key events of the store master and the proxy's store view that follows them.

Pure parts (the ring, the state's hooks) run on a fake clock; the views run against a real
``mooncake_master`` process: a put / remove / eviction / client expiry must show in the
proxy's view within a bound.
"""

from __future__ import annotations

import time

import pytest

from mooncake_core.pd.keys import chained_block_keys, namespace
from mooncake_core.store.key_events import KeyEventLog
from mooncake_core.store.master_client import MasterClient
from mooncake_core.store.master_records import MasterConfig
from mooncake_core.store.master_state import MasterState
from mooncake_core.store.protocol import ReplicateConfigMsg as Cfg
from mooncake_proxy.scheduling import ClusterState
from mooncake_proxy.store_view import StoreBlockHasher, StoreEventView, StoreQueryView, store_key

MiB = 1 << 20
MODEL = "tiny-model|torch.float32"
BOUND_S = 1.0  # the view must follow the store within this


# ------------------------------------------------------------------ pure
def test_ring_cursor_prefix_and_gap():
    log = KeyEventLog(capacity=4)
    assert log.since(0) == ([], 0, False)
    for i in range(3):
        log.publish("put", f"a/{i}")
    log.publish("remove", "b/x")
    ev, cur, gap = log.since(1, prefix="a/")
    assert [e[2] for e in ev] == ["a/1", "a/2"] and cur == 4 and not gap
    assert log.since(4) == ([], 4, False)
    log.publish("evict", "a/0")
    log.publish("expire", "a/1")  # ring of 4 now holds seqs 3..6
    assert log.since(1)[2] is True  # seq 2 was dropped: the subscriber must resync
    ev, cur, gap = log.since(2)
    assert [e[0] for e in ev] == [3, 4, 5, 6] and not gap
    assert log.since(99)[2] is True  # a cursor from another term
    ev, cur, _ = log.since(2, limit=2)
    assert cur == 4  # the rest comes with the next pull


def test_state_publishes_put_remove_evict_expire():
    now = [0.0]
    st = MasterState(MasterConfig(client_ttl_s=5), clock=lambda: now[0])
    st.mount_segment("c", "seg", 0x10000, 4 * MiB)
    for k in ("k1", "k2", "k3"):
        st.put_start("c", k, MiB, Cfg())
        st.put_end("c", k)
    st.remove("k1")
    for k in ("k4", "k5", "k6"):  # 4 MiB of 1 MiB objects: k6 evicts the oldest
        st.put_start("c", k, MiB, Cfg())
        st.put_end("c", k)
    now[0] = 10.0
    st.tick()  # "c" stopped heart-beating: its objects expire
    events, _, gap = st.key_events.since(0)
    assert not gap
    names = {1: "put", 2: "remove", 3: "evict", 4: "expire"}
    seen = [(names[k], key) for _, k, key in events]
    assert seen[:4] == [("put", "k1"), ("put", "k2"), ("put", "k3"), ("remove", "k1")]
    assert ("evict", "k2") in seen
    evicted = {key for kind, key in seen if kind == "evict"}
    expired = {key for kind, key in seen if kind == "expire"}
    assert not st.objects and expired == {"k3", "k4", "k5", "k6"} - evicted and "k6" in expired
    snap = st.watch_keys(0, "k")
    assert snap.gap and snap.snapshot == []


def test_store_hasher_matches_connector_keys():
    tokens = list(range(1000, 1000 + 16 * 5 + 3))
    h = StoreBlockHasher(MODEL, 16)
    want = chained_block_keys(namespace(MODEL, 16, "v1"), tokens, 16)
    got = h.hash_tokens(tokens)
    assert [store_key(x) for x in got] == want and len(want) == 5
    prev = None
    for i in range(5):  # the KV-events path extends the same chain block by block
        prev = h.continue_chain(prev, tokens[i * 16:(i + 1) * 16])
        assert prev == got[i]
    assert StoreBlockHasher(MODEL, 32).hash_tokens(tokens)[0] != got[0]


# ------------------------------------------------------------------ real master
def _put(c: MasterClient, key: str, size: int = MiB) -> None:
    c.put_start("writer", key, size, Cfg())
    c.put_end("writer", key)


def _until(pred, bound: float = BOUND_S) -> float:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > bound:
            raise AssertionError(f"the store view did not follow within {bound}s")
        time.sleep(0.002)
    return time.monotonic() - t0


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["events", "query"])
def test_view_follows_put_remove_evict(start_master, kind):
    m = start_master("--eviction_high_watermark_ratio=1.0", "--eviction_ratio=0.2")
    hasher = StoreBlockHasher(MODEL, 16)
    a = hasher.hash_tokens(list(range(16 * 4)))           # a 4-block prefix
    b = hasher.hash_tokens([7] * (16 * 3))                # another, 3 blocks
    with MasterClient(m.addr) as c:
        c.mount_segment("writer", "127.0.0.1:7001", 0x7F0000000000, 8 * MiB)
        _put(c, store_key(a[0]))  # before the view starts: must come with the snapshot
        if kind == "events":
            view = StoreEventView(m.addr, poll_s=0.01).start()
        else:
            view = StoreQueryView(m.addr, ttl_s=0.05)
        cl = ClusterState(block_size=16)
        cl.set_store_view(view)
        try:
            assert cl.store_enabled and cl.store_hit_blocks(a) == 1
            for k in a[1:]:
                _put(c, store_key(k))
            lag_put = _until(lambda: cl.store_hit_blocks(a) == 4)
            c.remove(store_key(a[2]))
            lag_rm = _until(lambda: cl.store_hit_blocks(a) == 2)
            for k in b:
                _put(c, store_key(k))
            _until(lambda: cl.store_hit_blocks(b) == 3)
            # 7 MiB of 8 MiB used; 2 more objects need an eviction of the least recently used
            _put(c, "other/1")
            _put(c, "other/2")
            lag_ev = _until(lambda: cl.store_hit_blocks(a) == 0)
            assert not c.exist_key(store_key(a[0]))
            assert cl.store_record(a) == [] and cl.store_hit_blocks(a) == 0  # the model is not used
            print(f"{kind}: lag put {lag_put * 1e3:.1f} ms, remove {lag_rm * 1e3:.1f} ms, "
                  f"evict {lag_ev * 1e3:.1f} ms")
        finally:
            view.stop()


@pytest.mark.integration
def test_event_view_resyncs_after_master_restart_and_expiry(start_master):
    m = start_master("--client_ttl=1")
    hasher = StoreBlockHasher(MODEL, 16)
    a = hasher.hash_tokens(list(range(16 * 3)))
    view = StoreEventView(m.addr, poll_s=0.01).start()
    try:
        with MasterClient(m.addr) as c:
            c.mount_segment("writer", "127.0.0.1:7001", 0x7F0000000000, 8 * MiB)
            for k in a:
                _put(c, store_key(k))
        _until(lambda: view.prefix_len(a) == 3)
        # the writer stops heart-beating: after client_ttl its objects are gone (expire events)
        _until(lambda: view.prefix_len(a) == 0, bound=1.0 + 2.0 + BOUND_S)
        with MasterClient(m.addr) as c:
            c.mount_segment("w2", "127.0.0.1:7002", 0x7E0000000000, 8 * MiB)
            c.put_start("w2", store_key(a[0]), MiB, Cfg())
            c.put_end("w2", store_key(a[0]))
        _until(lambda: view.prefix_len(a) == 1)
        port = m.port
        m.kill()
        m2 = start_master(port=port)  # a new term: the cursor means nothing there
        with MasterClient(m2.addr) as c:
            c.mount_segment("w3", "127.0.0.1:7003", 0x7D0000000000, 8 * MiB)
            for k in a[:2]:
                c.put_start("w3", store_key(k), MiB, Cfg())
                c.put_end("w3", store_key(k))
        _until(lambda: view.prefix_len(a) == 2, bound=5.0)
        assert view.state.resyncs >= 2
    finally:
        view.stop()
