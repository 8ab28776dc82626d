"""Unit tests of the master's pure decision logic (no sockets, injected clock)."""

from __future__ import annotations

import random

import pytest

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store.master_state import MasterConfig, MasterState
from mooncake_core.store.protocol import ReplicaDesc, ReplicateConfigMsg as Cfg

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def make(n_segs: int = 2, seg_size: int = MiB, **cfg) -> tuple[MasterState, Clock]:
    clock = Clock()
    st = MasterState(MasterConfig(**cfg), clock=clock)
    for i in range(n_segs):
        st.mount_segment(f"c{i}", f"seg{i}", 0x10000000 * (i + 1), seg_size)
    return st, clock


def put(st: MasterState, key: str, size: int, cfg: Cfg | None = None, client: str = "c0") -> list[ReplicaDesc]:
    reps = st.put_start(client, key, size, cfg)
    st.put_end(client, key)
    return reps


def code_of(fn, *a, **kw) -> int:
    with pytest.raises(MooncakeError) as ei:
        fn(*a, **kw)
    return ei.value.code


# ---------------------------------------------------------------- put state machine
def test_put_lifecycle_and_visibility() -> None:
    st, _ = make()
    reps = st.put_start("c0", "k", 1000)
    assert len(reps) == 1 and reps[0].status == "processing" and reps[0].size == 1000
    assert not st.exist_key("k"), "an in-flight put is not visible"
    assert code_of(st.get_replica_list, "k") == ErrorCode.OBJECT_NOT_FOUND
    st.put_end("c0", "k")
    assert st.exist_key("k")
    got = st.get_replica_list("k")
    assert [(r.segment_name, r.addr) for r in got.replicas] == [(reps[0].segment_name, reps[0].addr)]
    assert got.replicas[0].status == "complete"
    assert st.get_size("k") == 1000


def test_put_existing_key_is_705_and_keeps_old_value() -> None:
    st, _ = make()
    first = put(st, "k", 1000)
    assert code_of(st.put_start, "c0", "k", 2000) == ErrorCode.OBJECT_ALREADY_EXISTS
    assert st.get_size("k") == 1000
    assert st.get_replica_list("k").replicas[0].addr == first[0].addr


def test_put_revoke_frees_space() -> None:
    st, _ = make(n_segs=1)
    st.put_start("c0", "k", 4096)
    assert st.used == 4096
    st.put_revoke("c0", "k")
    assert st.used == 0 and not st.exist_key("k")
    assert code_of(st.put_revoke, "c0", "k") == ErrorCode.OBJECT_NOT_FOUND
    assert code_of(st.put_end, "c0", "k") == ErrorCode.OBJECT_NOT_FOUND


def test_concurrent_put_in_progress_and_takeover_after_30s() -> None:
    st, clock = make()
    st.put_start("c0", "k", 1000)
    assert code_of(st.put_start, "c1", "k", 1000) == ErrorCode.OBJECT_ALREADY_EXISTS
    clock.advance(29)
    assert code_of(st.put_start, "c1", "k", 1000) == ErrorCode.OBJECT_ALREADY_EXISTS
    clock.advance(2)
    st.put_start("c1", "k", 1000)  # taken over
    assert st.stats.takeovers == 1
    # the stale writer cannot complete the new put
    assert code_of(st.put_end, "c0", "k") == ErrorCode.INVALID_PARAMS
    st.put_end("c1", "k")
    assert st.exist_key("k")
    assert st.used == 1024, "the stale put's space was freed on takeover"


def test_upsert_replaces_and_old_stays_readable_until_end() -> None:
    st, _ = make(n_segs=1)
    old = put(st, "k", 1000)
    new = st.upsert_start("c0", "k", 3000)
    assert st.get_size("k") == 1000, "old value visible while the upsert is in flight"
    assert new[0].addr != old[0].addr
    st.put_end("c0", "k")
    assert st.get_size("k") == 3000
    assert st.used == 3008  # 3000 rounded to 64; old space freed (no lease held it)


def test_upsert_of_leased_object_defers_free_until_lease_ends() -> None:
    st, clock = make(n_segs=1, default_kv_lease_ttl_ms=5000)
    old = put(st, "k", 1024)
    st.get_replica_list("k")  # reader holds a lease
    st.upsert_start("c0", "k", 1024)
    st.put_end("c0", "k")
    assert st.used == 2048, "old range must not be reused while a reader may still read it"
    clock.advance(4)
    st.tick()
    assert st.used == 2048
    clock.advance(2)
    st.tick()
    assert st.used == 1024
    # the old range is reusable now
    r = put(st, "k2", 1024)
    assert r[0].addr == old[0].addr


