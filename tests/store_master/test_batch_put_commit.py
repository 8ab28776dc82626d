"""Unit tests of ``MasterState.batch_put_commit``: batch puts in one round trip through a
per-client batch reservation (pure: no sockets, injected clock)."""

from __future__ import annotations

from array import array

from mooncake_core.errors import ErrorCode
from mooncake_core.store.master_batch import batch_reservation_key
from mooncake_core.store.protocol import ReplicateConfigMsg as Cfg

from tests.store_master.test_master_state import MiB, code_of, make


def used(st) -> int:
    return sum(s.alloc.used for s in st.segments.values())


def blob(sizes: list[int]) -> bytes:
    return array("Q", sizes).tobytes()


def addrs(reply) -> list[int]:
    return array("Q", reply.addrs).tolist()


def versions(reply) -> list[int]:
    return array("q", reply.versions).tolist()


def test_commit_publishes_then_the_next_batch_comes_from_the_reservation() -> None:
    st, clock = make(n_segs=1)
    sizes = [1000, 1024, 3000]
    st.batch_put_start("c0", ["a", "b", "c"], sizes)
    got = st.batch_put_commit("c0", ["a", "b", "c"], b"", Cfg(), False, blob(sizes))
    assert all(v > 0 for v in versions(got)) and all(st.exist_key(k) for k in "abc")
    assert got.segment == "seg0" and got.epoch == st.epoch
    ra = addrs(got)
    assert [b - a for a, b in zip(ra, ra[1:])] == [1024, 1024], "laid end to end, each rounded to 64 bytes"
    assert st.puts_in_flight == 0 and st.reservations_by_segment() == {"seg0": 1}
    before = st.segments["seg0"].alloc.num_allocations
    nxt = st.batch_put_commit("c0", ["x", "y", "z"], blob(sizes), Cfg(), True, blob(sizes))
    assert min(versions(nxt)) > max(versions(got))
    assert [st.get_replica_list(k).replicas[0].addr for k in "xyz"] == ra
    assert [st.get_size(k) for k in "xyz"] == sizes
    assert st.segments["seg0"].alloc.num_allocations == before + 3, "3 objects + the new reservation for the old one"
    assert used(st) == 2 * (1024 + 1024 + 3008) + (1024 + 1024 + 3008)
    # each published object is freed on its own, and frees exactly its range
    for k in "xyz":
        st.remove(k, force=True)
    for _ in range(6):  # past the read leases (10 s) of the get_replica_list calls above
        clock.advance(2.0)
        st.heartbeat("c0")
        st.tick()
    assert used(st) == 2 * (1024 + 1024 + 3008)


def test_keys_that_exist_or_are_in_flight_get_their_codes_and_their_ranges_back() -> None:
    st, _ = make(n_segs=1)
    st.batch_put_start("c0", ["a", "b"], [1024, 1024])
    got = st.batch_put_commit("c0", ["a", "b"], b"", Cfg(), False, blob([1024] * 3))
    old = st.get_replica_list("a").replicas[0].addr
    st.put_start("c1", "busy", 1024)  # another client's put of "busy" is in progress
    nxt = st.batch_put_commit("c0", ["a", "fresh", "busy"], blob([1024] * 3), Cfg(), True, b"")
    codes = versions(nxt)
    assert codes[0] == ErrorCode.OBJECT_ALREADY_EXISTS and codes[2] == ErrorCode.OBJECT_ALREADY_EXISTS
    assert codes[1] > 0 and st.get_replica_list("fresh").replicas[0].addr == addrs(got)[1]
    assert st.get_replica_list("a").replicas[0].addr == old, "the old value stays"
    assert not st.exist_key("busy")
    assert nxt.segment == "" and nxt.addrs == b"", "no next sizes: no reservation"
    assert used(st) == 1024 * 4, "a, b, fresh and busy's put; the unpublished ranges are free again"


