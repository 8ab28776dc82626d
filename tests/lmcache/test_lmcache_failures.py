"""LMCache on our store when things go wrong (real LMCache 0.5.6 engines, real masters).

* master killed: lookups miss and stores fail -- no crash, nothing waits past LMCache's
  ``blocking_timeout_secs`` -- and both work again once the master is back;
* store full (every object leased by a reader): puts fail cleanly, later ones succeed once
  the leases ran out and eviction can make room;
* bad config (unknown protocol, unreachable master, malformed size): the log names the key at
  construction -- LMCache itself swallows the exception.

Each case runs with LMCache's built-in ``mooncakestore://`` adapter and with our native one.
The built-in adapter is given ``mooncake_rpc_timeout`` the same way as the native one (LMCache
forwards every ``mooncake_*`` key to ``store.setup``).
"""

from __future__ import annotations

import signal
import time

import pytest

from mooncake_core.utils.net import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

BACKENDS = ("native", "builtin")
CHUNK_BYTES = 2 * 4 * 256 * 64 * 2  # 2 x layers x tokens x hidden x fp16 = 256 KiB
BLOCKING_S = 4  # LMCache's blocking_timeout_secs in these tests


def wait_for(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.3)


def test_master_killed_then_back(master_factory, peers) -> None:
    m = master_factory()
    p = peers("writer", m)
    # each backend keeps its chunks in its own segment (both adapters' prefer_local_alloc): a
    # master restart brings back only what a segment's owner wrote into it (docs/store-master.md),
    # and the master's default random placement would put some in the other backend's segment
    fast = {"mooncake_rpc_timeout": "1", "mooncake_prefer_local_alloc": "true"}
    for b in BACKENDS:
        assert p.cmd("open", name=b, backend=b, chunk_meta=b == "native", segment=8 << 20,
                     blocking_timeout=BLOCKING_S, extra=fast)["remote"] == [True]
        assert p.cmd("store", name=b, first=1_000 if b == "native" else 50_000, n=1024, kv_seed=1)["drained"]
    first = {"native": 1_000, "builtin": 50_000}
    for b in BACKENDS:
        assert p.cmd("lookup", name=b, first=first[b], n=1024)["hit"] == 1024
    assert p.cmd("ping", name="native")["ping"] == [0]

    m.stop(sig=signal.SIGKILL)
    for b in BACKENDS:
        t0 = time.monotonic()
        assert p.cmd("lookup", name=b, first=first[b], n=1024, timeout=60)["hit"] == 0, b
        st = p.cmd("store", name=b, first=first[b] + 5_000, n=512, kv_seed=2, timeout=60)
        got = p.cmd("retrieve", name=b, first=first[b], n=1024, kv_seed=1, timeout=60)
        assert st["drained"] and got["got"] == 0, (b, st, got)
        for op, secs in (("lookup+store+retrieve", time.monotonic() - t0), ("store", st["secs"]),
                         ("retrieve", got["secs"])):
            assert secs < 3 * BLOCKING_S, f"{b}: {op} took {secs:.1f}s with the master down\n{p.log_tail()}"
    assert p.cmd("ping", name="native")["ping"] == [2]  # health check: master unreachable
    assert "Traceback" not in p.log_text()

    m.start()
    for b in BACKENDS:  # the writer's own objects are re-reported to the restarted master
        try:
            wait_for(lambda: p.cmd("lookup", name=b, first=first[b], n=1024)["hit"] == 1024, 30,
                     f"{b}: stored chunks visible again after the restart")
        except AssertionError as e:
            raise AssertionError(f"{e}\nmaster: {m.log_tail()}\n{p.log_tail(8000)}") from None
        got = p.cmd("retrieve", name=b, first=first[b], n=1024, kv_seed=1)
        assert got["got"] == 1024 and got["exact"], (b, got)

        def stored_again() -> bool:
            p.cmd("store", name=b, first=first[b] + 9_000, n=512, kv_seed=3)
            return p.cmd("lookup", name=b, first=first[b] + 9_000, n=512)["hit"] == 512
        wait_for(stored_again, 30, f"{b}: new stores succeeding after the restart")
    assert p.cmd("ping", name="native")["ping"] == [0]