def test_bad_arguments_are_600() -> None:
    st, _ = make()
    assert code_of(st.put_start, "c0", "", 10) == ErrorCode.INVALID_PARAMS
    assert code_of(st.put_start, "c0", "k", 0) == ErrorCode.INVALID_PARAMS
    assert code_of(st.put_start, "c0", "k", -5) == ErrorCode.INVALID_PARAMS
    assert code_of(st.put_start, "c0", "k", 10, Cfg(replica_num=0)) == ErrorCode.INVALID_PARAMS
    e = pytest.raises(MooncakeError, st.put_start, "c0", "big", 10 * MiB).value
    assert e.code == ErrorCode.INVALID_PARAMS and "larger than any mounted segment" in e.message
    assert code_of(st.remove_by_regex, "([") == ErrorCode.INVALID_PARAMS
    assert code_of(st.mount_segment, "c9", "x", 0, 0) == ErrorCode.INVALID_PARAMS


def test_no_segment_is_200() -> None:
    st = MasterState(MasterConfig(), clock=Clock())
    assert code_of(st.put_start, "c", "k", 10) == ErrorCode.NO_AVAILABLE_HANDLE


# ---------------------------------------------------------------- placement
def test_replicas_on_distinct_segments_and_preferred_first() -> None:
    st, _ = make(n_segs=3)
    reps = put(st, "k", 1000, Cfg(replica_num=3))
    assert len({r.segment_name for r in reps}) == 3
    for _ in range(5):
        r = put(st, f"p{_}", 1000, Cfg(preferred_segments=["seg2"]))
        assert r[0].segment_name == "seg2"
    # more replicas than segments: one per segment
    reps = put(st, "k4", 1000, Cfg(replica_num=5))
    assert len(reps) == 3 and len({r.segment_name for r in reps}) == 3


def test_preferred_segment_full_falls_back() -> None:
    st, _ = make(n_segs=2, seg_size=4096, eviction_high_watermark_ratio=1.0)
    for i in range(4):
        assert put(st, f"a{i}", 1024, Cfg(preferred_segments=["seg0"], with_hard_pin=True))[0].segment_name == "seg0"
    assert put(st, "b", 1024, Cfg(preferred_segments=["seg0"]))[0].segment_name == "seg1"


def test_addresses_are_inside_segments_and_never_overlap() -> None:
    st, _ = make(n_segs=2, seg_size=256 * 1024)
    rng = random.Random(7)
    spans = []
    for i in range(100):
        for r in st.put_start("c0", f"k{i}", rng.randint(1, 2000), Cfg(replica_num=2)):
            seg = st.segments[r.segment_name]
            assert seg.base <= r.addr and r.addr + r.size <= seg.base + seg.size
            spans.append((r.addr, r.addr + r.size))
        st.put_end("c0", f"k{i}")
    spans.sort()
    for (s1, e1), (s2, _) in zip(spans, spans[1:]):
        assert e1 <= s2


# ---------------------------------------------------------------- leases / remove
def test_lease_blocks_remove_unless_force() -> None:
    st, clock = make(default_kv_lease_ttl_ms=2000)
    put(st, "k", 100)
    assert st.get_replica_list("k").lease_ttl_ms == 2000
    assert code_of(st.remove, "k") == ErrorCode.OBJECT_HAS_LEASE
    assert st.stats.lease_refusals == 1
    clock.advance(2.5)
    st.remove("k")
    assert not st.exist_key("k")
    assert code_of(st.remove, "k") == ErrorCode.OBJECT_NOT_FOUND


def test_force_remove_of_leased_object_defers_memory_reuse() -> None:
    st, clock = make(n_segs=1, default_kv_lease_ttl_ms=2000)
    put(st, "k", 1024)
    st.get_replica_list("k")
    st.remove("k", force=True)
    assert not st.exist_key("k")
    assert st.used == 1024
    clock.advance(3)
    st.tick()
    assert st.used == 0


def test_remove_all_regex_and_batch() -> None:
    st, _ = make()
    for k in ("a1", "a2", "b1", "b2", "c1"):
        put(st, k, 100)
    assert st.remove_by_regex("^a") == 2
    assert st.batch_remove(["b1", "zz"]) == [0, ErrorCode.OBJECT_NOT_FOUND]
    st.get_replica_list("c1")  # leased: remove_all skips it
    assert st.remove_all() == 1
    assert st.batch_exist_key(["b2", "c1"]) == [False, True]


def test_remove_all_and_regex_force_removes_leased() -> None:
    st, clock = make(default_kv_lease_ttl_ms=10_000)
    for k in ("a1", "a2", "b1", "b2"):
        put(st, k, 100)
    for k in ("a1", "b1"):
        st.get_replica_list(k)  # a reader now holds a lease on a1 and b1
    assert st.remove_by_regex("^a") == 1, "without force the leased a1 stays"
    assert st.batch_exist_key(["a1", "a2"]) == [True, False]
    assert st.remove_by_regex("^a", force=True) == 1
    assert not st.exist_key("a1")
    assert st.remove_all() == 1, "without force the leased b1 stays"
    assert st.exist_key("b1")
    assert st.remove_all(force=True) == 1
    assert not st.exist_key("b1")
    assert st.used > 0, "forced-out leased memory waits in the graveyard until the lease ends"
    clock.advance(20)
    st.tick()
    assert st.used == 0
    assert st.remove_all(force=True) == 0


