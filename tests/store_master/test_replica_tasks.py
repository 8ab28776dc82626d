"""Copy/move tasks, segment drains and per-segment replica clearing in the master's pure
state (``master_tasks``): no sockets, a fake clock; the executing client is played by the
test (``heartbeat`` hands out the task, ``done`` answers it)."""

from __future__ import annotations

import pytest

from mooncake_core.errors import MooncakeError
from mooncake_core.store.master_records import MasterConfig
from mooncake_core.store.master_state import MasterState
from mooncake_core.store.master_tasks import FAILED, PENDING, PROCESSING, SUCCESS
from mooncake_core.store.protocol import ReplicateConfigMsg

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _state(n: int = 3, size: int = MiB, **cfg: float) -> tuple[MasterState, Clock]:
    clock = Clock()
    st = MasterState(MasterConfig(default_kv_lease_ttl_ms=500, client_ttl_s=1000, **cfg), clock=clock)
    for i in range(n):
        st.mount_segment(f"c{i}", f"s{i}", (i + 1) << 32, size)
    return st, clock


def _put(st: MasterState, key: str, seg: str, size: int = 1000, writer: str = "c9", replicas: int = 1) -> None:
    segs = [seg] if isinstance(seg, str) else seg
    st.put_start(writer, key, size, ReplicateConfigMsg(replica_num=replicas, preferred_segments=segs))
    st.put_end(writer, key)


def _where(st: MasterState, key: str) -> list[str]:
    return sorted(s.name for s, _ in st.objects[key].reps())


def test_copy_runs_on_the_source_owner_and_publishes_on_done() -> None:
    st, clock = _state()
    _put(st, "k", "s0")
    tid = st.tasks.create_copy("k", ["s1", "s2", "s0"])  # s0 holds it already: skipped
    assert st.tasks.query(tid).status == PENDING and st.tasks.query(tid).assigned_client == "c0"
    assert st.heartbeat("c1").replica_tasks == []  # not the holder
    [task] = st.heartbeat("c0").replica_tasks
    assert task.source.segment_name == "s0" and sorted(t.segment_name for t in task.targets) == ["s1", "s2"]
    assert st.tasks.query(tid).status == PROCESSING
    assert _where(st, "k") == ["s0"]  # invisible until written
    st.tasks.done("c0", tid, True, "")
    assert st.tasks.query(tid).status == SUCCESS and _where(st, "k") == ["s0", "s1", "s2"]
    clock.t += 1
    st.remove("k")  # the copy's lease ended with the task (plus one lease TTL)


def test_bad_arguments_are_clear_errors() -> None:
    st, _ = _state()
    _put(st, "k", "s0")
    for call, code, text in [
        (lambda: st.tasks.create_copy("missing", ["s1"]), -704, "no such object"),
        (lambda: st.tasks.create_copy("k", ["nosuch"]), -600, "'nosuch' is not mounted"),
        (lambda: st.tasks.create_copy("k", []), -600, "non-empty"),
        (lambda: st.tasks.create_move("k", "s0", "s0"), -600, "same segment"),
        (lambda: st.tasks.create_move("k", "nosuch", "s1"), -600, "not mounted"),
        (lambda: st.tasks.create_move("k", "s1", "s2"), -704, "no replica on segment 's1'"),
        (lambda: st.tasks.query((1, 2)), -1400, "unknown task id"),
        (lambda: st.tasks.query("x"), -1400, "unknown task id"),
    ]:
        with pytest.raises(MooncakeError, match=text) as e:
            call()
        assert e.value.code == code


def test_concurrent_moves_of_one_key_run_one_at_a_time() -> None:
    st, clock = _state()
    _put(st, "k", "s0")
    a = st.tasks.create_move("k", "s0", "s1")
    b = st.tasks.create_move("k", "s0", "s2")
    [ta] = st.heartbeat("c0").replica_tasks  # b waits: the key is busy
    assert st.tasks.query(b).status == PENDING
    st.tasks.done("c0", a, True, "")
    assert _where(st, "k") == ["s1"]
    reply = st.heartbeat("c0")
    assert reply.replica_tasks == []  # b finds no replica on s0 any more
    # the source owner is told not to re-report the key after a master change
    assert [k for k, _ in reply.removed] == ["k"]
    info = st.tasks.query(b)
    assert info.status == FAILED and "no replica on 's0'" in info.message
    assert st.objects["k"].n_reps == 1
    # the moved-from range is reused only once the leases that may point at it ended
    used = st.segments["s0"].alloc.used
    clock.t += 1
    st.tick()
    assert st.segments["s0"].alloc.used < used


