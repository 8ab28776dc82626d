"""Declared hardware groups (``--hardware-group``): processor sharing between the instances of a
group, in the calibrator (what a sample ran under is divided out) and in the scheduler's TTFT check
and ``pair_harm`` (pure)."""

from __future__ import annotations

import pytest

from mooncake_proxy.scheduling import (ClusterState, CostModel, Decision, HardwareGroups, InstanceInfo,
                                       LatencyCalibrator, Rejection, RequestInfo, SloConfig, make_scheduler)

BASE = CostModel(c0=0.01, c1=0.001, c2=0.0, d0=0.02, d1=0.0, d2=0.0, transfer_latency_s=0.003,
                 block_size=4, name="base")


def _cluster(n: int) -> ClusterState:
    cl = ClusterState(block_size=4)
    for i in range(n):
        cl.add_instance(InstanceInfo(f"p{i}", "prefill", cache_capacity_blocks=100))
    cl.add_instance(InstanceInfo("d0", "decode", cache_capacity_blocks=10_000))
    return cl


def _req(i: int, tokens: int = 190) -> RequestInfo:  # 0.2 s alone under BASE
    return RequestInfo(f"r{i}", prompt_tokens=tokens, block_hashes=[1000 * i + k for k in range(tokens // 4)],
                       max_output_tokens=4)


def test_groups_name_each_instance_once_and_know_its_mates() -> None:
    g = HardwareGroups([["p0", "p2"], ["p1", "p3", "d0"]])
    assert g and "p0" in g and "p4" not in g
    assert g.mates("p1") == {"p3", "d0"} and g.mates("p4") == frozenset()
    assert g.groups() == [["d0", "p1", "p3"], ["p0", "p2"]]
    # processor sharing measured: each busy mate adds its share, others and itself do not count
    assert g.slowdown("p1", {"p1": 1.0, "p3": 0.5, "d0": 2.0, "p0": 1.0}) == pytest.approx(2.5)
    g.forget("p2")
    assert "p0" not in g and g.mates("p1") == {"p3", "d0"}
    assert not HardwareGroups()
    with pytest.raises(ValueError, match="'p0' is in two hardware groups"):
        HardwareGroups([["p0", "p1"], ["p2", "p0"]])
    with pytest.raises(ValueError, match="names an instance twice"):
        HardwareGroups([["p0", "p0"]])
    with pytest.raises(ValueError, match="at least 2 instances"):
        HardwareGroups([["p0"]])


def test_the_calibrator_divides_out_the_processor_sharing_of_a_grouped_prefill() -> None:
    # p0 and p1 share a core; p0 is 1.3x its profile alone. Its samples ran beside p1 busy for 0, half
    # or all of their time (1x, 1.5x, 2x). Its factor is its speed alone, and no pair is fitted for it.
    cal = LatencyCalibrator(BASE, groups=HardwareGroups([["p0", "p1"]]))
    for k in range(30):
        share = (0.0, 0.5, 1.0)[k % 3]
        cal.observe_prefill(0.5, 0.5 * 1.3 * (1 + share), instance="p0", busy={"p0": 1.0, "p1": share, "p2": 1.0})
    assert cal.factor("prefill", "p0") == pytest.approx(1.3, rel=1e-6)
    assert "p0" not in cal.prefill_interference()
    # an instance in no group: the same samples go into the pairs fit, the factor averages less
    plain = LatencyCalibrator(BASE)
    for k in range(30):
        share = (0.0, 0.5, 1.0)[k % 3]
        plain.observe_prefill(0.5, 0.5 * 1.3 * (1 + share), instance="p0", busy={"p0": 1.0, "p1": share})
    assert plain.prefill_interference()["p0"]["p1"] > 0.3


def test_the_ttft_check_runs_a_grouped_prefill_at_its_share_of_the_hardware() -> None:
    # p0 and p1 share a core, p2 has its own. Each request is 0.2 s alone; the SLO 0.35 s.
    cl = _cluster(3)
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=0.35))
    sched.hardware_groups = HardwareGroups([["p0", "p1", "d0"]])
    assert sched.prefill_contention("p0", 0.0, 0.2) == 1.0
    cl.on_prefill_start("p2", _req(2), 0.0, est_s=10.0)  # busy, on other hardware
    assert sched.prefill_contention("p0", 0.0, 0.2) == 1.0
    cl.on_prefill_start("p1", _req(1), 0.0, est_s=0.1)  # the mate is busy for half the request's time
    assert sched.prefill_contention("p0", 0.0, 0.2) == pytest.approx(1.5)  # linear, not exp
    assert sched.prefill_contention("p0", 0.0, 0.2, busy_as=("p1", 1.0)) == pytest.approx(2.0)
    cl.on_decode_start("d0", _req(9), 0.0)  # a streaming decode mate counts whole
    assert sched.prefill_contention("p0", 0.0, 0.2) == pytest.approx(2.5)
    assert sched.prefill_contention("p2", 0.0, 0.2) == 1.0  # no mates
    cl.on_decode_done("d0", _req(9), 0.0)
    # 0.2 s x 1.5 = 0.3 s fits on p0
    d = sched.schedule(_req(3), 0.0)
    assert isinstance(d, Decision) and d.prefill_id == "p0", d
    cl.on_scheduled(d, _req(3), 0.0)
    # now p1 and p0 busy: a third request on either would run 0.2 s + 0.2 s queued at shared speed
    r = sched.schedule(_req(4), 0.0)
    assert isinstance(r, Rejection) and "TTFT SLO" in r.reason, r