# ---------------------------------------------------------------- eviction
def test_eviction_lru_order_skips_leased_and_hard_pinned() -> None:
    # one segment of 100 KiB; objects of 10 KiB; ratio 0.2 -> 20 KiB per round
    st, clock = make(n_segs=1, seg_size=100 * 1024, eviction_ratio=0.2,
                     eviction_high_watermark_ratio=1.0, default_kv_lease_ttl_ms=60_000)
    put(st, "hard", 10 * 1024, Cfg(with_hard_pin=True))
    st.put_start("c0", "inflight", 10 * 1024, None)  # incomplete puts are never evicted
    for i in range(8):
        put(st, f"k{i}", 10 * 1024)
    st.get_replica_list("k0")  # k0 leased and most recently used
    assert st.used == 100 * 1024
    # full: the next put evicts the two least recently used evictable objects (k1, k2)
    put(st, "new", 10 * 1024)
    assert st.exist_key("hard") and st.exist_key("k0")
    assert not st.exist_key("k1") and not st.exist_key("k2")
    assert st.exist_key("k3")
    assert st.stats.evictions == 2


def test_soft_pinned_evicted_last_and_pin_expires() -> None:
    st, clock = make(n_segs=1, seg_size=40 * 1024, eviction_ratio=0.25,
                     eviction_high_watermark_ratio=1.0)
    put(st, "soft", 10 * 1024, Cfg(soft_pin=True, soft_pin_ttl_ms=5000))
    put(st, "a", 10 * 1024)
    put(st, "b", 10 * 1024)
    put(st, "c", 10 * 1024)
    put(st, "d", 10 * 1024)  # evicts 'a' (oldest not soft-pinned), not 'soft'
    assert st.exist_key("soft") and not st.exist_key("a")
    clock.advance(6)  # soft pin expired: now plain LRU
    put(st, "e", 10 * 1024)
    assert not st.exist_key("soft")


def test_soft_pinned_taken_when_nothing_else() -> None:
    st, _ = make(n_segs=1, seg_size=20 * 1024, eviction_ratio=0.5, eviction_high_watermark_ratio=1.0)
    put(st, "s1", 10 * 1024, Cfg(soft_pin=True))
    put(st, "s2", 10 * 1024, Cfg(soft_pin=True))
    put(st, "x", 10 * 1024)
    assert not st.exist_key("s1") and st.exist_key("s2")
    st2, _ = make(n_segs=1, seg_size=20 * 1024, eviction_ratio=0.5, eviction_high_watermark_ratio=1.0,
                  allow_evict_soft_pinned_objects=False)
    put(st2, "s1", 10 * 1024, Cfg(soft_pin=True))
    put(st2, "s2", 10 * 1024, Cfg(soft_pin=True))
    assert code_of(st2.put_start, "c0", "x", 10 * 1024) == ErrorCode.NO_AVAILABLE_HANDLE


def test_full_and_nothing_evictable_is_200_then_retry_succeeds() -> None:
    st, clock = make(n_segs=1, seg_size=20 * 1024, default_kv_lease_ttl_ms=1000,
                     eviction_high_watermark_ratio=1.0)
    put(st, "a", 10 * 1024)
    put(st, "b", 10 * 1024)
    st.get_replica_list("a")
    st.get_replica_list("b")
    assert code_of(st.put_start, "c0", "c", 10 * 1024) == ErrorCode.NO_AVAILABLE_HANDLE
    assert st.stats.no_space == 1
    clock.advance(1.5)  # leases over
    put(st, "c", 10 * 1024)
    assert st.exist_key("c")


def test_hit_refreshes_lru_position() -> None:
    st, _ = make(n_segs=1, seg_size=30 * 1024, eviction_ratio=0.3, eviction_high_watermark_ratio=1.0,
                 default_kv_lease_ttl_ms=1)
    put(st, "a", 10 * 1024)
    put(st, "b", 10 * 1024)
    put(st, "c", 10 * 1024)
    st.get_replica_list("a")  # a becomes most recent (lease of 1 ms ...)
    st.clock.advance(0.01)  # ... already over
    put(st, "d", 10 * 1024)
    assert st.exist_key("a") and not st.exist_key("b")


def test_watermark_tick_evicts_ratio() -> None:
    st, _ = make(n_segs=1, seg_size=100 * 1024, eviction_high_watermark_ratio=0.9, eviction_ratio=0.2)
    for i in range(8):
        put(st, f"k{i}", 10 * 1024)
    st.tick()
    assert len(st.objects) == 8, "below the watermark nothing is evicted"
    put(st, "k8", 10 * 1024)  # 90%: watermark reached
    st.tick()
    assert len(st.objects) == 7 and not st.exist_key("k0") and not st.exist_key("k1")