def test_store_full_then_eviction(master_factory, peers) -> None:
    """Each engine's pool (its own master) holds 16 chunks; the writer's reads lease 14 of them
    for 3 s, so 6 of 8 new chunks find no room; after the leases, new chunks evict old ones."""
    p = peers("full", None)
    for b in BACKENDS:
        m = master_factory(default_kv_lease_ttl=3000)
        assert p.cmd("open", name=b, backend=b, chunk_meta=False, segment=16 * CHUNK_BYTES,
                     master=m.addr, meta=m.meta)["remote"] == [True]
    for b in BACKENDS:
        base = 1_000_000 if b == "native" else 2_000_000
        assert p.cmd("store", name=b, first=base, n=14 * 256, kv_seed=4)["drained"]
        got = p.cmd("retrieve", name=b, first=base, n=14 * 256, kv_seed=4)  # leases all 14
        assert got["got"] == 14 * 256 and got["exact"], got
        log0 = len(p.log_text())
        assert p.cmd("store", name=b, first=base + 100_000, n=8 * 256, kv_seed=5)["drained"]
        part = p.cmd("lookup", name=b, first=base + 100_000, n=8 * 256)["hit"]
        assert part < 8 * 256, f"{b}: a full pool of leased objects took all new chunks"
        new_log = p.log_text()[log0:]
        if b == "native":  # LMCache's built-in adapter ignores put results; ours reports them
            assert "failed (first" in new_log and "-200 NO_AVAILABLE_HANDLE" in new_log, new_log[-3000:]
        assert "Traceback" not in new_log
        time.sleep(3.5)  # the leases run out: old chunks become evictable

        def stored() -> bool:
            p.cmd("store", name=b, first=base + 200_000, n=8 * 256, kv_seed=6)
            return p.cmd("lookup", name=b, first=base + 200_000, n=8 * 256)["hit"] == 8 * 256
        wait_for(stored, 20, f"{b}: puts succeeding after eviction")
        got = p.cmd("retrieve", name=b, first=base + 200_000, n=8 * 256, kv_seed=6)
        assert got["got"] == 8 * 256 and got["exact"], got


BAD = {  # case -> (extra_config, the text the log must show, per backend)
    "unknown protocol": ({"protocol": "carrier-pigeon"},
                         {"native": "extra_config['protocol']", "builtin": "protocol: unknown protocol"}),
    "malformed size": ({"global_segment_size": "lots"},
                       {"native": "extra_config['global_segment_size']", "builtin": "global_segment_size:"}),
    "unreachable master": ({"metadata_server": "P2PHANDSHAKE", "mooncake_rpc_timeout": "1"},
                           {"native": "extra_config['master_server_address']",
                            "builtin": "set master_server_address"}),
}


def test_bad_config_is_logged_with_the_key(peers) -> None:
    p = peers("badconfig", None, "--master", f"127.0.0.1:{free_port()}", "--meta", "P2PHANDSHAKE")
    for case, (extra, want) in BAD.items():
        for b in BACKENDS:
            name = f"{b}-{case.replace(' ', '-')}"
            log0 = len(p.log_text())
            info = p.cmd("open", name=name, backend=b, chunk_meta=False, extra=extra, timeout=60)
            new_log = p.log_text()[log0:]
            # ours logs through LMCache's logger ("LMCache ERROR: ..."); the store's own error
            # under the built-in adapter goes through Python's last-resort handler (no level shown)
            lines = [ln for ln in new_log.splitlines() if "ERROR" in ln or b == "builtin"]
            assert any(want[b] in ln for ln in lines), f"{b} / {case}: no error naming the key:\n{new_log[-3000:]}"
            # whatever LMCache made of it, the engine answers: every lookup misses, nothing hangs
            assert p.cmd("lookup", name=name, first=5, n=600, timeout=30)["hit"] == 0
            if b == "native":
                assert info["remote"] == [False], (case, info)  # construction raised; LMCache keeps None
