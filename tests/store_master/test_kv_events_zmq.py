"""The master's store blocks as vLLM-format KV events over ZeroMQ (kv_events_zmq.py).

The pure parts (event mapping, replay buffer, one publisher step over a real master state) run
here; the end-to-end test starts a real ``mooncake_master --enable_kv_events`` and subscribes
with vLLM's own msgspec event types (the vLLM venv's python runs kv_events_subscriber.py), as
an llm-d / Dynamo indexer does: puts, a removal and evictions arrive in order, a late subscriber
gets them by replay, and after a restart of the master the subscriber sees the publisher start
over (seq 0, ``AllBlocksCleared``) and then the new term's blocks.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import msgspec
import pytest

from mooncake_core.pd.keys import chained_block_keys, namespace
from mooncake_core.store.kv_events_zmq import (AllBlocksCleared, BlockRemoved, BlockStored, EventFormat,
                                               KVEventBatch, KvEventPublisher, ReplayBuffer, block_hash_of,
                                               follow_reply)
from mooncake_core.store.master_client import MasterClient
from mooncake_core.store.master_records import MasterConfig
from mooncake_core.store.master_state import MasterState
from mooncake_core.store.protocol import ReplicateConfigMsg as Cfg
from mooncake_core.utils.net import free_port

MiB = 1 << 20
HERE = Path(__file__).resolve().parent
KEYS = chained_block_keys(namespace("tiny|torch.float32", 16, "v1"), list(range(16 * 4)), 16)


# ------------------------------------------------------------------ pure
def test_event_mapping_of_block_and_other_keys():
    fmt = EventFormat(block_size=16, backend_id="pool-1")
    e = fmt.event("put", KEYS[0])
    assert isinstance(e, BlockStored) and e.block_hashes == [bytes.fromhex(KEYS[0].rsplit("/", 1)[1])]
    assert (e.block_size, e.medium, e.backend_id, e.reason, e.parent_block_hash, e.token_ids) == \
        (16, "STORAGE", "pool-1", "put", None, [])
    r = fmt.event("evict", KEYS[1])
    assert isinstance(r, BlockRemoved) and r.reason == "evict" and len(r.block_hashes[0]) == 20
    other = fmt.event("put", "user/obj")
    assert other.block_hashes == [] and other.object_key == "user/obj"
    assert EventFormat(emit_object_key=False).event("put", "user/obj") is None
    assert block_hash_of(KEYS[0][:-1] + "g") is None and block_hash_of("mc-vllm-kv/ab") is None
    first = fmt.resync([KEYS[2]])
    assert isinstance(first[0], AllBlocksCleared) and first[1].block_hashes == [block_hash_of(KEYS[2])]


def test_store_key_set_applies_the_feed_as_the_proxy_keys_blocks():
    from mooncake_proxy.store_view import StoreBlockHasher, StoreKeySet, store_key

    a = StoreBlockHasher("tiny|torch.float32", 16).hash_tokens(list(range(16 * 3)))
    fmt, ks = EventFormat(), StoreKeySet()
    ks.apply_kv_events(fmt.events([("put", store_key(h)) for h in a] + [("put", "user/x")]))
    assert ks.prefix_len(a) == 3 and len(ks) == 3  # non-block keys carry no hash: not held
    ks.apply_kv_events(fmt.events([("evict", store_key(a[1]))]))
    assert ks.prefix_len(a) == 1
    ks.apply_kv_events(fmt.resync([store_key(a[2])]))  # cleared, then only what the store holds
    assert ks.prefix_len(a) == 0 and len(ks) == 1 and ks.resyncs == 1


def test_replay_buffer_keeps_the_newest_batches():
    buf = ReplayBuffer(3)
    for s in range(5):
        buf.add(s, bytes([s]))
    assert buf.since(0) == [(2, b"\x02"), (3, b"\x03"), (4, b"\x04")]
    assert buf.since(4) == [(4, b"\x04")] and buf.since(9) == []
    with pytest.raises(ValueError, match="buffer_steps"):
        ReplayBuffer(0)


def test_publisher_step_follows_the_state_and_resyncs_on_a_new_term():
    pytest.importorskip("zmq")
    import zmq

    st = MasterState(MasterConfig())
    st.mount_segment("c", "seg", 0x10000, 8 * MiB)
    pub = KvEventPublisher(lambda after, epoch: follow_reply(st.key_events, st.objects, st.epoch, after, epoch),
                           "tcp://127.0.0.1:0")
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    try:
        got: list[tuple[int, list]] = []

        def drain():
            while sub.poll(200):
                _t, seq, payload = sub.recv_multipart()
                got.append((int.from_bytes(seq, "big"),
                            msgspec.msgpack.decode(payload, type=KVEventBatch).events))

        time.sleep(0.3)  # PUB/SUB: the subscription must reach the publisher first
        assert pub.step() == 1 and pub.step() == 0  # first step: cleared (+ an empty snapshot); then nothing
        st.put_start("c", KEYS[0], MiB, Cfg())
        st.put_end("c", KEYS[0])
        assert pub.step() == 1  # followed from cursor 0, not another snapshot
        st.remove(KEYS[0])
        assert pub.step() == 1 and pub.step() == 0  # nothing new: no batch
        drain()
        assert [s for s, _ in got] == [0, 1, 2]
        assert [type(e).__name__ for e in got[0][1] + got[1][1]] == ["AllBlocksCleared", "BlockStored"]
        assert isinstance(got[2][1][0], BlockRemoved) and got[2][1][0].reason == "remove"
        st.put_start("c", KEYS[1], MiB, Cfg())
        st.put_end("c", KEYS[1])
        st.begin_leadership()  # a new term: the cursor means nothing there
        assert pub.step() == 2  # cleared + the snapshot
        drain()
        assert [type(e).__name__ for e in got[-1][1]] == ["AllBlocksCleared", "BlockStored"]
    finally:
        sub.close(0)
        pub.close()


# ------------------------------------------------------------------ end to end
def _vllm_python() -> str:
    from mooncake_lab.venvs import venv_python

    py = venv_python("vllm")
    if not py.exists():
        pytest.skip(f"vLLM venv not found at {py} (its msgspec types decode the events)")
    return str(py)


def _put(c: MasterClient, key: str) -> None:
    c.put_start("writer", key, MiB, Cfg())
    c.put_end("writer", key)


def _json(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _lines(out: str) -> list[dict]:
    return [d for d in _json(out) if "type" in d]


@pytest.mark.integration
def test_vllm_subscriber_sees_puts_removals_evictions_in_order_and_after_a_restart(start_master, tmp_path):
    py = _vllm_python()
    pub_port, rep_port = free_port(), free_port()
    flags = ("--enable_kv_events", f"--kv_events_bind_endpoint=tcp://127.0.0.1:{pub_port}",
             f"--kv_events_replay_endpoint=tcp://127.0.0.1:{rep_port}", "--kv_events_backend_id=pool-1",
             "--kv_events_block_size=16", "--client_ttl=300", "--eviction_high_watermark_ratio=1.0", "--eviction_ratio=0.2")
    m = start_master(*flags)
    with MasterClient(m.addr) as c:
        c.mount_segment("writer", "127.0.0.1:7001", 0x7F0000000000, 6 * MiB)
        for k in KEYS:
            _put(c, k)
        c.remove(KEYS[2])
        for k in ("other/1", "other/2", "other/3", "other/4"):  # 7 MiB into 6: the oldest are evicted
            _put(c, k)
        present = {k for k in KEYS if c.exist_key(k)}
    assert len(present) < 3, "the test did not cause an eviction"

    # a late subscriber: everything so far comes by replay, in order
    rep = subprocess.run([py, str(HERE / "kv_events_subscriber.py"), "replay", f"tcp://127.0.0.1:{rep_port}", "0"],
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr[-2000:]
    evs = _lines(rep.stdout)
    assert evs[0]["type"] == "AllBlocksCleared" and evs[0]["seq"] == 0
    seqs = [e["seq"] for e in evs]
    assert seqs == sorted(seqs)
    blocks = [(e["type"], e["reason"], e["hashes"]) for e in evs if e["hashes"]]
    hexes = [k.rsplit("/", 1)[1] for k in KEYS]
    assert blocks[:5] == [("BlockStored", "put", [h]) for h in hexes] + [("BlockRemoved", "remove", [hexes[2]])]
    evicted = [b[2][0] for b in blocks[5:]]
    assert all(b[:2] == ("BlockRemoved", "evict") for b in blocks[5:]) and evicted
    held: set[str] = set()  # an indexer applying the events in order holds what the store holds
    for kind, _reason, (h,) in blocks:
        (held.add if kind == "BlockStored" else held.discard)(h)
    assert held == {k.rsplit("/", 1)[1] for k in present}
    assert [e["key"] for e in evs if not e["hashes"]][1:5] == ["other/1", "other/2", "other/3", "other/4"]

    # a subscriber following the PUB socket across a restart of the master
    out_path = tmp_path / "sub.out"
    sub = subprocess.Popen([py, str(HERE / "kv_events_subscriber.py"), "sub", f"tcp://127.0.0.1:{pub_port}",
                            f"tcp://127.0.0.1:{rep_port}", "after-restart/", "180"],
                           stdout=open(out_path, "w"), stderr=subprocess.STDOUT)

    def seen(what: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while what not in out_path.read_text():
            assert sub.poll() is None and time.monotonic() < deadline, f"no {what}: {out_path.read_text()[-3000:]}"
            time.sleep(0.2)

    try:
        seen('"ready"')
        with MasterClient(m.addr) as c:  # until the subscriber has seen a batch of the first master
            _put(c, "before-restart")
            seen('"before-restart"', 30)
        port = m.port
        m.kill()
        m2 = start_master(*flags, port=port)
        with MasterClient(m2.addr) as c:
            c.mount_segment("writer", "127.0.0.1:7001", 0x7F0000000000, 6 * MiB)
            _put(c, KEYS[0])
            # PUB/SUB: a subscriber learns it missed batches (here: the reconnect after the restart)
            # from the next batch it gets; keep publishing until it got one
            for i in range(120):
                _put(c, f"after-restart/{i}")
                if sub.poll() is not None:
                    break
                time.sleep(0.5)
        sub.wait(30)
    finally:
        if sub.poll() is None:
            sub.kill()
    out = out_path.read_text()
    assert sub.returncode == 0, out[-3000:]
    lines = _json(out)
    mark = lines.index({"replay_from": 0, "restart": True})  # it noticed the publisher starting over
    assert lines[1]["key"] == "before-restart"  # the first master's, live (evicting one more object)
    evs = [e for e in lines[mark + 1:] if "type" in e]  # replayed, then live
    assert evs[0] == {"seq": 0, "type": "AllBlocksCleared", "hashes": [], "reason": None, "key": None}, evs
    assert [(e["type"], e["hashes"]) for e in evs if e["hashes"]] == [("BlockStored", [hexes[0]])]
    assert [e["seq"] for e in evs] == sorted(e["seq"] for e in evs)
    rep = subprocess.run([py, str(HERE / "kv_events_subscriber.py"), "replay", f"tcp://127.0.0.1:{rep_port}", "0"],
                         capture_output=True, text=True, timeout=120)
    again = [e for e in _lines(rep.stdout) if e["seq"] <= evs[-1]["seq"]]
    assert again == evs, "a replay of the new term differs from what the subscriber got"


@pytest.mark.integration
def test_proxy_store_view_follows_the_zmq_feed_across_a_restart(start_master):
    """Our proxy's ``--store-view zmq``: joins late (replays the master's first batches), follows
    puts, removals and evictions, and starts over with a restarted master."""
    pytest.importorskip("zmq")
    from mooncake_proxy.store_view import StoreBlockHasher, StoreZmqView, store_key

    pub_port, rep_port = free_port(), free_port()
    flags = ("--enable_kv_events", f"--kv_events_bind_endpoint=tcp://127.0.0.1:{pub_port}",
             f"--kv_events_replay_endpoint=tcp://127.0.0.1:{rep_port}", "--client_ttl=300",
             "--eviction_high_watermark_ratio=1.0", "--eviction_ratio=0.2")
    m = start_master(*flags)
    a = StoreBlockHasher("tiny|torch.float32", 16).hash_tokens(list(range(16 * 4)))
    view = StoreZmqView(f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{rep_port}").start()

    def until(n: int, what: str, c: MasterClient | None = None) -> None:
        deadline = time.monotonic() + 10
        while view.prefix_len(a) != n:
            assert time.monotonic() < deadline, f"{what}: the view holds {view.prefix_len(a)} blocks, want {n}"
            if c is not None:
                _put(c, "tick")  # a subscriber learns of missed batches from the next one
                c.remove("tick")
            time.sleep(0.05)

    try:
        with MasterClient(m.addr) as c:
            c.mount_segment("writer", "127.0.0.1:7001", 0x7F0000000000, 6 * MiB)
            _put(c, store_key(a[0]))  # before the view's subscription is up: comes by replay
            until(1, "late join", c)
            for k in a[1:]:
                _put(c, store_key(k))
            until(4, "puts")
            c.remove(store_key(a[2]))
            until(2, "removal")
            for k in ("other/1", "other/2", "other/3", "other/4"):
                _put(c, k)
            until(0, "eviction of the oldest blocks")
        port = m.port
        m.kill()
        m2 = start_master(*flags, port=port)
        with MasterClient(m2.addr) as c:
            c.mount_segment("writer", "127.0.0.1:7001", 0x7F0000000000, 6 * MiB)
            _put(c, store_key(a[0]))
            until(1, "after the restart", c)
        assert view.replays >= 2 and view.errors == 0
    finally:
        view.stop()
