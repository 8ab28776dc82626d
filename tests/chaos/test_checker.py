"""Unit tests of the chaos harness's pure parts: self-describing values, the read
classifier, hang and recovery accounting, the fault deck (no processes, no sockets)."""

from __future__ import annotations

import random

import pytest

from mooncake_lab.chaos import checker, payload, stats
from mooncake_lab.chaos.checker import Config, Fault, Op, Timeline
from mooncake_lab.chaos.nemesis import Deck, enabled_kinds
from mooncake_lab.chaos.netlab import Capabilities
from mooncake_lab.chaos.report import render, series_summary

S = 1_000_000_000


# ---------------------------------------------------------------- payload
def test_payload_round_trip_and_every_kind_of_foreign() -> None:
    wid = payload.WriteId(3, 1, 0, 42)
    v = payload.encode("key-a", wid, 5000)
    assert len(v) == 5000
    assert payload.decode("key-a", v) == payload.Decoded("ok", wid)
    assert str(wid) == "3.1.0.42" and payload.WriteId.parse("3.1.0.42") == wid
    got = payload.decode("key-b", v)
    assert got.status == "wrong-key" and got.wid == wid
    flipped = bytearray(v)
    flipped[2500] ^= 1
    assert payload.decode("key-a", flipped).status == "bad-checksum"
    assert payload.decode("key-a", v[:-1]).status == "bad-length"
    assert payload.decode("key-a", b"\0" * 100).status == "bad-magic"
    assert payload.decode("key-a", b"xy").status == "short"
    # a value of another write of the same key is a different, valid value
    other = payload.encode("key-a", payload.WriteId(3, 1, 0, 43), 5000)
    assert other != v and payload.decode("key-a", other).wid.seq == 43
    # sizes below the header are rounded up, never truncated into nonsense
    tiny = payload.encode("k", wid, 1)
    assert len(tiny) == payload.min_size("k") and payload.decode("k", tiny).status == "ok"


# ---------------------------------------------------------------- helpers
def _op(op: str, key: str, ts: float, te: float | None, rc: int | None = 0, *, w: int = 0, t: int = 0,
        n: int = 0, wid: str | None = None, got: str | None = None, st: str | None = None, inc: int = 0) -> Op:
    return Op(op, key, w, inc, t, n, int(ts * S), None if te is None else int(te * S), rc, wid, got, st)


def _tl(**kw) -> Timeline:
    return Timeline(t_start=0, t_end=int(100 * S), **kw)


def _reads(ops: list[Op], tl: Timeline | None = None, **cfg) -> dict:
    return checker.check(ops, tl or _tl(), Config(**cfg))


# ---------------------------------------------------------------- read classes
def test_latest_in_flight_and_miss() -> None:
    ops = [
        _op("upsert", "k", 1, 2, wid="0.0.0.1", n=1),
        _op("get_into", "k", 3, 3.1, 100, w=1, n=1, got="0.0.0.1", st="ok"),  # after the ack
        _op("get_into", "k", 1.5, 1.6, 100, w=1, n=2, got="0.0.0.1", st="ok"),  # overlaps the write
        _op("get", "other", 3, 3.1, 0, w=1, n=3, st="miss"),
        _op("get_into", "k", 4, 4.1, -800, w=1, n=4, st="error"),
    ]
    r = _reads(ops)
    assert r["reads"] == {"latest": 1, "in_flight": 1, "stale": 0, "miss": 1, "error": 1, "foreign": 0}
    assert r["foreign_bytes"] == 0 and r["hangs"] == 0


