"""The connectors' stats dict (pure: mooncake_connectors/vllm/stats.py): recording, merging across workers and
scheduler, the wire check, and the summary vLLM logs. No vLLM, no sockets."""

from __future__ import annotations

import json

import pytest

from mooncake_connectors.vllm import stats as S


def recorded(pulls: list[tuple[int, int, float]], failures: tuple[str, ...] = ()) -> dict:
    rec = S.StatsRecorder()
    for nbytes, nblocks, secs in pulls:
        rec.add(S.PULLED_BYTES, nbytes)
        rec.add(S.PULLED_BLOCKS, nblocks)
        rec.observe(S.PULL_SECONDS, secs)
    for r in failures:
        rec.add(S.failure(r))
    out = rec.take()
    assert out is not None
    return out


def test_take_returns_the_interval_then_none():
    rec = S.StatsRecorder()
    assert rec.take() is None
    rec.add(S.LOOKUP_MISS_BLOCKS, 0)  # a zero is no news
    assert rec.take() is None
    rec.add(S.LOOKUP_HIT_BLOCKS, 3)
    rec.observe(S.LOAD_SECONDS, -1e-9)  # a clock step backwards never makes a negative latency
    assert rec.take() == {"counts": {S.LOOKUP_HIT_BLOCKS: 3}, "times": {S.LOAD_SECONDS: [0.0]}}
    assert rec.take() is None


def test_merge_adds_counts_and_keeps_every_observation():
    a = recorded([(1000, 2, 0.001)], ("read",))
    b = recorded([(500, 1, 0.003), (250, 1, 0.002)], ("read", "start"))
    merged = S.merge(a, json.loads(json.dumps(b)))  # as it arrives from another process
    assert merged["counts"] == {S.PULLED_BYTES: 1750, S.PULLED_BLOCKS: 4, S.failure("read"): 2,
                                S.failure("start"): 1}
    assert sorted(merged["times"][S.PULL_SECONDS]) == [0.001, 0.002, 0.003]
    assert S.merge(S.empty(), merged) == merged and not S.is_empty(merged)
    assert S.is_empty(S.empty()) and S.is_empty({"counts": {"x": 0}, "times": {"y": []}})


def test_summary_has_counts_and_latency_in_ms():
    d = recorded([(100, 1, x / 1000) for x in range(1, 11)], ("lease",))
    out = S.summarize(d)
    assert out[S.PULLED_BYTES] == 1000 and out[S.PULLED_BLOCKS] == 10 and out["failed_lease"] == 1
    assert out["pull_n"] == 10 and out["pull_avg_ms"] == 5.5 and out["pull_p90_ms"] == 10.0
    assert S.summarize(S.empty()) == {}


@pytest.mark.parametrize("bad,needle", [
    ([1], "expected a dict"),
    ({"counts": {}, "extra": 1}, "expected a dict"),
    ({"counts": {"pulled_bytes": -1}}, "pulled_bytes"),
    ({"counts": {"pulled_bytes": 1.5}}, "pulled_bytes"),
    ({"counts": {"pulled_bytes": True}}, "pulled_bytes"),
    ({"times": {"pull_seconds": 0.1}}, "pull_seconds"),
    ({"times": {"pull_seconds": ["x"]}}, "pull_seconds"),
])
def test_check_names_what_is_wrong(bad, needle):
    with pytest.raises(ValueError, match=needle):
        S.check(bad)


def test_check_accepts_and_completes_a_partial_dict():
    assert S.check({"counts": {"a": 1}}) == {"counts": {"a": 1}, "times": {}}
    assert S.check({}) == S.empty()


def test_failure_names_are_distinct_per_connector():
    names = [S.failure(r) for r in S.P2P_FAILURES] + [S.failure(r) for r in S.STORE_FAILURES]
    assert len(set(names)) == len(names) and all(n.startswith(S.FAILED) for n in names)