def test_a_request_that_would_slow_a_queued_mate_past_the_slo_goes_elsewhere_or_gets_a_429() -> None:
    # p0 and p2 share a core. r0 is queued on p2 with 0.3 s of work left, p0 idle: r0 predicted 0.3 s.
    # A request on p0 (0.2 s alone) shares the core for 0.2 s: r0 then ends at 0.3 + 0.2 = 0.5 s >
    # the 0.45 s SLO (processor sharing: the new one also ends at 0.4 s, within it). p1 has its own core.
    cl = _cluster(3)
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=0.45))
    sched.hardware_groups = HardwareGroups([["p0", "p2"]])
    r0 = _req(0)
    cl.on_prefill_start("p2", r0, 0.0, est_s=0.3)
    plan = sched.local_plan("p0", _req(1), 0.0)
    hurt = sched.pair_harm(plan, 0.0)
    assert hurt is not None and hurt[:2] == ("p2", "r0") and hurt[2] == pytest.approx(0.5, rel=0.05)
    assert sched.pair_harm(sched.local_plan("p1", _req(1), 0.0), 0.0) is None
    d = sched.schedule(_req(1), 0.0)
    assert isinstance(d, Decision) and d.prefill_id == "p1", d
    cl.on_scheduled(d, _req(1), 0.0)
    cl.on_prefill_start("p1", _req(2), 0.0, est_s=5.0)  # p1 now queued far past the SLO
    r = sched.schedule(_req(3), 0.0)
    assert isinstance(r, Rejection) and "would slow request 'r0' queued on 'p2'" in r.reason, r
    sched.hardware_groups = HardwareGroups()  # undeclared: p0 looks idle and the request fits
    d = sched.schedule(_req(3), 0.0)
    assert isinstance(d, Decision) and d.prefill_id == "p0", d


def _ps_finish(totals: dict[str, float]) -> dict[str, float]:
    """Exact processor sharing of each instance's work (all present at 0): when each one's is done."""
    return {p: sum(min(t, x) for x in totals.values()) for p, t in totals.items()}


def test_processor_sharing_predicts_a_burst_on_one_core() -> None:
    # Four prefills on one core, requests of 0.2 s alone, SLO 1.0 s, eight arrive at once. The check
    # admits while processor sharing of the admitted work keeps every one within the SLO, and no more:
    # one more request, on any instance, would end past it (or push one already admitted past it).
    # Undeclared (each instance on its own core) it admits all eight.
    cl = _cluster(4)
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=1.0))
    sched.hardware_groups = HardwareGroups([["p0", "p1", "p2", "p3"]])
    totals: dict[str, float] = {}
    for i in range(8):
        d = sched.schedule(_req(i), 0.0)
        if isinstance(d, Decision):
            cl.on_scheduled(d, _req(i), 0.0)
            totals[d.prefill_id] = totals.get(d.prefill_id, 0.0) + 0.2
    assert 2 <= sum(totals.values()) / 0.2 < 8, totals
    assert max(_ps_finish(totals).values()) <= 1.0 + 0.05, totals
    for q in ("p0", "p1", "p2", "p3"):
        more = {**totals, q: totals.get(q, 0.0) + 0.2}
        assert max(_ps_finish(more).values()) > 1.0 - 0.05, (q, totals)
    cl2 = _cluster(4)
    plain = make_scheduler("load_balance", cl2, BASE, SloConfig(ttft_s=1.0))
    for i in range(8):
        d = plain.schedule(_req(i), 0.0)
        assert isinstance(d, Decision), d
        cl2.on_scheduled(d, _req(i), 0.0)