@pytest.mark.parametrize("case", ["never-begun", "wrong-key", "future", "checksum"])
def test_foreign_reads(case: str) -> None:
    ops = [_op("upsert", "k", 1, 2, wid="0.0.0.1", n=1), _op("upsert", "j", 1, 2, t=1, wid="0.0.1.1", n=1)]
    if case == "never-begun":
        ops.append(_op("get_into", "k", 3, 3.1, 100, w=1, got="0.0.0.9", st="ok"))
    elif case == "wrong-key":  # the bytes say another key (the worker checked the header)
        ops.append(_op("get_into", "k", 3, 3.1, 100, w=1, got="0.0.1.1", st="wrong-key"))
    elif case == "future":  # a value whose write began after the read ended
        ops.append(_op("upsert", "k", 5, 6, t=2, wid="0.0.2.1", n=1))
        ops.append(_op("get_into", "k", 3, 3.1, 100, w=1, got="0.0.2.1", st="ok"))
    else:
        ops.append(_op("get_into", "k", 3, 3.1, 100, w=1, st="bad-checksum"))
    r = _reads(ops)
    assert r["foreign_bytes"] == 1 and r["reads"]["foreign"] == 1, r["foreign"]
    # a write id valid for another key is foreign too, even if the worker's header check passed
    ops2 = ops[:2] + [_op("get_into", "k", 3, 3.1, 100, w=1, got="0.0.1.1", st="ok")]
    assert _reads(ops2)["foreign_bytes"] == 1


def test_stale_after_overwrite_and_remove_and_their_explanation() -> None:
    base = [
        _op("upsert", "k", 1, 2, wid="0.0.0.1", n=1),
        _op("upsert", "k", 3, 4, w=2, wid="2.0.0.1", n=1),  # supersedes 0.0.0.1
        _op("get_into", "k", 5, 5.1, 100, w=1, n=1, got="0.0.0.1", st="ok"),
    ]
    r = _reads(base)
    assert r["stale_reads"] == 1 and r["stale_unexplained"] == 1
    # the master failed 0.5 s after the overwrite: the documented window
    r = _reads(base, _tl(master_failures=[int(4.5 * S)]))
    assert r["stale_explained"] == 1 and "before a master lost its state" in r["stale"][0]["why"]
    # an overwrite acknowledged just after the master died was processed just before it
    r = _reads(base, _tl(master_failures=[int(3.9 * S)]))
    assert r["stale_explained"] == 1 and "acknowledged" in r["stale"][0]["why"]
    # a failure long after the overwrite explains nothing ...
    r = _reads(base, _tl(master_failures=[int(4.9 * S)]), notice_window_ns=int(0.5 * S))
    assert r["stale_unexplained"] == 1
    # ... unless a client could not hear the master from the overwrite until then
    r = _reads(base, _tl(master_failures=[int(4.9 * S)], deaf=[(int(3.5 * S), int(5 * S))]),
               notice_window_ns=int(0.5 * S))
    assert r["stale_explained"] == 1 and "cut off" in r["stale"][0]["why"]
    # a leader last seen serving before the overwrite began and seen gone long after it: it
    # stopped somewhere in that span, which may be just after the overwrite
    span = _tl(master_failure_spans=[(int(2.5 * S), int(4.9 * S))])
    r = _reads(base, span, notice_window_ns=int(0.5 * S))
    assert r["stale_explained"] == 1 and "stopped serving" in r["stale"][0]["why"]
    assert _reads(base, _tl(master_failures=[int(2.5 * S), int(4.9 * S)]),
                  notice_window_ns=int(0.5 * S))["stale_unexplained"] == 1  # as points: neither fits
    # a span that ended before the overwrite began, or began long after it ended, explains nothing
    for lo, hi in ((1.0, 2.5), (4.6, 4.9)):
        r = _reads(base, _tl(master_failure_spans=[(int(lo * S), int(hi * S))]), notice_window_ns=int(0.5 * S))
        assert r["stale_unexplained"] == 1, (lo, hi)
    # a remove supersedes like an upsert
    rm = [base[0], _op("remove", "k", 3, 4, w=2, n=1), base[2]]
    assert _reads(rm)["stale_reads"] == 1