# ---------------------------------------------------------------- clients
def test_client_ttl_unmounts_and_drops_replicas() -> None:
    st, clock = make(n_segs=2, client_ttl_s=10)
    put(st, "only0", 100, Cfg(preferred_segments=["seg0"]))
    put(st, "both", 100, Cfg(replica_num=2))
    st.put_start("c0", "inflight0", 100, Cfg(preferred_segments=["seg0"]))
    clock.advance(8)
    st.heartbeat("c1")
    st.tick()
    assert "seg0" in st.segments
    clock.advance(3)  # c0 silent for 11 s, c1 for 3 s
    st.tick()
    assert "seg0" not in st.segments and "seg1" in st.segments
    assert not st.exist_key("only0")
    assert code_of(st.get_replica_list, "only0") == ErrorCode.OBJECT_NOT_FOUND
    assert [r.segment_name for r in st.get_replica_list("both").replicas] == ["seg1"]
    assert "inflight0" not in st.inflight
    assert st.stats.expired_clients == 1
    # the dead client comes back: it is told to remount -- again and again until it does (a
    # reply can be lost: found by bench/robustness/chaos.py), then no more
    assert st.heartbeat("c0").need_remount is True
    assert st.heartbeat("c0").need_remount is True
    st.mount_segment("c0", "seg0", 0x10000000, MiB)
    assert st.heartbeat("c0").need_remount is False


def test_remount_same_name_new_owner_drops_old_objects() -> None:
    st, _ = make(n_segs=1)
    put(st, "k", 100)
    st.mount_segment("c0", "seg0", 0x10000000, MiB)  # identical: idempotent
    assert st.exist_key("k")
    st.mount_segment("c-new", "seg0", 0x50000000, MiB)  # a new process took that name
    assert not st.exist_key("k")


def test_unmount_checks_owner() -> None:
    st, _ = make()
    assert code_of(st.unmount_segment, "c1", "seg0") == ErrorCode.INVALID_PARAMS
    assert code_of(st.unmount_segment, "c0", "nope") == ErrorCode.SEGMENT_NOT_FOUND
    put(st, "k", 10, Cfg(preferred_segments=["seg0"]))
    st.unmount_segment("c0", "seg0")
    assert not st.exist_key("k")


# ---------------------------------------------------------------- recovery (new leader)
def test_report_objects_rebuilds_state_and_reserves_ranges() -> None:
    st, _ = make(n_segs=1)
    reps = {f"k{i}": put(st, f"k{i}", 1000 + i)[0] for i in range(10)}
    # a new master: empty; the client re-mounts and re-reports
    st2 = MasterState(MasterConfig(), clock=Clock())
    assert st2.heartbeat("c0").need_remount
    st2.mount_segment("c0", "seg0", 0x10000000, MiB)
    bogus = [("evil", ReplicaDesc("seg0", 0x10000000 + MiB - 10, 100)),       # outside segment
             ("other", ReplicaDesc("segX", 0x10000000, 100)),                 # not its segment
             ("dup", ReplicaDesc("seg0", reps["k0"].addr, 10))]               # overlaps k0
    n = st2.report_objects("c0", list(reps.items()) + bogus)
    assert n == 10
    for k, r in reps.items():
        assert st2.get_replica_list(k).replicas[0].addr == r.addr
    # new allocations never overlap re-reported ranges
    spans = sorted((r.addr, r.addr + r.size) for r in reps.values())
    for i in range(50):
        r = put(st2, f"n{i}", 1000)[0]
        assert all(r.addr + r.size <= s or r.addr >= e for s, e in spans)
    # another client cannot claim ranges in c0's segment
    assert st2.report_objects("c1", [("x", ReplicaDesc("seg0", 0x10000000 + 900_000, 10))]) == 0


def test_reports_of_one_key_keep_the_highest_version() -> None:
    """An upsert by another client leaves the old bytes in the first writer's segment: after a
    master change both writers report the key, and only the newer write may come back."""
    clock = Clock()
    st = MasterState(MasterConfig(), clock=clock)
    st.mount_segment("o", "segO", 0x100000, MiB)
    st.mount_segment("x", "segX", 0x900000, MiB)
    old = st.put_start("o", "k", 100, Cfg(preferred_segments=["segO"]))[0]
    v1 = st.put_end("o", "k")
    new = st.upsert_start("x", "k", 100, Cfg(preferred_segments=["segX"]))[0]
    v2 = st.put_end("x", "k")
    assert 0 < v1 < v2
    assert st.put_end("x", "k") == 0  # an idempotent retry publishes nothing
    for order in (("o", "x"), ("x", "o")):  # whichever reports first
        st2 = MasterState(MasterConfig(), clock=Clock())
        st2.mount_segment("o", "segO", 0x100000, MiB, prev_epoch=st.epoch)
        st2.mount_segment("x", "segX", 0x900000, MiB, prev_epoch=st.epoch)
        reports = {"o": [("k", old)], "x": [("k", new)]}
        versions = {"o": [v1], "x": [v2]}
        for who in order:
            st2.report_objects(who, reports[who], versions[who])
        got = st2.get_replica_list("k").replicas
        assert [r.segment_name for r in got] == ["segX"], order
        assert st2.segments["segO"].alloc.used == 0  # the stale range is free again
    # an object written through the new master beats any late report
    clock3 = Clock()
    st3 = MasterState(MasterConfig(), clock=clock3)
    st3.mount_segment("o", "segO", 0x100000, MiB, prev_epoch=st.epoch)
    st3.mount_segment("x", "segX", 0x900000, MiB, prev_epoch=st.epoch)
    clock3.advance(1.5)  # past the recovery hold
    put(st3, "k", 100, Cfg(preferred_segments=["segX"]), client="x")
    here = st3.get_replica_list("k").replicas[0].addr
    assert st3.report_objects("o", [("k", old)], [v2 + 10**12]) == 0
    assert st3.get_replica_list("k").replicas[0].addr == here
    # reports without versions (0) never displace anything
    st4 = MasterState(MasterConfig(), clock=Clock())
    st4.mount_segment("x", "segX", 0x900000, MiB, prev_epoch=st.epoch)
    st4.mount_segment("o", "segO", 0x100000, MiB, prev_epoch=st.epoch)
    assert st4.report_objects("x", [("k", new)], [v2]) == 1
    assert st4.report_objects("o", [("k", old)]) == 0
    assert st4.get_replica_list("k").replicas[0].segment_name == "segX"
    # versions stay above everything reported, even from a master whose clock ran ahead
    assert st4.report_objects("x", [("far", ReplicaDesc("segX", 0x900000 + 4096, 100))], [v2 + 10**15]) == 1
    st4.remove("far")
    assert st4.heartbeat("x").removed[0][1] > v2 + 10**15  # the removal notice outranks the report