def test_removed_during_copy_fails_and_frees_targets() -> None:
    st, clock = _state()
    _put(st, "k", "s0")
    tid = st.tasks.create_copy("k", ["s1"])
    st.heartbeat("c0")
    with pytest.raises(MooncakeError) as e:
        st.remove("k")  # the task's lease protects it from a plain remove
    assert e.value.code == -706
    st.remove("k", force=True)
    st.tasks.done("c0", tid, True, "")
    info = st.tasks.query(tid)
    assert info.status == FAILED and "removed or replaced" in info.message
    for _ in range(3):  # the target range is quarantined for the owner's two heartbeats
        st.heartbeat("c1")
    assert st.segments["s1"].alloc.used == 0


def test_unanswered_and_failed_tasks() -> None:
    st, clock = _state()
    _put(st, "k", "s0")
    tid = st.tasks.create_copy("k", ["s1"])
    st.heartbeat("c0")
    clock.t += st.cfg.processing_task_timeout_s + 1
    st.tick()
    info = st.tasks.query(tid)
    assert info.status == FAILED and "did not answer within --processing_task_timeout_sec=300" in info.message
    t2 = st.tasks.create_copy("k", ["s2"])
    st.heartbeat("c0")
    st.tasks.done("c0", t2, False, "write failed: peer down")
    assert st.tasks.query(t2).message == "write failed: peer down" and _where(st, "k") == ["s0"]


def test_target_without_room_fails_with_no_space() -> None:
    st, _ = _state(size=4096)
    _put(st, "big", "s0", size=3000)
    _put(st, "fill", "s1", size=3000)
    tid = st.tasks.create_copy("big", ["s1"])
    assert st.heartbeat("c0").replica_tasks == []
    info = st.tasks.query(tid)
    assert info.status == FAILED and "no free range of 3000 bytes" in info.message


def test_drain_moves_or_drops_and_closes_the_segment() -> None:
    st, clock = _state()
    _put(st, "only", "s0")
    _put(st, "both", ["s0", "s2"], replicas=2)
    job = st.tasks.create_drain(["s0"], ["s1"], 1)
    assert st.tasks.segment_status("s0") == 2  # DRAINING
    # no new allocation on a draining segment, even when preferred
    _put(st, "new", "s0")
    assert "s0" not in _where(st, "new")
    st.tick()
    [move] = st.heartbeat("c0").replica_tasks
    assert move.key == "only" and move.targets[0].segment_name == "s1"
    st.tasks.done("c0", move.task_id, True, "")
    st.tick()
    d = job.describe()
    assert d["status_name"] == "SUCCEEDED" and d["succeeded_units"] == 2 and d["active_units"] == 0
    assert d["migrated_bytes"] == 1000
    assert st.tasks.segment_status("s0") == 3  # DRAINED
    assert _where(st, "only") == ["s1"] and _where(st, "both") == ["s2"]
    with pytest.raises(MooncakeError, match="not mounted"):
        st.tasks.create_drain(["nosuch"], [], 0)


def test_drain_waits_for_a_put_in_flight_and_counts_what_cannot_move() -> None:
    st, clock = _state(n=2, size=4096)
    st.put_start("c9", "late", 1000, ReplicateConfigMsg(preferred_segments=["s0"]))
    _put(st, "big", "s0", size=2000)
    _put(st, "fill", "s1", size=3000)
    job = st.tasks.create_drain(["s0"], [], 0)
    st.tick()
    assert job.describe()["status_name"] == "RUNNING"  # "late" is still being written into s0
    st.put_end("c9", "late")
    st.tick()
    [t] = st.heartbeat("c0").replica_tasks  # "late" fits on s1, "big" does not
    st.tasks.done("c0", t.task_id, True, "")
    st.tick()
    d = job.describe()
    assert d["status_name"] == "FAILED" and d["failed_units"] == 1 and "2000 bytes" in d["message"]
    assert st.tasks.segment_status("s0") == 1  # back in use: it still holds "big"


def test_batch_replica_clear_of_one_segment() -> None:
    st, clock = _state()
    _put(st, "two", ["s0", "s1"], replicas=2)
    _put(st, "one", "s0")
    st.get_replica_list("one")  # leased
    assert st.batch_replica_clear(["two", "one", "missing"], "s0") == ["two"]
    assert _where(st, "two") == ["s1"]
    clock.t += 1
    assert st.batch_replica_clear(["one"], "s2") == []  # nothing there
    assert st.batch_replica_clear(["one"], "s0") == ["one"] and "one" not in st.objects
    assert st.batch_replica_clear(["two"]) == ["two"] and not st.objects