def test_what_does_not_supersede() -> None:
    ops = [
        _op("upsert", "k", 1, 2, wid="0.0.0.1", n=1),
        _op("put", "k", 3, 4, w=2, wid="2.0.0.1", n=1),  # put of an existing key keeps the old value
        _op("upsert", "k", 3, 4, w=3, rc=-800, wid="3.0.0.1", n=1),  # failed
        _op("remove", "k", 3, 4, w=3, rc=-706, n=2),  # refused: leased
        _op("upsert", "k", 1.5, 5, w=4, wid="4.0.0.1", n=1),  # overlaps the first write
        _op("get_into", "k", 6, 6.1, 100, w=1, n=1, got="0.0.0.1", st="ok"),
    ]
    assert _reads(ops)["reads"]["latest"] == 1


def test_a_killed_writer_is_in_flight_until_it_died_plus_a_margin() -> None:
    ops = [
        _op("upsert", "k", 1, None, None, wid="0.0.0.1", n=1),  # begun; the process was SIGKILLed at 2 s
        _op("upsert", "k", 2.5, 2.6, w=2, wid="2.0.0.1", n=1),  # within the margin: not a supersede
        _op("get_into", "k", 4, 4.1, 100, w=1, n=1, got="0.0.0.1", st="ok"),
    ]
    tl = _tl(deaths={(0, 0): 2 * S})
    r = _reads(ops, tl)
    assert r["reads"]["in_flight"] == 1
    ops.insert(2, _op("upsert", "k", 3.5, 3.6, w=3, wid="3.0.0.1", n=1))  # after death + 1 s margin
    assert _reads(ops, tl)["stale_reads"] == 1
    assert _reads(ops, tl)["ops"]["upsert"]["unfinished"] == 1


# ---------------------------------------------------------------- hangs
def test_hangs_exclude_own_pause_and_count_stuck_and_killed_ops() -> None:
    slow = _op("get_into", "k", 1, 26, 100, n=1, got=None, st="miss")
    assert _reads([slow])["hangs"] == 1
    assert _reads([slow], _tl(pauses={0: [(2 * S, 12 * S)]}))["hangs"] == 0
    # a machine that ran nobody for a while (the harness saw the stall) is no hang either
    assert _reads([slow], _tl(stalls=[(2 * S, 8 * S)], pauses={0: [(6 * S, 12 * S)]}))["hangs"] == 0
    assert _reads([slow], _tl(stalls=[(2 * S, 4 * S)]))["hangs"] == 1
    stuck = _op("upsert", "k", 1, None, None, n=2, wid="0.0.0.1")
    stuck.stuck_at = 30 * S
    r = _reads([stuck])
    assert r["hangs"] == 1 and r["hang_list"][0]["finished"] is False
    killed = _op("upsert", "k", 1, None, None, n=3, wid="0.0.0.2")
    assert _reads([killed], _tl(deaths={(0, 0): 5 * S}))["hangs"] == 0
    assert _reads([killed], _tl(deaths={(0, 0): 40 * S}))["hangs"] == 1
    r = _reads([slow], transfer_timeout_ns=10 * S)
    assert r["ops_over_transfer_timeout"] == 1 and r["slowest_op_s"] == 25.0


