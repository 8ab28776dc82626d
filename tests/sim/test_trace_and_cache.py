"""Trace loading and the global-LRU prefix hit ratio (fast subsets)."""

from __future__ import annotations

import json
import random

import pytest

from mooncake_proxy.sim import TraceRecord, hit_ratio_curve, load_trace, prefix_hit_ratio


def test_load_trace_fields_and_limit(conversation_trace) -> None:
    recs = load_trace(conversation_trace, limit=500)
    assert len(recs) == 500
    first = json.loads(conversation_trace.read_text().splitlines()[0])
    assert recs[0].timestamp == first["timestamp"] and recs[0].hash_ids == first["hash_ids"]
    for r in recs:
        assert len(r.hash_ids) == -(-r.input_length // 512)  # one id per (partial) 512-token block
    assert load_trace(conversation_trace, limit=0) == []


def test_load_trace_errors_name_line(tmp_path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
                 '{"timestamp": 5, "input_length": "x", "output_length": 2, "hash_ids": [1]}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:2: bad trace record.*input_length"):
        load_trace(p)
    p.write_text('{"timestamp": 9, "input_length": 10, "output_length": 2}\n'
                 '{"timestamp": 5, "input_length": 10, "output_length": 2}\n')
    with pytest.raises(ValueError, match=r":2: timestamps must be non-decreasing"):
        load_trace(p)
    p.write_text('{"timestamp": 1, "input_length": 10\n')
    with pytest.raises(ValueError, match=r":1: not valid JSON"):
        load_trace(p)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_trace(tmp_path / "nope.jsonl")


def _reference_hit_ratio(recs, cap: int) -> float:
    """Independent, deliberately naive implementation: a list ordered by recency."""
    order: list[int] = []
    hit = total = 0
    for r in recs:
        n = 0
        for h in r.hash_ids:
            if h in order:
                n += 1
            else:
                break
        hit += min(r.input_length, 512 * n)
        total += r.input_length
        for h in r.hash_ids:
            if h in order:
                order.remove(h)
            order.append(h)
        while cap and len(order) > cap:
            order.pop(0)
    return hit / total


@pytest.mark.parametrize("cap", [0, 50, 400])
def test_hit_ratio_matches_naive_reference(conversation_trace, cap) -> None:
    recs = load_trace(conversation_trace, limit=400)
    st = prefix_hit_ratio(recs, cap)
    assert st.requests == 400 and st.total_tokens == sum(r.input_length for r in recs)
    assert st.hit_ratio == pytest.approx(_reference_hit_ratio(recs, cap), abs=1e-12)


def test_hit_ratio_on_random_handmade_trace() -> None:
    rng = random.Random(11)
    prefixes = [[rng.randrange(10**9) for _ in range(rng.randint(1, 6))] for _ in range(20)]
    recs = []
    for i in range(300):
        base = rng.choice(prefixes)
        ids = base + [10**10 + i * 10 + k for k in range(rng.randint(0, 3))]
        n_tok = 512 * (len(ids) - 1) + rng.randint(1, 512)
        recs.append(TraceRecord(float(i), n_tok, 5, ids))
    for cap in (0, 10, 60):
        assert prefix_hit_ratio(recs, cap).hit_ratio == pytest.approx(_reference_hit_ratio(recs, cap), abs=1e-12)
    curve = hit_ratio_curve(recs, [5, 20, 80, 0])
    ratios = [s.hit_ratio for s in curve]
    assert ratios == sorted(ratios)  # more capacity never hurts LRU on this trace
    assert ratios[-1] > 0.3


def test_hit_ratio_counts_only_leading_blocks() -> None:
    recs = [TraceRecord(0, 1536, 1, [1, 2, 3]), TraceRecord(1, 1536, 1, [9, 2, 3]),
            TraceRecord(2, 1000, 1, [1, 2])]
    st = prefix_hit_ratio(recs, 0)
    # r2 shares blocks 2,3 but not the first: 0 hits. r3 hits [1,2] = 1024 tokens capped at 1000.
    assert st.hit_tokens == 1000 and st.total_tokens == 1536 * 2 + 1000