def test_a_head_that_shared_its_core_is_only_that_far_along() -> None:
    # p0 and p1 share a core. p0's head (1 s alone) started at 0; p1 has been busy since 0.5 s. At 1.0 s
    # p0's head ran 0.5 s alone and 0.5 s at half speed: 0.75 s done exactly; the estimate divides the
    # time by 1 + p1's mean busy share (0.5): 0.67 s -- a little less (the mean share, not the mean
    # speed), which errs towards a longer queue.
    cl = _cluster(3)
    cl.track_head_busy = True
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=10.0))
    sched.hardware_groups = HardwareGroups([["p0", "p1"]])
    cl.on_prefill_start("p0", _req(0), 0.0, est_s=1.0)
    cl.on_prefill_start("p0", _req(1), 0.0, est_s=0.4)
    cl.on_prefill_start("p1", _req(2), 0.5, est_s=10.0)
    assert sched.head_done("p0", 1.0) == pytest.approx(1.0 / 1.5)  # busy share 0.5 over 1 s
    assert sched.queue_time("p0", 1.0) == pytest.approx(1.0 - 1.0 / 1.5 + 0.4)
    assert sched.head_done("p0", 1.5) == pytest.approx(1.5 / (1 + 1.0 / 1.5))  # exactly 1.0
    assert sched.prefill_lateness("p0", 1.5) == 0.0 and sched.prefill_slowdown("p0", 1.5) == 1.0
    assert sched.head_done("p0", 3.5) == pytest.approx(3.5 / (1 + 3.0 / 3.5))  # late even for the sharing
    assert sched.prefill_slowdown("p0", 3.5) == pytest.approx(sched.head_done("p0", 3.5))
    # the next head's clock starts at its own start
    cl.on_prefill_done("p0", _req(0), 3.5)
    assert sched.head_done("p0", 4.5) == pytest.approx(0.5)
    # p2 has its own core: wall time is work
    cl.on_prefill_start("p2", _req(3), 0.0, est_s=1.0)
    assert sched.head_done("p2", 0.75) == 0.75 and sched.queue_time("p2", 0.75) == pytest.approx(0.25)
    sched.hardware_groups = HardwareGroups()
    assert sched.head_done("p0", 4.5) == pytest.approx(1.0)  # undeclared: wall time


def test_the_exponent_of_sharing_is_learned_per_group_beside_each_instances_speed() -> None:
    # p0 and p1 share a core at more than the ideal: (1 + busy share) ** 1.5, not ** 1; p0 is 1.3x its
    # profile alone. Samples alone and beside p1 busy half or all of the time: the calibrator learns
    # both, and the scheduler's multiplier uses the exponent.
    groups = HardwareGroups([["p0", "p1"], ["p2", "p3"]])
    cal = LatencyCalibrator(BASE, groups=groups)
    for k in range(60):
        share = (0.0, 0.5, 1.0)[k % 3]
        cal.observe_prefill(0.5, 0.5 * 1.3 * (1 + share) ** 1.5, instance="p0", busy={"p1": share})
    assert groups.exponent("p0") == pytest.approx(1.5, rel=0.05) and groups.exponent("p1") == groups.exponent("p0")
    assert groups.exponent("p2") == 1.0 and groups.exponents() == {"p0,p1": pytest.approx(1.5, rel=0.05)}
    assert cal.factor("prefill", "p0") == pytest.approx(1.3, rel=0.05)
    cl = _cluster(2)
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=10.0))
    sched.hardware_groups = groups
    cl.on_prefill_start("p1", _req(1), 0.0, est_s=5.0)
    assert sched.prefill_contention("p0", 0.0, 0.2) == pytest.approx(2 ** groups.exponent("p0"))
    # a sample that ran nearly alone says nothing about sharing
    assert not groups.observe("p0", {"p1": 0.1}, 3.0)
    with pytest.raises(ValueError, match="max_exponent >= 1"):
        HardwareGroups(max_exponent=0.5)