def test_extra_segments_and_graceful_unmount() -> None:
    st, clock = _state(n=2)
    st.mount_segment("c0", "s0", 9 << 32, MiB, segment_id="x1")  # more memory of client c0
    assert sorted(st.segments) == ["s0", "s0#x1", "s1"]
    with pytest.raises(MooncakeError, match="without '#'"):
        st.mount_segment("c0", "s0", 10 << 32, MiB, segment_id="a#b")
    reps = st.put_start("c9", "k", 1000, ReplicateConfigMsg(preferred_segments=["s1"], replica_num=3))
    st.put_end("c9", "k")
    assert sorted(r.segment_name for r in reps) == ["s0", "s0", "s1"]  # replicas name the client's endpoint
    _put(st, "only", "s1")
    st.tasks.create_move("only", "s1", "s0#x1")
    [t] = st.heartbeat("c1").replica_tasks
    st.tasks.done("c1", t.task_id, True, "")
    assert [s.key for s, _ in st.objects["only"].reps()] == ["s0#x1"]
    st.get_replica_list("only")  # a reader holds a lease on it
    st.unmount_segment("c0", "s0#x1", grace_period_ms=5000)
    assert st.segment_status("c0", "s0#x1") == (4, 0)  # GRACEFULLY_UNMOUNTING: no new allocation
    st.tick()
    [t] = st.heartbeat("c0").replica_tasks
    assert t.key == "only" and t.source.segment_name == "s0"
    st.tasks.done("c0", t.task_id, True, "")
    st.tick()
    status, wait_ms = st.segment_status("c0", "s0#x1")
    assert status == 0 and 0 < wait_ms <= 500 and "s0#x1" not in st.segments  # gone; leases end in wait_ms
    assert "s0#x1" not in {s.key for s, _ in st.objects["k"].reps()} and st.objects["k"].n_reps == 2
    assert [s.key for s, _ in st.objects["only"].reps()] != ["s0#x1"]


def test_graceful_unmount_ends_with_the_grace_period() -> None:
    st, clock = _state(n=2, size=4096)
    _put(st, "big", "s0", size=3000)
    _put(st, "fill", "s1", size=3000)
    st.unmount_segment("c0", "s0", grace_period_ms=2000)
    st.tick()
    assert "s0" in st.segments  # nothing can move ("big" fits nowhere): waits for the grace period
    clock.t += 2.5
    st.tick()
    assert "s0" not in st.segments and "big" not in st.objects
    with pytest.raises(MooncakeError, match="not mounted"):
        st.unmount_segment("c0", "s0")


def test_task_queue_limits_follow_the_flags() -> None:
    st, clock = _state(max_total_pending_tasks=2, max_total_processing_tasks=1, max_total_finished_tasks=2,
                       pending_task_timeout_s=5.0, processing_task_timeout_s=3.0)
    for k in ("a", "b", "c"):
        _put(st, k, "s0")
    ta, tb = st.tasks.create_copy("a", ["s1"]), st.tasks.create_copy("b", ["s1"])
    with pytest.raises(MooncakeError, match="--max_total_pending_tasks=2") as e:
        st.tasks.create_copy("c", ["s1"])
    assert e.value.code == -1401
    assert [t.key for t in st.heartbeat("c0").replica_tasks] == ["a"]  # one may run at a time
    tc = st.tasks.create_copy("c", ["s1"])  # room again: "a" left the queue
    assert st.heartbeat("c0").replica_tasks == []
    clock.t += 3.5  # "a" ran out of --processing_task_timeout_sec; "b" and "c" still wait
    st.tick()
    assert st.tasks.query(ta).status == FAILED
    assert [t.key for t in st.heartbeat("c0").replica_tasks] == ["b"]
    clock.t += 2.0  # "c" waited past --pending_task_timeout_sec
    st.tick()
    info = st.tasks.query(tc)
    assert info.status == FAILED and "--pending_task_timeout_sec=5" in info.message
    st.tasks.done("c0", tb, True, "")
    with pytest.raises(MooncakeError) as e:  # the oldest finished one is forgotten past the bound
        st.tasks.query(ta)
    assert e.value.code == -1400 and st.tasks.query(tb).status == SUCCESS