def test_versions_come_from_the_injected_version_clock() -> None:
    """Versions are the injected wall clock's, kept strictly increasing when it stalls or
    steps back (a successor master with a slow clock still outranks what it was told)."""
    now = [5_000]
    st = MasterState(MasterConfig(), clock=Clock(), version_clock=lambda: now[0])
    st.mount_segment("c0", "seg0", 0x100000, MiB)
    st.put_start("c0", "a", 10)
    assert st.put_end("c0", "a") == 5_000
    st.put_start("c0", "b", 10)
    assert st.put_end("c0", "b") == 5_001  # the clock did not move: one more
    now[0] = 4_000  # stepped back
    st.upsert_start("c0", "a", 10)
    assert st.put_end("c0", "a") > 5_001  # (the overwrite's removal notice takes a version too)
    now[0] = 9_000
    st.put_start("c0", "c", 10)
    assert st.put_end("c0", "c") == 9_000


def test_owners_hear_of_removals_in_their_segments() -> None:
    clock = Clock()
    st = MasterState(MasterConfig(default_kv_lease_ttl_ms=1000), clock=clock)
    st.mount_segment("o", "segO", 0x100000, MiB)
    st.mount_segment("x", "segX", 0x900000, MiB)
    for k in ("a", "b", "c", "leased"):
        put(st, k, 100, Cfg(preferred_segments=["segO"]), client="o")
    assert st.heartbeat("o").removed == []
    st.remove("a")                      # by anyone: o must stop re-reporting it
    st.upsert_start("x", "b", 100, Cfg(preferred_segments=["segX"]))
    st.put_end("x", "b")                # overwritten elsewhere: o's copy is stale
    hb = st.heartbeat("o")
    assert [k for k, _ in hb.removed] == ["a", "b"] and all(stamp > 0 for _, stamp in hb.removed)
    assert hb.removed_all_before == 0 and st.heartbeat("o").removed == []  # delivered once
    assert st.heartbeat("x").removed == []
    st.get_replica_list("leased")       # leased: a plain remove_all skips it
    assert st.remove_all() == 2         # "c", and x's new "b"
    hb = st.heartbeat("o")
    assert [k for k, _ in hb.removed] == ["c"] and hb.removed_all_before == 0
    assert [k for k, _ in st.heartbeat("x").removed] == ["b"]
    assert st.remove_all(force=True) == 1  # "leased"
    assert st.heartbeat("o").removed_all_before > 0


# ---------------------------------------------------------------- SSD tier
def test_offload_flow() -> None:
    st, clock = make(n_segs=1, seg_size=20 * 1024, enable_offload=True, root_fs_dir="/tmp/x",
                     eviction_high_watermark_ratio=1.0, eviction_ratio=0.5, default_kv_lease_ttl_ms=1000)
    put(st, "a", 10 * 1024)
    put(st, "b", 10 * 1024)
    # full: eviction asks the owner to offload 'a' instead of dropping it -> no space yet
    assert code_of(st.put_start, "c0", "c", 10 * 1024) == ErrorCode.NO_AVAILABLE_HANDLE
    hb = st.heartbeat("c0")
    assert [t.key for t in hb.offload_tasks] == ["a"]
    assert hb.offload_tasks[0].replica.kind == "memory"
    assert st.heartbeat("c0").offload_tasks == [], "a task is handed out once"
    st.offload_done("c0", "a", "ab/cdef", 10 * 1024)
    assert st.used == 10 * 1024
    got = st.get_replica_list("a")
    assert [(r.kind, r.path) for r in got.replicas] == [("disk", "ab/cdef")]
    # promotion: a put of a disk-only object brings it back to memory, keeping the disk copy
    st.put_start("c0", "a", 10 * 1024)
    st.put_end("c0", "a")
    kinds = sorted(r.kind for r in st.get_replica_list("a").replicas)
    assert kinds == ["disk", "memory"]
    # evicting an object that already has a disk copy just drops its memory copy at once
    clock.advance(2)  # the lease from the get above is over
    st.get_replica_list("b")  # b: most recently used (and leased)
    st.put_start("c0", "c", 10 * 1024)
    assert [r.kind for r in st.get_replica_list("a").replicas] == ["disk"]
    assert st.heartbeat("c0").offload_tasks == []
    with pytest.raises(MooncakeError):
        st.offload_done("c0", "zz", "../etc/passwd", 1)


