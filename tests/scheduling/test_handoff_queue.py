"""The hand-off stage as a FIFO queue (scheduling/handoff_queue.py): pure, handmade clocks."""

from __future__ import annotations

import pytest

from mooncake_proxy.scheduling import HandoffQueue


def test_service_time_subtracts_the_queueing_ahead() -> None:
    q = HandoffQueue()
    for i in range(3):  # three handed off at once, first tokens 0.5 s apart: service 0.5 s, not 0.5/1.0/1.5
        q.handed_off(f"r{i}", 0.0)
    assert q.pending == 3
    assert [q.first_token(f"r{i}", 0.5 * (i + 1)) for i in range(3)] == pytest.approx([0.5, 0.5, 0.5])
    assert q.service_s(1.5) == pytest.approx(0.5) and q.pending == 0
    # an idle stage: a request handed off later is timed from its own hand-off
    q.handed_off("r3", 10.0)
    assert q.first_token("r3", 10.2) == pytest.approx(0.2)
    assert q.first_token("unknown", 11.0) is None


def test_first_token_estimate_counts_pending_and_ahead() -> None:
    q = HandoffQueue()
    q.handed_off("w", 0.0)
    q.first_token("w", 0.4)
    assert q.first_token_in(1.0, ready_in=0.1) == pytest.approx(0.5)  # idle: prefill, then one service
    q.handed_off("a", 1.0)
    q.handed_off("b", 1.0)
    # 2 pending + 1 still in prefill ahead: the stage is busy 1.2 s; a fast prefill waits for it
    assert q.first_token_in(1.0, ready_in=0.1, ahead=1) == pytest.approx(1.2 + 0.4)
    # a slow prefill finds the stage free
    assert q.first_token_in(1.0, ready_in=3.0, ahead=1) == pytest.approx(3.4)


def test_a_stalled_head_delays_everyone_behind_it() -> None:
    q = HandoffQueue()
    q.handed_off("w", 0.0)
    q.first_token("w", 0.2)
    q.handed_off("stuck", 1.0)
    assert q.lateness_s(1.1) == 0.0
    assert q.lateness_s(6.2) == pytest.approx(5.0)  # 5.2 s waiting, 0.2 s expected
    assert q.first_token_in(6.2, ready_in=0.1) == pytest.approx(5.0 + 0.2 + 0.2)
    # the stall ends: its 5.2 s sample is part of the stage's throughput until the window moves on
    q.first_token("stuck", 6.2)
    for i in range(3):
        q.handed_off(f"n{i}", 7.0 + i)
        q.first_token(f"n{i}", 7.2 + i)
    assert q.service_s(10.0) == pytest.approx((0.2 * 4 + 5.2) / 5)


def test_a_clump_of_first_tokens_averages_to_the_throughput() -> None:
    q = HandoffQueue()
    for i in range(4):  # four pulls finish in one decode step 2 s later: 0.5 s per request
        q.handed_off(f"r{i}", 0.0)
    for i in range(4):
        q.first_token(f"r{i}", 2.0)
    assert q.service_s(2.0) == pytest.approx(0.5)
    q.handed_off("gone", 10.0)
    q.dropped("gone")
    assert q.pending == 0 and q.lateness_s(30.0) == 0.0


def test_without_samples_only_the_oldest_wait_counts() -> None:
    q = HandoffQueue()
    assert q.first_token_in(0.0, ready_in=0.3, ahead=5) == pytest.approx(0.3)
    q.handed_off("a", 0.0)
    assert q.first_token_in(2.0, ready_in=0.3) == pytest.approx(2.0)


def test_an_idle_stage_forgets_a_slow_burst() -> None:
    # a service time learned in a burst would reject every later request (no new sample comes)
    q = HandoffQueue(stale_s=10.0, half_life_s=5.0)
    q.handed_off("a", 0.0)
    q.first_token("a", 4.0)
    assert q.service_s(10.0) == pytest.approx(4.0)
    assert q.service_s(19.0) == pytest.approx(2.0)
    q.handed_off("b", 19.0)  # something pending: no fading while it is in service
    assert q.service_s(30.0) == pytest.approx(4.0)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        HandoffQueue(window=0)
    with pytest.raises(ValueError, match="half_life_s"):
        HandoffQueue(half_life_s=0)


def test_each_source_gets_its_own_service_time() -> None:
    # The decode shares a core with p1 (whose engine spins after answering): hand-offs from p1 take
    # 1 s, from p0 0.05 s. A request from p0 is not predicted slow because of p1's samples.
    q = HandoffQueue(stale_s=10.0, half_life_s=10.0)
    t = 0.0
    for i in range(3):
        q.handed_off(f"a{i}", t, "p0")
        q.first_token(f"a{i}", t + 0.05)
        q.handed_off(f"b{i}", t + 1.0, "p1")
        q.first_token(f"b{i}", t + 2.0)
        t += 3.0
    assert q.service_s(t) == pytest.approx((0.05 + 1.0) / 2)
    assert q.service_s(t, "p0") == pytest.approx(0.05) and q.service_s(t, "p1") == pytest.approx(1.0)
    assert q.first_token_in(t, ready_in=0.1, source="p0") == pytest.approx(0.15)
    assert q.first_token_in(t, ready_in=0.1, source="p1") == pytest.approx(1.1)
    assert q.first_token_in(t, ready_in=0.1, source="p9") == pytest.approx(0.1 + 0.525)  # unknown: the stage's
    # p1 sends nothing more (its requests go elsewhere): its samples fade on their own
    assert q.service_s(t + 20.0, "p1") < 0.5
    q.forget("p1")
    assert q.service_s(t, "p1") == pytest.approx(0.525)
