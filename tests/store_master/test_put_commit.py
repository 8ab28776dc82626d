"""Unit tests of ``MasterState.put_commit``: single puts in one round trip through a
per-client reservation (pure: no sockets, injected clock)."""

from __future__ import annotations

from mooncake_core.errors import ErrorCode
from mooncake_core.store.master_state import RESERVATION_PREFIX
from mooncake_core.store.protocol import ReplicateConfigMsg as Cfg

from tests.store_master.test_master_state import MiB, code_of, make


def used(st) -> int:
    return sum(s.alloc.used for s in st.segments.values())


def test_commit_publishes_and_reserves_the_next_put() -> None:
    st, _ = make(n_segs=1)
    reps = st.put_start("c0", "a", 1024)
    got = st.put_commit("c0", "a", 1024, Cfg(), False, 1024)
    assert got.version > 0 and st.exist_key("a") and got.epoch == st.epoch
    assert len(got.reservation) == 1 and got.reservation[0].size == 1024
    assert got.reservation[0].addr != reps[0].addr, "the reservation is a range of its own"
    assert not st.exist_key(RESERVATION_PREFIX + "c0"), "a reservation is never an object"
    assert st.puts_in_flight == 0, "nor a put in flight (metrics, dashboard)"
    assert st.reservations_by_segment() == {"seg0": 1}
    assert used(st) == 2048
    # the next put was written into the reservation: published from there, one call
    nxt = st.put_commit("c0", "b", 1024, Cfg(), True, 1024)
    assert nxt.version > got.version
    assert [r.addr for r in st.get_replica_list("b").replicas] == [got.reservation[0].addr]
    assert used(st) == 3072  # a, b and the new reservation
    assert nxt.reservation and nxt.reservation[0].addr not in (reps[0].addr, got.reservation[0].addr)


def test_commit_of_an_existing_key_keeps_old_value_and_reservation() -> None:
    st, _ = make(n_segs=1)
    st.put_start("c0", "a", 1024)
    resv = st.put_commit("c0", "a", 1024, Cfg(), False, 1024).reservation
    old = st.get_replica_list("a").replicas[0].addr
    assert code_of(st.put_commit, "c0", "a", 1024, Cfg(), True, 1024) == ErrorCode.OBJECT_ALREADY_EXISTS
    assert st.get_replica_list("a").replicas[0].addr == old
    # the reservation is untouched: the next fresh key still publishes from it
    st.put_commit("c0", "b", 1024, Cfg(), True, 0)
    assert st.get_replica_list("b").replicas[0].addr == resv[0].addr
    assert used(st) == 2048  # next_size 0: no new reservation


def test_commit_without_or_with_a_mismatched_reservation_is_refused() -> None:
    st, _ = make(n_segs=1)
    assert code_of(st.put_commit, "c0", "x", 1024, Cfg(), True, 1024) == ErrorCode.OBJECT_NOT_FOUND
    st.put_start("c0", "a", 1024)
    st.put_commit("c0", "a", 1024, Cfg(), False, 1024)
    assert code_of(st.put_commit, "c1", "x", 1024, Cfg(), True, 0) == ErrorCode.OBJECT_NOT_FOUND, \
        "another client cannot use ours"
    assert code_of(st.put_commit, "c0", "x", 1023, Cfg(), True, 0) == ErrorCode.INVALID_PARAMS
    assert code_of(st.put_commit, "c0", "x", 1024, Cfg(with_hard_pin=True), True, 0) == ErrorCode.INVALID_PARAMS
    assert not st.exist_key("x")


def test_a_new_reservation_replaces_the_old_one() -> None:
    st, _ = make(n_segs=1)
    st.put_start("c0", "a", 1024)
    st.put_commit("c0", "a", 1024, Cfg(), False, 1024)
    st.put_start("c0", "b", 4096)
    st.put_commit("c0", "b", 4096, Cfg(), False, 4096)
    assert used(st) == 1024 + 4096 + 4096, "the 1024-byte reservation was freed (own segment: at once)"
    assert st.inflight[RESERVATION_PREFIX + "c0"].size == 4096


def test_reservations_never_evict_and_follow_client_expiry() -> None:
    st, clock = make(n_segs=1, seg_size=MiB, client_ttl_s=10.0)
    st.put_start("c0", "big", MiB - 1024)
    got = st.put_commit("c0", "big", MiB - 1024, Cfg(), False, 4096)
    assert got.version > 0 and got.reservation == [], "no room without evicting: no reservation"
    assert st.exist_key("big")
    st2, clock2 = make(n_segs=2, client_ttl_s=10.0)
    st2.heartbeat("c9")  # a client without memory, known by its heartbeats, which then stop
    st2.put_start("c9", "a", 1024)
    st2.put_commit("c9", "a", 1024, Cfg(), False, 1024)
    for _ in range(3):
        clock2.advance(6.0)
        for c in ("c0", "c1"):
            st2.heartbeat(c)
        st2.tick()
    assert RESERVATION_PREFIX + "c9" not in st2.inflight, "an expired client's reservation is released"


def test_unmounting_the_target_segment_drops_the_reservation() -> None:
    st, _ = make(n_segs=2)
    st.put_start("c0", "a", 1024, Cfg(preferred_segments=["seg1"]))
    got = st.put_commit("c0", "a", 1024, Cfg(preferred_segments=["seg1"]), False, 1024)
    assert got.reservation[0].segment_name == "seg1"
    st.unmount_segment("c1", "seg1")
    assert code_of(st.put_commit, "c0", "b", 1024, Cfg(preferred_segments=["seg1"]), True, 0) \
        == ErrorCode.OBJECT_NOT_FOUND
    assert not st.exist_key("b")


def test_reservation_honours_the_recovery_hold() -> None:
    st, clock = make(n_segs=1, recovery_hold_s=1.0)
    st.put_start("c0", "a", 1024)
    st.put_commit("c0", "a", 1024, Cfg(), False, 1024)
    # a restarted master: the re-mounted segment takes no allocation during the hold
    fresh, _ = make(n_segs=0, recovery_hold_s=1.0)
    fresh.clock = clock
    fresh.mount_segment("c0", "seg0", 0x10000000, MiB, prev_epoch=st.epoch)
    assert code_of(fresh.put_commit, "c0", "b", 1024, Cfg(), True, 1024) == ErrorCode.OBJECT_NOT_FOUND
    with_hold = fresh.put_start
    assert code_of(with_hold, "c0", "b", 1024) == ErrorCode.NO_AVAILABLE_HANDLE
