"""Reservations and quarantine never make a put fail, nor evict anyone's object, while the
space they hold could serve it (pure master state, injected clock, no sockets).

The shape of the case found running the store as a user would: one owner's segment ("w"),
a writer without memory of its own ("c") that keeps a next-put reservation and a batch
reservation there, and quarantined ranges of its replaced reservations and failed puts.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store.master_batch import batch_reservation_key
from mooncake_core.store.master_records import RESERVATION_PREFIX
from mooncake_core.store.master_space import SpaceReclaiming, reclaim_wait
from mooncake_core.store.master_state import MasterConfig, MasterState
from mooncake_core.store.packing import U64, pack

MiB = 1 << 20
SEG = 512 * MiB
BIG = 64 * MiB


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def pool(n_segs: int = 1, seg_size: int = SEG, **cfg) -> tuple[MasterState, Clock]:
    clock = Clock()
    st = MasterState(MasterConfig(**cfg), clock=clock)
    for i in range(n_segs):
        st.mount_segment(f"w{i}", f"seg{i}", 0x10000000000 * (i + 1), seg_size)
    return st, clock


def store(st: MasterState, key: str, size: int, client: str = "c", next_size: int = 0,
          release: list[int] | None = None) -> list[int]:
    """put_start (``release``: the reservation it does not use) + put_commit asking for a
    reservation of ``next_size``: the reservation's first address, or []."""
    st.put_start(client, key, size, release=release or [])
    got = st.put_commit(client, key, size, None, False, next_size)
    return [got.reservation[0].addr] if got.reservation else []


def reservation(st: MasterState, client: str = "c", batch: bool = False):
    return st.inflight.get(batch_reservation_key(client) if batch else RESERVATION_PREFIX + client)


def live(st: MasterState) -> set[str]:
    return set(st.objects)


def test_a_reservation_the_holder_does_not_use_is_freed_at_once_by_its_put() -> None:
    """The issue's shape: five 64 MiB objects (read, so leased: nothing evictable) and small
    ones, the writer's next-put reservation of 64 MiB and its batch reservation. The put
    that does not use the reservation names it (``release``): freed first, no eviction."""
    st, clock = pool()
    for i in range(4):
        store(st, f"s{i}", MiB)
    st.batch_put_start("c", [f"b{i}" for i in range(8)], [256 << 10] * 8)
    got = st.batch_put_commit("c", [f"b{i}" for i in range(8)], b"", None, False, pack(U64, [8 << 20] * 8))
    assert got.segment, "a batch reservation is held"
    resv: list[int] = []
    held = []
    for i in range(6):  # each put names the reservation it does not use (another size, or old)
        before = live(st)
        resv = store(st, f"big{i}", BIG, next_size=BIG, release=resv)
        st.get_replica_list(f"big{i}")  # leased: not evictable
        assert live(st) == before | {f"big{i}"}, "no object was evicted"
        held.append(bool(resv))
    assert held[0], "the writer held a 64 MiB next-put reservation"
    assert not held[-1], "and none once it would take the segment's last room"
    assert st.used == 6 * BIG + 4 * MiB + 8 * (256 << 10) + 64 * MiB


def test_reclaim_order_young_reservation_waits_then_old_one_is_taken_back() -> None:
    """Without the holder's word: a young reservation (its holder may be writing) makes the
    put wait (-200 with a wait, nothing evicted); past ``reservation_reclaim_s`` and two
    heartbeats of the segment's owner it is taken back and the put goes through."""
    st, clock = pool(seg_size=4 * BIG)
    store(st, "a", BIG)
    store(st, "b", BIG, next_size=BIG)  # reservation: 64 MiB; free: 64 MiB
    store(st, "evictable", BIG - MiB, client="d")  # not read: evictable, and what fills the rest
    assert reservation(st) is not None
    before = live(st)
    with pytest.raises(SpaceReclaiming) as ei:
        st.put_start("d", "x", BIG)
    assert ei.value.code == ErrorCode.NO_AVAILABLE_HANDLE
    assert reclaim_wait(str(ei.value)) == pytest.approx(ei.value.wait_s, abs=0.01)
    assert live(st) == before, "nobody's object is evicted while a reservation could serve the put"
    clock.t += st.cfg.reservation_reclaim_s + 0.01  # the holder writes into it no more
    with pytest.raises(SpaceReclaiming):  # now quarantined: a late write may still land
        st.put_start("d", "x", BIG)
    assert reservation(st) is None
    for _ in range(2):
        clock.t += 1.0
        st.heartbeat("w0")
    st.put_start("d", "x", BIG)
    assert live(st) == before, "served from the reservation's space, not by eviction"


