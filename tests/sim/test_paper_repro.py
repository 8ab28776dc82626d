"""The paper's numbers, on the full shipped traces (slow-marked, still run in CI; ~15 s)."""

from __future__ import annotations

import pytest

from mooncake_proxy.sim import SimConfig, load_trace, prefix_hit_ratio, simulate, summarize

pytestmark = pytest.mark.slow

# The paper (docs/scheduler-and-simulator.md): token-weighted leading-block hit ratio of one global LRU.
EXPECTED = {
    "conversation": {10_000: 0.21, 50_000: 0.36, 0: 0.37},
    "synthetic": {10_000: 0.43, 50_000: 0.65, 0: 0.65},
}


@pytest.mark.parametrize("which", ["conversation", "synthetic"])
def test_hit_ratio_matches_published_numbers(which, conversation_trace, synthetic_trace) -> None:
    recs = load_trace(conversation_trace if which == "conversation" else synthetic_trace)
    for cap, want in EXPECTED[which].items():
        got = prefix_hit_ratio(recs, cap).hit_ratio
        assert abs(got - want) <= 0.01, f"{which} capacity {cap or 'unlimited'}: {got:.4f} vs {want}"


def test_ttft_ordering_on_conversation_trace(conversation_trace) -> None:
    """conductor < cache_aware < load_balance < random (paper: 3.07 < 3.58 < 5.27 < 19.65 s).

    Whole trace, 8 prefill + 8 decode instances, 10k blocks of cache each, real-time arrivals
    (see docs/scheduler-and-simulator.md for the choice). The margins are wide: measured
    ratios are about 1.2x, 1.7x and 5x between neighbours; the test asks for 5%, 20%, 2x.
    """
    recs = load_trace(conversation_trace)
    ttft = {}
    for p in ("conductor", "cache_aware", "load_balance", "random"):
        s = summarize(simulate(recs, SimConfig(policy=p, prefill=8, decode=8, cache_blocks=10_000)))
        assert s["completed"] == len(recs)
        ttft[p] = s["ttft_mean"]
        if p == "conductor":
            # Whole conversation trace well under the 60 s budget (~1 s on a quiet core).
            assert s["wall_time_s"] < 60
    assert ttft["conductor"] * 1.05 < ttft["cache_aware"], ttft
    assert ttft["cache_aware"] * 1.2 < ttft["load_balance"], ttft
    assert ttft["load_balance"] * 2 < ttft["random"], ttft