def test_offload_failed_evicts_without_disk_and_dead_owner_drops() -> None:
    st, clock = make(n_segs=1, seg_size=20 * 1024, enable_offload=True, root_fs_dir="/tmp/x",
                     eviction_high_watermark_ratio=1.0, eviction_ratio=0.5)
    put(st, "a", 10 * 1024)
    put(st, "b", 10 * 1024)
    code_of(st.put_start, "c0", "c", 10 * 1024)
    st.offload_failed("c0", "a")
    assert not st.exist_key("a")
    put(st, "c", 10 * 1024)


def test_disk_quota_evicts_lru_files() -> None:
    st, clock = make(n_segs=1, seg_size=40 * 1024, enable_offload=True, root_fs_dir="/tmp/x",
                     disk_quota_bytes=25 * 1024, default_kv_lease_ttl_ms=1)
    for k in ("a", "b", "c"):
        put(st, k, 10 * 1024)
        st.tier.offloading[k] = clock()
        st.offload_done("c0", k, f"f/{k}", 10 * 1024)
    assert st.tier.disk_used == 20 * 1024
    assert not st.exist_key("a") and st.exist_key("b") and st.exist_key("c")
    assert "f/a" in st.take_file_deletes()
    assert st.stats.disk_evictions == 1


def test_offload_makes_disk_room_before_the_file_is_written() -> None:
    """Files for offloads in flight are counted before they exist, and the oldest files are
    released when a task is handed out -- so the tier never exceeds its quota, even briefly."""
    st, clock = make(n_segs=1, seg_size=20 * 1024, enable_offload=True, root_fs_dir="/tmp/x",
                     disk_quota_bytes=25 * 1024, eviction_high_watermark_ratio=1.0, eviction_ratio=0.5,
                     default_kv_lease_ttl_ms=1)
    peak = 0
    for i in range(8):
        clock.advance(0.01)
        while True:
            try:
                st.put_start("c0", f"k{i}", 10 * 1024)
                break
            except MooncakeError as e:
                assert e.code == ErrorCode.NO_AVAILABLE_HANDLE
            for t in st.heartbeat("c0").offload_tasks:  # the owner writes the file, then reports
                peak = max(peak, st.tier.disk_used + st.tier.offload_reserved())
                st.offload_done("c0", t.key, f"f/{t.key}", 10 * 1024)
        st.put_end("c0", f"k{i}")
        peak = max(peak, st.tier.disk_used + st.tier.offload_reserved())
    assert 0 < peak <= 25 * 1024
    assert st.stats.disk_evictions > 0 and st.take_file_deletes()


def test_object_bigger_than_the_disk_quota_is_evicted_without_a_file() -> None:
    st, _ = make(n_segs=1, seg_size=20 * 1024, enable_offload=True, root_fs_dir="/tmp/x",
                 disk_quota_bytes=4 * 1024, eviction_high_watermark_ratio=1.0, eviction_ratio=0.5)
    put(st, "a", 10 * 1024)
    put(st, "b", 10 * 1024)
    put(st, "c", 10 * 1024)  # room made by plain eviction: no offload task for 10 KiB > 4 KiB quota
    assert st.heartbeat("c0").offload_tasks == [] and not st.exist_key("a")