def test_commit_without_or_with_a_mismatched_reservation_is_refused() -> None:
    st, _ = make(n_segs=1)
    assert code_of(st.batch_put_commit, "c0", ["x"], blob([1024]), Cfg(), True, b"") == ErrorCode.OBJECT_NOT_FOUND
    st.batch_put_commit("c0", [], b"", Cfg(), False, blob([1024, 1024]))
    assert code_of(st.batch_put_commit, "c1", ["x", "y"], blob([1024, 1024]), Cfg(), True, b"") \
        == ErrorCode.OBJECT_NOT_FOUND, "another client cannot use ours"
    assert code_of(st.batch_put_commit, "c0", ["x", "y"], blob([1024, 1000]), Cfg(), True, b"") \
        == ErrorCode.INVALID_PARAMS
    assert code_of(st.batch_put_commit, "c0", ["x"], blob([1024, 1024]), Cfg(), True, b"") == ErrorCode.INVALID_PARAMS
    assert code_of(st.batch_put_commit, "c0", ["x", "y"], blob([1024, 1024]), Cfg(with_hard_pin=True), True, b"") \
        == ErrorCode.INVALID_PARAMS
    assert not st.exist_key("x") and not st.exist_key("y")
    # still there after the refusals
    assert min(versions(st.batch_put_commit("c0", ["x", "y"], blob([1024, 1024]), Cfg(), True, b""))) > 0


def test_reservations_are_bounded_and_never_evict() -> None:
    st, _ = make(n_segs=1, seg_size=MiB)
    assert st.batch_put_commit("c0", [], b"", Cfg(), False, blob([MiB // 2])).segment == "", \
        "more than a quarter of the free bytes: no reservation"
    assert st.batch_put_commit("c0", [], b"", Cfg(), False, blob([0, 1024])).segment == "", "a size of 0"
    assert st.batch_put_commit("c0", [], b"", Cfg(), False, b"\x01\x02").segment == "", "malformed sizes"
    two, _ = make(n_segs=2)
    assert two.batch_put_commit("c0", [], b"", Cfg(replica_num=2), False, blob([1024])).segment == "", \
        "two replicas: no reservation"
    assert two.batch_put_commit("c0", [], b"", Cfg(preferred_segments=["seg1"]), False, blob([1024])).segment \
        == "seg1"
    assert used(st) == 0


def test_a_reservation_follows_client_expiry_and_unmount() -> None:
    st, clock = make(n_segs=2, client_ttl_s=10.0)
    st.heartbeat("c9")
    st.batch_put_commit("c9", [], b"", Cfg(), False, blob([1024] * 4))
    assert batch_reservation_key("c9") in st.inflight
    for _ in range(3):
        clock.advance(6.0)
        for c in ("c0", "c1"):
            st.heartbeat(c)
        st.tick()
    assert batch_reservation_key("c9") not in st.inflight, "an expired client's reservation is released"
    for _ in range(3):  # quarantined until the segment's owner has sent two more heartbeats
        for c in ("c0", "c1"):
            st.heartbeat(c)
    assert used(st) == 0
    got = st.batch_put_commit("c0", [], b"", Cfg(preferred_segments=["seg1"]), False, blob([1024, 1024]))
    assert got.segment == "seg1"
    st.unmount_segment("c1", "seg1")
    assert code_of(st.batch_put_commit, "c0", ["a", "b"], blob([1024, 1024]), Cfg(preferred_segments=["seg1"]),
                   True, b"") == ErrorCode.OBJECT_NOT_FOUND
    assert not st.exist_key("a")


def test_commit_publishes_key_events_in_order() -> None:
    st, _ = make(n_segs=1)
    st.batch_put_commit("c0", [], b"", Cfg(), False, blob([1024] * 3))
    st.batch_put_commit("c0", ["p", "q", "r"], blob([1024] * 3), Cfg(), True, b"")
    events, cursor, gap = st.key_events.since(0)
    assert not gap and [k for _, _, k in events] == ["p", "q", "r"] and cursor == 3