def test_an_old_reservation_whose_owner_beat_since_is_freed_at_once() -> None:
    st, clock = pool(seg_size=3 * BIG)
    store(st, "a", BIG, next_size=BIG)
    store(st, "b", BIG // 2, client="d")
    clock.t += st.cfg.reservation_reclaim_s + 0.1
    for _ in range(2):  # the owner ran since the reservation stopped being writable
        clock.t += 0.5
        st.heartbeat("w0")
    before = live(st)
    st.put_start("d", "x", BIG)
    assert live(st) == before


def test_quarantined_ranges_are_waited_for_not_evicted_for() -> None:
    """A failed remote write's range waits for two heartbeats of its owner (a request may be
    queued there); a put needing it waits meanwhile, and evicts nobody."""
    st, clock = pool(seg_size=3 * BIG)
    store(st, "keep", BIG, client="d")
    st.put_start("c", "failed", 2 * BIG)
    st.put_revoke("c", "failed")  # c wrote into w0's segment: quarantined
    assert st.clients["w0"].quarantine
    before = live(st)
    with pytest.raises(SpaceReclaiming):
        st.put_start("d", "x", BIG)
    assert live(st) == before
    st.heartbeat("w0")
    st.heartbeat("w0")
    st.put_start("d", "x", BIG)
    assert live(st) == before


def test_heartbeat_releases_by_address_only_what_it_names() -> None:
    st, _ = pool()
    resv = store(st, "a", MiB, next_size=MiB)
    assert resv and reservation(st) is not None
    st.heartbeat("c", [resv[0] + 4096])  # not our reservation's address: nothing
    st.heartbeat("other", resv)  # another client's word: nothing
    assert reservation(st) is not None
    used = st.used
    st.heartbeat("c", resv)
    assert reservation(st) is None and st.used < used


def test_a_reservation_never_takes_a_segments_last_room() -> None:
    st, _ = pool(seg_size=4 * BIG)
    store(st, "a", BIG)
    assert store(st, "b", BIG, next_size=BIG), "room for it and as much again: reserved"
    st.heartbeat("c", [st.inflight[RESERVATION_PREFIX + "c"].reps[0][0].base
                       + st.inflight[RESERVATION_PREFIX + "c"].reps[0][1]])
    store(st, "c1", BIG)
    assert not store(st, "c2", BIG // 2, next_size=BIG), "would leave less than itself free: none"


def test_the_watermark_does_not_evict_for_reservations() -> None:
    st, _ = pool(seg_size=10 * MiB, eviction_high_watermark_ratio=0.6)
    store(st, "a", 4 * MiB)
    store(st, "b", MiB, next_size=2 * MiB)  # used 7 MiB of 10, 5 of them objects
    st.tick()
    assert live(st) == {"a", "b"}


def test_a_full_pool_says_what_holds_each_segment() -> None:
    st, _ = pool(seg_size=3 * BIG)
    for k in ("a", "b"):
        store(st, k, BIG)
        st.get_replica_list(k)
    st.put_start("c", "writing", BIG // 2)
    with pytest.raises(MooncakeError) as ei:
        st.put_start("d", "x", BIG)
    msg = str(ei.value)
    assert not isinstance(ei.value, SpaceReclaiming) and reclaim_wait(msg) is None
    assert ei.value.code == ErrorCode.NO_AVAILABLE_HANDLE
    assert f"objects {2 * BIG} ({2 * BIG} leased)" in msg and f"puts being written {BIG // 2}" in msg
    assert "seg0:" in msg and "largest free range" in msg


def test_batch_put_start_says_when_to_ask_again() -> None:
    st, _ = pool(seg_size=2 * BIG)
    store(st, "a", BIG, next_size=BIG // 2)
    pl = st.batch_put_start("d", ["x", "y"], [BIG // 2, BIG // 2])
    assert pl.retry_after_ms > 0
    st.heartbeat("c", [st.inflight[RESERVATION_PREFIX + "c"].reps[0][0].base
                       + st.inflight[RESERVATION_PREFIX + "c"].reps[0][1]])
    pl = st.batch_put_start("d", ["x2", "y2"], [BIG // 2, BIG // 2])
    assert pl.retry_after_ms == 0 and bytes(pl.codes) == bytes(8)


# ---------------------------------------------------------------- property
S = 64 << 10  # one object size: every range is a multiple of it, so free bytes are usable bytes
CLIENTS = ["c0", "c1", "w0", "w1"]  # w0, w1 own the segments; c0, c1 have none
op = hs.one_of(
    hs.tuples(hs.just("put"), hs.sampled_from(CLIENTS), hs.integers(0, 2)),  # 0 none, 1 reserve, 2 use+reserve
    hs.tuples(hs.just("batch"), hs.sampled_from(CLIENTS), hs.integers(1, 4)),
    hs.tuples(hs.just("revoke"), hs.sampled_from(CLIENTS), hs.integers(1, 3)),
    hs.tuples(hs.just("remove"), hs.sampled_from(CLIENTS), hs.integers(0, 40)),
    hs.tuples(hs.just("read"), hs.sampled_from(CLIENTS), hs.integers(0, 40)),
    hs.tuples(hs.just("beat"), hs.sampled_from(CLIENTS), hs.integers(0, 1)),
    hs.tuples(hs.just("wait"), hs.sampled_from(CLIENTS), hs.integers(1, 12)),
)


def _room(st: MasterState, n: int) -> bool:
    """Free plus reclaimable (reservations, quarantine) bytes fit ``n`` on some segment."""
    held = st.reclaimable()
    return any(s.alloc.free_bytes + held.get(s, 0) >= n for s in st.segments.values())


@settings(max_examples=300, deadline=None)
@given(ops=hs.lists(op, min_size=10, max_size=80))
def test_no_refusal_nor_eviction_while_reclaimable_space_could_serve(ops) -> None:
    st, clock = pool(2, 6 * S, reservation_reclaim_s=1.0, eviction_ratio=0.0)
    n = 0
    resv: dict[str, list[int]] = {}

    def start(cid: str, key: str, release: list[int]) -> bool:
        room, before = _room(st, S), set(st.objects)
        try:
            st.put_start(cid, key, S, release=release)
        except SpaceReclaiming:
            assert room, "asked to wait with nothing to wait for"
            assert set(st.objects) == before, "evicted while reclaimable space could serve"
            return False
        except MooncakeError as e:
            assert e.code == ErrorCode.NO_AVAILABLE_HANDLE
            assert not room, f"-200 while free + reclaimable >= {S}: {e}"
            return False
        if room:
            assert set(st.objects) == before, "evicted while reclaimable space could serve"
        return True

    for kind, cid, arg in ops:
        n += 1
        key = f"k{n}"
        if kind == "put":
            mine = resv.pop(cid, [])
            if arg == 2 and mine:
                try:
                    got = st.put_commit(cid, key, S, None, True, S)
                except MooncakeError:
                    continue
            else:
                if not start(cid, key, mine if arg else []):
                    continue
                got = st.put_commit(cid, key, S, None, False, S if arg else 0)
            if got.reservation:
                resv[cid] = [got.reservation[0].addr]
        elif kind == "batch":
            keys = [f"{key}.{i}" for i in range(arg)]
            if not _room(st, S):
                continue
            pl = st.batch_put_start(cid, keys, [S] * arg)
            done = [k for k, c in zip(keys, memoryview(pl.codes).cast("i")) if c == 0]
            st.batch_put_commit(cid, done, b"", None, False, pack(U64, [S] * arg))
        elif kind == "revoke":
            if start(cid, key, []):
                st.put_revoke(cid, key)
        elif kind == "remove":
            keys = sorted(st.objects)
            if keys:
                st.remove(keys[arg % len(keys)], force=True)
        elif kind == "read":
            keys = sorted(st.objects)
            if keys:
                st.get_replica_list(keys[arg % len(keys)])
        elif kind == "beat":
            st.heartbeat(cid, resv.pop(cid, []) if arg else [])
        else:
            clock.t += arg / 10
    # liveness: once every holder's time is up and every owner ran, the space serves a put
    clock.t += st.cfg.reservation_reclaim_s + 0.1
    for _ in range(2):
        for cid in list(st.clients):
            st.heartbeat(cid)
    if _room(st, S):
        st.put_start("c0", "last", S)
