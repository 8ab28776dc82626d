"""Engines that batch their prefill queue: when each queued request is answered, and the TTFT check
that keeps the requests already queued within the SLO (pure, no sockets)."""

from __future__ import annotations

import pytest

from mooncake_proxy.scheduling import SchedulerSettings
from mooncake_proxy.scheduling import (ClusterState, CostModel, Decision, InstanceInfo, Rejection, RequestInfo,
                                       SloConfig, make_scheduler)
from mooncake_proxy.scheduling.batched_queue import delays_by, finish_offsets

# 1 ms per token, nothing else: a request of n new tokens takes n ms alone
COST = CostModel(c0=0.0, c1=0.001, c2=0.0, d0=0.02, d1=0.0, d2=0.0, transfer_latency_s=0.0, block_size=4,
                 name="ms-per-token")


def test_one_request_per_step_is_the_fifo_sum() -> None:
    assert finish_offsets([100, 200, 300], [0.1, 0.2, 0.3], 0) == pytest.approx([0.1, 0.3, 0.6])


def test_requests_whose_last_tokens_share_a_step_are_answered_together() -> None:
    # 3 x 500 tokens fit in one 2048-token step: all answered when the step (1.5 s) ends
    assert finish_offsets([500, 500, 500], [0.5, 0.5, 0.5], 2048) == pytest.approx([1.5, 1.5, 1.5])
    # a request ending exactly on a step's end is answered then; the next one starts a new step
    assert finish_offsets([2048, 100], [2.048, 0.1], 2048) == pytest.approx([2.048, 2.148])


def test_a_chunked_request_waits_for_the_step_it_ends_in_to_fill() -> None:
    # 1500 tokens, then 1000: the first step holds 1500 + 548 of the second, the second ends the queue
    assert finish_offsets([1500, 1000], [1.5, 1.0], 2048) == pytest.approx([1.5 + 0.548, 2.5])
    # the time of a partial request is spread evenly over its tokens (it may be slower than 1 ms/token)
    assert finish_offsets([1500, 1000], [1.5, 2.0], 2048) == pytest.approx([1.5 + 2.0 * 0.548, 3.5])


def test_a_new_request_delays_only_those_whose_last_step_it_joins() -> None:
    # 2048 + 1000: the first request's step is full, the second's has 1048 tokens of room
    d = delays_by([2048, 1000], [2.048, 1.0], 2048, 1500, 1.5)
    assert d == pytest.approx([0.0, 1.048])
    assert delays_by([2048, 1000], [2.048, 1.0], 0, 1500, 1.5) == [0.0, 0.0]  # one at a time: no one


def test_bad_arguments_name_what_was_expected() -> None:
    with pytest.raises(ValueError, match="2 token counts but 1 times"):
        finish_offsets([1, 2], [0.1], 16)
    with pytest.raises(ValueError, match="budget must be >= 0"):
        finish_offsets([1], [0.1], -1)


def _cluster() -> ClusterState:
    cl = ClusterState(block_size=4)
    for i in ("p0", "p1"):
        cl.add_instance(InstanceInfo(i, "prefill"))
    cl.add_instance(InstanceInfo("d0", "decode"))
    return cl


def _queue_one(cl: ClusterState, instance: str, *, tokens: int, waited: float) -> RequestInfo:
    """A request of ``tokens`` new tokens that arrived ``waited`` s before t = 0 and starts on
    ``instance`` at t = 0 (what was before it just finished)."""
    r = RequestInfo(f"old-{instance}", prompt_tokens=tokens, arrival=-waited)
    cl.on_prefill_start(instance, r, -waited, cached_blocks=0, decode_id="d0")
    cl.prefill_load(instance).head_since = 0.0
    return r