def test_memory_per_object_is_small() -> None:
    import tracemalloc

    st, _ = make(n_segs=4, seg_size=1 << 40)
    keys = [f"key-{i:08d}" for i in range(20000)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for k in keys:
        st.put_start("c0", k, 4096)
        st.put_end("c0", k)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    per = (after - before) / len(keys)
    assert per < 300, f"{per:.0f} bytes per object"


def test_recovery_hold_blocks_allocation_but_not_reads() -> None:
    clock = Clock()
    st = MasterState(MasterConfig(recovery_hold_s=10.0), clock=clock)
    # a fresh segment (never mounted at another master) is not held
    assert st.mount_segment("c1", "fresh", 0x100000, MiB).epoch == st.epoch
    put(st, "on-fresh", 100)
    # a segment coming back from an earlier master is held; re-reported objects readable at once
    st.mount_segment("c0", "seg0", 0x1000, MiB, prev_epoch=st.epoch + 1)
    assert st.report_objects("c0", [("old", ReplicaDesc("seg0", 0x1000, 100))]) == 1
    got = st.get_replica_list("old")
    assert got.replicas[0].addr == 0x1000 and got.epoch == st.epoch and got.confirm_after_ms == 8000
    for i in range(20):  # new puts avoid the held segment
        assert st.put_start("c0", f"n{i}", 100, Cfg(preferred_segments=["seg0"]))[0].segment_name == "fresh"
    st.unmount_segment("c1", "fresh")
    e = pytest.raises(MooncakeError, st.put_start, "c0", "new", 100).value
    assert e.code == ErrorCode.NO_AVAILABLE_HANDLE and "recovering" in e.message
    clock.advance(10.1)
    assert st.put_start("c0", "new", 100)[0].segment_name == "seg0"
    # an HA leadership gets a new epoch: segments re-mounted with the old one are held again
    old_epoch = st.epoch
    st.begin_leadership()
    assert st.epoch != old_epoch
    st.mount_segment("c2", "seg2", 0x900000, MiB, prev_epoch=old_epoch)
    st.unmount_segment("c0", "seg0")
    assert code_of(st.put_start, "c0", "new2", 100) == ErrorCode.NO_AVAILABLE_HANDLE
    # the same epoch (an idempotent re-mount) is not a master change: no hold
    st.mount_segment("c3", "seg3", 0xA00000, MiB, prev_epoch=st.epoch)
    assert st.put_start("c3", "new3", 100)[0].segment_name == "seg3"


def test_recovery_hold_off_means_no_confirmation() -> None:
    st = MasterState(MasterConfig(recovery_hold_s=0.0), clock=Clock())
    st.mount_segment("c0", "seg0", 0x1000, MiB, prev_epoch=12345)
    put(st, "k", 100)
    assert st.get_replica_list("k").confirm_after_ms == 0

def test_an_expired_client_gets_its_missed_removals_when_it_comes_back() -> None:
    """Found by bench/robustness/chaos.py: a client silent past client_ttl lost its pending removal
    notices with its record, came back, and re-reported objects removed meanwhile (whose
    ranges other writers could already be writing: foreign bytes)."""
    st, clock = make(client_ttl_s=2.0)
    st.heartbeat("c0")
    reps = put(st, "k", 100, Cfg(preferred_segments=["seg0"]))
    assert reps[0].segment_name == "seg0"
    st.remove("k")  # the notice for c0 waits for its next heartbeat -- which comes too late
    clock.advance(2.5)
    st.tick()  # c0 expired: its segment and objects are gone
    assert "seg0" not in st.segments
    reply = st.heartbeat("c0")
    assert reply.need_remount
    assert [k for k, _ in reply.removed] == ["k"] or reply.removed_all_before > 0
    st.mount_segment("c0", "seg0", 0x10000000, MiB)  # re-mounted: the notices are done
    assert not st.heartbeat("c0").removed
    # a client that does not come back within 2 x client_ttl is forgotten
    st2, clock2 = make(n_segs=1, client_ttl_s=2.0)
    put(st2, "j", 100)
    st2.remove("j")
    clock2.advance(2.5)
    st2.tick()
    assert st2.absent.departed
    clock2.advance(4.5)
    st2.tick()
    assert not st2.absent.departed and not st2.heartbeat("c0").removed


def test_a_segment_back_after_an_expiry_waits_for_the_leases_it_held() -> None:
    st, clock = make(n_segs=1, client_ttl_s=2.0, default_kv_lease_ttl_ms=5000)
    put(st, "k", 100)
    st.get_replica_list("k")  # a reader copies under a 5 s lease
    clock.advance(2.5)
    st.tick()  # the owner expired while the reader may still be copying
    st.mount_segment("c0", "seg0", 0x10000000, MiB)
    assert code_of(st.put_start, "c0", "new", 100) == ErrorCode.NO_AVAILABLE_HANDLE
    clock.advance(2.6)  # past the lease granted 5.1 s ago
    assert st.put_start("c0", "new", 100)[0].segment_name == "seg0"


def test_a_failed_puts_range_waits_for_two_heartbeats_of_its_owner() -> None:
    """Found by bench/robustness/chaos.py: a writer that timed out on a stopped owner may have a request
    queued in the owner's socket; the owner applies it on resuming. The range must not be
    handed to another put before the owner has provably run again (two heartbeats)."""
    st, _ = make(n_segs=1, seg_size=MiB)
    st.heartbeat("c0")
    a = st.put_start("w", "lost", 900 << 10)[0]  # client "w" writes into c0's segment
    st.put_revoke("w", "lost")  # its transfer timed out
    assert code_of(st.put_start, "x", "next", 900 << 10) == ErrorCode.NO_AVAILABLE_HANDLE
    st.heartbeat("c0")
    assert code_of(st.put_start, "x", "next", 900 << 10) == ErrorCode.NO_AVAILABLE_HANDLE
    st.heartbeat("c0")
    assert st.put_start("x", "next", 900 << 10)[0].addr == a.addr
    # a failed put into the writer's own segment (a memcpy: nothing in flight) frees at once
    st.put_revoke("x", "next")
    st.heartbeat("c0")
    st.heartbeat("c0")
    b = st.put_start("c0", "own", 900 << 10)[0]
    st.put_revoke("c0", "own")
    assert st.put_start("c0", "own2", 900 << 10)[0].addr == b.addr


def test_puts_in_flight_into_an_expired_segment_keep_their_ranges_when_it_comes_back() -> None:
    """Found by bench/robustness/chaos.py: a segment unmounted for its owner's silence dropped the puts
    being written into it; re-mounted, their ranges were free at once, so a new object could
    get one while the old writer's bytes (delayed by the same network trouble) still arrived."""
    st, clock = make(n_segs=1, seg_size=MiB, client_ttl_s=2.0)
    a = st.put_start("w", "slow", 900 << 10)[0]  # w is still writing into c0's segment
    clock.advance(2.5)
    st.heartbeat("w")
    st.tick()  # c0 expired, its segment unmounted
    st.mount_segment("c0", "seg0", 0x10000000, MiB)
    assert code_of(st.put_end, "w", "slow") == ErrorCode.OBJECT_NOT_FOUND  # the put itself is lost
    assert code_of(st.put_start, "x", "next", 900 << 10) == ErrorCode.NO_AVAILABLE_HANDLE
    # an object the owner re-reports over that range is refused (it cannot be intact)
    assert st.report_objects("c0", [("old", ReplicaDesc("seg0", a.addr, 1000))]) == 0
    clock.advance(st.cfg.put_start_discard_timeout_s + 5.0)
    st.heartbeat("c0")
    st.tick()
    assert st.put_start("x", "next", 900 << 10)[0].addr == a.addr


def test_a_lost_heartbeat_reply_does_not_lose_the_remount_or_the_missed_removals() -> None:
    """Found by bench/robustness/chaos.py: a heartbeat sent before a partition reached the master after
    it (the timed-out connection kept retransmitting); the master answered need_remount and
    the missed removal notices to a client no longer listening, and answered the client's
    next heartbeat with neither -- it never re-mounted, and after the next failover it
    re-reported a removed object."""
    st, clock = make(client_ttl_s=2.0)
    st.heartbeat("c0")
    put(st, "k", 100, Cfg(preferred_segments=["seg0"]))
    st.remove("k")
    clock.advance(2.5)
    st.heartbeat("c1")
    st.tick()  # c0 expired with the notice undelivered
    lost = st.heartbeat("c0")  # this reply never arrives
    assert lost.need_remount and [k for k, _ in lost.removed] == ["k"]
    again = st.heartbeat("c0")
    assert again.need_remount and [k for k, _ in again.removed] == ["k"]
    st.mount_segment("c0", "seg0", 0x10000000, MiB)
    done = st.heartbeat("c0")
    assert not done.need_remount and not done.removed


def test_a_key_removed_between_two_owners_reports_stays_removed() -> None:
    """Found by bench/robustness/chaos.py: after a failover, owner A re-reported an old copy of a key
    (its removal notice died with the old master), a remove was acknowledged, then owner B
    re-reported the newer value -- and every reader got the removed value back."""
    st, clock = make(client_ttl_s=2.0)
    v_old, v_new = 10**18, 10**18 + 5
    assert st.report_objects("c0", [("k", ReplicaDesc("seg0", 0x10000000, 100))], [v_old]) == 1
    st.remove("k")
    assert st.report_objects("c1", [("k", ReplicaDesc("seg1", 0x20000000, 100))], [v_new]) == 0
    assert code_of(st.get_replica_list, "k") == ErrorCode.OBJECT_NOT_FOUND
    # B is told to forget its copy, so the next master change does not bring it back either
    assert "k" in [k for k, _ in st.heartbeat("c1").removed]
    # a value written after the remove is not held back
    put(st, "k", 100, client="c1")
    assert st.get_replica_list("k").replicas
    # the tombstones go with the re-report window
    clock.advance(4.5)
    st.heartbeat("c0")
    st.heartbeat("c1")
    st.tick()
    assert not st.absent.tombstones
    # outside a re-report window a remove leaves no tombstone
    put(st, "j", 100)
    st.remove("j")
    assert "j" not in st.absent.tombstones


def test_a_key_removed_while_its_owner_was_expired_stays_removed_when_it_comes_back() -> None:
    """Found by bench/robustness/chaos.py (10-minute run): a client isolated past client_ttl was expired
    (its objects dropped); meanwhile others wrote and removed its keys; back, it re-mounted
    and re-reported its old copies -- and readers got a removed value."""
    st, clock = make(client_ttl_s=2.0)
    st.heartbeat("c0")
    old = put(st, "k", 100, Cfg(preferred_segments=["seg0"]))[0]
    v_old = st.versions.last
    clock.advance(2.5)
    st.heartbeat("c1")
    st.tick()  # c0 expired
    put(st, "k", 100, Cfg(preferred_segments=["seg1"]), client="c1")
    st.remove("k")
    assert st.heartbeat("c0").need_remount
    st.mount_segment("c0", "seg0", 0x10000000, MiB)
    assert st.report_objects("c0", [("k", old)], [v_old]) == 0
    assert code_of(st.get_replica_list, "k") == ErrorCode.OBJECT_NOT_FOUND