# ---------------------------------------------------------------- recovery
def test_recovery_needs_an_acked_write_and_an_answered_read_from_every_thread() -> None:
    ops = [
        _op("upsert", "k", 0.5, 0.6, 0, w=0, n=1, wid="0.0.0.1"),
        _op("get", "k", 0.7, 0.8, 0, w=0, n=2, st="miss"),
        _op("upsert", "k", 0.5, 0.6, 0, w=1, n=1, wid="1.0.0.1"),
        _op("get", "k", 0.7, 0.8, 0, w=1, n=2, st="miss"),
        # after the heal at 10 s
        _op("upsert", "k", 10.2, 11.0, -900, w=0, n=3, wid="0.0.0.2"),  # an error is no recovery
        _op("get_into", "k", 11.0, 11.1, -704, w=0, n=4, st="miss"),
        _op("upsert", "k", 11.1, 12.0, 0, w=0, n=5, wid="0.0.0.3"),
        _op("get_into", "k", 10.5, 10.7, 100, w=1, n=3, got="1.0.0.1", st="ok"),
        _op("put", "k", 10.7, 10.9, 0, w=1, n=4, wid="1.0.0.2"),
    ]
    tl = _tl(faults=[Fault("kill-master", "master0", int(9 * S), int(10 * S))])
    rec = checker.recovery(ops, tl)
    assert rec["by_kind"]["kill-master"] == {"n": 1, "recovered": 1, "p50_s": 2.0, "p99_s": 2.0}
    # answering reads only (every write failing) is not recovered
    only_reads = [o for o in ops if not (o.writer == 0 and o.n == 5)]
    assert checker.recovery(only_reads, tl)["by_kind"]["kill-master"]["recovered"] == 0
    # a thread that never succeeds again before the next fault: unrecovered
    tl.faults.append(Fault("pause-client", "client1", int(12.5 * S), int(13 * S)))
    rec = checker.recovery(ops, tl)
    assert rec["by_kind"]["kill-master"]["recovered"] == 1
    assert rec["by_kind"]["pause-client"]["recovered"] == 0 and rec["all"]["n"] == 2


# ---------------------------------------------------------------- nemesis and stats
def test_deck_deals_every_kind_each_round() -> None:
    d = Deck(["a", "b", "c"], random.Random(3))
    for _ in range(4):
        assert sorted(d.draw() for _ in range(3)) == ["a", "b", "c"]


def test_enabled_kinds_say_why_a_kind_is_off() -> None:
    caps = Capabilities(netns=True, allowed=["partition", "isolate"], reasons={"delay": "no sch_netem"})
    on, off = enabled_kinds(["kill-client", "pause-etcd-leader", "partition", "delay"], False, caps)
    assert on == ["kill-client", "partition"]
    assert "needs --ha" in off["pause-etcd-leader"] and off["delay"] == "no sch_netem"
    on, off = enabled_kinds(["isolate"], True, None)
    assert on == [] and "not in use" in off["isolate"]
    with pytest.raises(ValueError, match="unknown fault kind"):
        enabled_kinds(["reboot"], True, caps)
    on, off = enabled_kinds(["kill-master", "pause-etcd-leader"], True, None, ha_backend="redis")
    assert on == ["kill-master"] and "no etcd with --ha-backend redis" in off["pause-etcd-leader"]


def test_stats() -> None:
    assert stats.percentile([], 50) is None
    assert stats.percentile([3, 1, 2], 50) == 2 and stats.percentile([1, 2, 3], 99) == 3
    assert stats.slope([(0, 1), (1, 3), (2, 5)]) == pytest.approx(2.0)
    assert stats.slope([(1, 1)]) is None
    assert stats.overlap(0, 10, [(2, 4), (8, 20)]) == 4
    assert stats.merge_spans([(5, 9), (1, 3), (2, 6), (10, 11)]) == [(1, 9), (10, 11)]


def test_series_summary_and_table_render() -> None:
    samples = [(i * 60 * S, "client0", 7, 1024 * (100 + i), 20 + (i % 2)) for i in range(11)]
    samples += [(0, "master0", 5, 2048, 9), (600 * S, "master0", 6, 4096, 9)]  # restarted: last pid only
    s = series_summary(samples)
    assert s["client0"]["rss_mb_per_min"] == pytest.approx(1.0, abs=1e-3)
    assert s["client0"]["rss_mb_start"] == 100.0 and s["client0"]["rss_mb_end"] == 110.0
    assert s["master0"]["pid"] == 6 and s["master0"]["samples"] == 1
    run = {"impl": "ours", "run": {"load_s": 10.0}, "faults": {"kill-client": 1},
           "check": _reads([_op("get", "k", 1, 2, 0, st="miss")]), "procs": {}}
    text = render([run, dict(run, impl="ref")])
    assert "FOREIGN BYTES" in text and "original 0.3.13" in text and "HANGS" in text