@pytest.mark.parametrize("budget", [0, 2048])
def test_a_request_that_would_push_a_queued_one_past_the_slo_goes_elsewhere(budget: int) -> None:
    cl = _cluster()
    # p0 runs a 1000-token request (1.0 s) that waited 0.9 s: predicted TTFT 1.9 s of a 2.0 s SLO.
    # p1 is busier (1.2 s queued), so load_balance and the TTFT check alone prefer p0.
    _queue_one(cl, "p0", tokens=1000, waited=0.9)
    cl.on_prefill_start("p1", RequestInfo("old-p1", 1200, arrival=0.0), 0.0, cached_blocks=0, decode_id="d0")
    s = make_scheduler("load_balance", cl, COST, SloConfig(ttft_s=2.0),
                       settings=SchedulerSettings(prefill_batch_tokens=budget))
    out = s.schedule(RequestInfo("new", prompt_tokens=500), 0.0)
    assert isinstance(out, Decision)
    # batched: on p0 it would join the running request's last step (1000 + 500 <= 2048) and delay
    # its answer to 1.5 s, TTFT 2.4 s; on p1 (1200 + 500 tokens, one step) it delays "old-p1" too,
    # but that one has waited nothing: 1.7 s. One at a time, p0 wins (1.0 + 0.5 s < 1.2 + 0.5 s).
    assert out.prefill_id == ("p1" if budget else "p0")


def test_when_every_instance_would_push_a_queued_request_past_the_slo_the_429_says_which() -> None:
    cl = _cluster()
    _queue_one(cl, "p0", tokens=1000, waited=0.9)
    _queue_one(cl, "p1", tokens=1000, waited=0.9)
    s = make_scheduler("conductor", cl, COST, SloConfig(ttft_s=2.0), settings=SchedulerSettings(prefill_batch_tokens=2048))
    out = s.schedule(RequestInfo("new", prompt_tokens=500), 0.0)
    assert isinstance(out, Rejection)
    assert "would share the last forward step of request 'old-p" in out.reason
    assert "2.400s > 2.000s" in out.reason and "steps of 2048 tokens" in out.reason
    # the new request alone would make it (1.5 s): without the budget it is admitted
    s = make_scheduler("conductor", cl, COST, SloConfig(ttft_s=2.0))
    assert isinstance(s.schedule(RequestInfo("new", prompt_tokens=500), 0.0), Decision)


def test_a_queued_request_already_past_the_slo_does_not_block_later_ones() -> None:
    cl = _cluster()
    _queue_one(cl, "p0", tokens=1000, waited=1.5)  # TTFT 2.5 s whatever happens next
    _queue_one(cl, "p1", tokens=1000, waited=1.5)
    s = make_scheduler("load_balance", cl, COST, SloConfig(ttft_s=2.0), settings=SchedulerSettings(prefill_batch_tokens=2048))
    assert isinstance(s.schedule(RequestInfo("new", prompt_tokens=500), 0.0), Decision)


def test_a_request_that_does_not_reach_a_queued_ones_last_step_is_no_harm() -> None:
    cl = _cluster()
    # a 2048-token request (2.048 s) on each: its only step is full, so a 10-token request starts
    # the next step and delays no one; its own TTFT is 2.058 s of a 2.06 s SLO
    for p in ("p0", "p1"):
        cl.on_prefill_start(p, RequestInfo(f"full-{p}", 2048), 0.0, cached_blocks=0, decode_id="d0")
    s = make_scheduler("load_balance", cl, COST, SloConfig(ttft_s=2.06), settings=SchedulerSettings(prefill_batch_tokens=2048))
    assert isinstance(s.schedule(RequestInfo("new", prompt_tokens=10), 0.0), Decision)
    # 2040 tokens that waited 15 ms (TTFT 2.055 s): the new one's first 8 tokens join its step (+8 ms)
    cl2 = _cluster()
    for p in ("p0", "p1"):
        _queue_one(cl2, p, tokens=2040, waited=0.015)
    s2 = make_scheduler("load_balance", cl2, COST, SloConfig(ttft_s=2.06),
                        settings=SchedulerSettings(prefill_batch_tokens=2048))
    out = s2.schedule(RequestInfo("new", prompt_tokens=10), 0.0)
    assert isinstance(out, Rejection) and "2.063s > 2.060s" in out.reason
