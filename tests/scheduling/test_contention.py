"""Contention between instances that share hardware: the learned slope, its use in the
calibrator, the cluster's busy count, and the scheduler's TTFT and TBT checks; and declared hardware
groups (``--hardware-group``): processor sharing in the calibrator, the TTFT check and ``pair_harm``
(pure)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from mooncake_proxy.scheduling import Scheduler, SchedulerSettings
from mooncake_proxy.scheduling import (ClusterState, CostModel, Decision, InstanceInfo, LatencyCalibrator, Rejection,
                                       RequestInfo, SloConfig, make_scheduler)
from mooncake_proxy.scheduling.contention import (ContentionSlope, HardwareGroups, Interference, RecentBusy,
                                                  expected_busy_neighbours)

BASE = CostModel(c0=0.01, c1=0.001, c2=0.0, d0=0.02, d1=0.0, d2=0.0, transfer_latency_s=0.003,
                 block_size=4, name="base")


def test_the_slope_fits_ratios_that_grow_with_the_busy_neighbours_whatever_each_instances_speed() -> None:
    s = ContentionSlope(forget=1.0, prior_weight=1.0)
    assert s.slope == 0.0 and s.factor(3) == 1.0
    for _ in range(40):
        for x in (0.0, 1.0, 2.0, 3.0):
            s.observe(x, 0.1 + 0.4 * x, "p0")  # p0 is 1.1x its profile alone
            s.observe(x, 0.9 + 0.4 * x, "p1")  # p1 2.5x: a slower instance, not contention
    assert s.slope == pytest.approx(0.4, rel=0.01)  # the prior's weight is diluted
    assert s.factor(2.5) == pytest.approx(math.exp(0.4 * 2.5), rel=0.03)


def test_an_instance_that_ran_only_under_contention_is_not_read_as_a_slope() -> None:
    # p0 saw only x = 2 and ran 3x; p1 saw only x = 0 and ran 1x: the fit within each instance has
    # no spread, so the difference between them is their speed, not contention (the factors take it)
    s = ContentionSlope()
    for _ in range(20):
        s.observe(2.0, math.log(3.0), "p0")
        s.observe(0.0, 0.0, "p1")
    assert s.slope == 0.0


def test_the_prior_holds_the_slope_down_until_the_samples_spread() -> None:
    s = ContentionSlope(prior_weight=4.0, forget=1.0)
    s.observe(0.0, 0.0)
    s.observe(2.0, 1.0)  # centred: x -1/+1, y -0.5/+0.5 -> sum xx 2, sum xy 1
    assert s.slope == pytest.approx(1.0 / (2.0 + 4.0))
    t = ContentionSlope()
    for _ in range(50):
        for x in (0.0, 2.0):
            t.observe(x, 0.3)  # busy neighbours, no slowdown: dedicated hardware
    assert t.slope == 0.0


def test_the_slope_is_clamped_and_forgets_old_samples() -> None:
    s = ContentionSlope(forget=0.9, max_slope=1.0)
    for _ in range(20):
        for x in (0.0, 1.0):
            s.observe(x, -2.0 * x)  # neighbours making it faster: not physical
    assert s.slope == 0.0
    for _ in range(20):
        for x in (0.0, 1.0):
            s.observe(x, 5.0 * x)
    assert s.slope == 1.0
    for _ in range(80):  # the box went quiet: the new samples replace the old
        for x in (0.0, 1.0):
            s.observe(x, 0.1 * x)
    spread = 0.25 / (1 - 0.9)  # the forgotten sum of (x - mean x)^2 in the steady state
    assert s.slope == pytest.approx(0.1 * spread / (spread + 1.0), rel=0.01)
    s.forget_instance("")  # removed: a fresh instance's one sample has no spread, the slope is 0 again
    assert s.observe(1.0, 0.0, "p9") and s.slope == 0.0
    assert not s.observe(float("nan"), 1.0) and not s.observe(-1.0, 1.0)
    with pytest.raises(ValueError, match="forget"):
        ContentionSlope(forget=0.0)
    with pytest.raises(ValueError, match="prior_weight"):
        ContentionSlope(prior_weight=0.0)


def test_expected_busy_neighbours_counts_each_for_the_share_of_the_request_it_lasts() -> None:
    assert expected_busy_neighbours(1.0, [0.0, 0.5, 2.0, 1.0]) == pytest.approx(0.5 + 1.0 + 1.0)
    assert expected_busy_neighbours(0.0, [0.0, 0.5, 2.0]) == 2.0
    assert expected_busy_neighbours(1.0, []) == 0.0


def test_the_calibrator_learns_the_factor_without_contention_and_the_slope_from_it() -> None:
    # an instance 1.5x its profile when alone, and exp(0.5) slower again per busy neighbour
    cal = LatencyCalibrator(BASE)
    for _ in range(30):
        for x in (0.0, 1.0, 3.0):
            cal.observe_prefill(0.2, 0.2 * 1.5 * math.exp(0.5 * x), instance="p0", contention=x)
    assert cal.factor("prefill", "p0") == pytest.approx(1.5, rel=0.05)
    assert cal.slope("prefill") == pytest.approx(0.5, rel=0.05)
    assert cal.contention_factor("prefill", 3.0) == pytest.approx(math.exp(1.5), rel=0.1)
    assert cal.slope("decode") == 0.0
    # without the contention the same samples give one averaged factor and no slope
    flat = LatencyCalibrator(BASE)
    for _ in range(30):
        for x in (0.0, 1.0, 3.0):
            flat.observe_prefill(0.2, 0.2 * 1.5 * math.exp(0.5 * x), instance="p0")
    assert flat.slope("prefill") == 0.0 and flat.factor("prefill", "p0") > 2.0
    with pytest.raises(ValueError, match="side"):
        cal.slope("middle")


def test_the_cluster_integrates_the_busy_prefill_count() -> None:
    cl = ClusterState(block_size=4)
    for i in range(3):
        cl.add_instance(InstanceInfo(f"p{i}", "prefill"))
    cl.add_instance(InstanceInfo("d0", "decode"))
    r = [RequestInfo(f"r{i}", prompt_tokens=8, block_hashes=[], max_output_tokens=4) for i in range(4)]
    a0 = cl.busy_area(0.0)
    cl.on_prefill_start("p0", r[0], 0.0)
    cl.on_prefill_start("p0", r[1], 0.5)  # same instance: still one busy
    cl.on_prefill_start("p1", r[2], 1.0)
    assert cl.busy_prefills() == 2
    cl.on_prefill_done("p0", r[0], 1.5)
    assert cl.busy_prefills() == 2  # p0 still has r1
    cl.on_prefill_done("p0", r[1], 2.0)
    assert cl.busy_prefills() == 1
    # 0..1 s: one busy, 1..2 s: two, 2..3 s: one
    assert (cl.busy_area(3.0) - a0) / 3.0 == pytest.approx(4.0 / 3.0)
    cl.on_prefill_start("p2", r[3], 3.0)
    cl.remove_instance("p2")  # a busy instance removed: no longer counted
    assert cl.busy_prefills() == 1
    cl.on_prefill_done("p1", r[2], 4.0)
    assert cl.busy_prefills() == 0 and cl.busy_area(9.0) == cl.busy_area(4.0)


def _publish(sched: Scheduler, **changes: object) -> None:
    """Publish a new latency model on the scheduler's board, as the proxy's calibration loop does."""
    sched.latency.publish(dataclasses.replace(sched.latency.model, **changes))


def _cluster(n: int) -> ClusterState:
    cl = ClusterState(block_size=4)
    for i in range(n):
        cl.add_instance(InstanceInfo(f"p{i}", "prefill", cache_capacity_blocks=100))
    cl.add_instance(InstanceInfo("d0", "decode", cache_capacity_blocks=10_000))
    return cl


def _req(i: int, tokens: int = 190) -> RequestInfo:
    return RequestInfo(f"r{i}", prompt_tokens=tokens, block_hashes=[1000 * i + k for k in range(tokens // 4)],
                       max_output_tokens=4)


@pytest.mark.parametrize("slope", [0.0, 0.7])
def test_the_ttft_check_expects_the_busy_neighbours_to_slow_the_request(slope: float) -> None:
    # 4 prefills, each request 0.2 s alone, a 0.35 s TTFT SLO. A burst of 4 at once: with no slope
    # every instance is idle and each request fits; with one, each new request sees the others'
    # queues and the check admits only while exp(slope * busy) * 0.2 s fits.
    cl = _cluster(4)
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=0.35))
    _publish(sched, contention_slope=slope)
    out = []
    for i in range(4):
        d = sched.schedule(_req(i), 0.0)
        out.append(d)
        if isinstance(d, Decision):
            cl.on_scheduled(d, _req(i), 0.0)
    admitted = [d for d in out if isinstance(d, Decision)]
    if slope == 0.0:
        assert len(admitted) == 4
    else:  # 0.2 s x exp(0.7 x busy neighbours) <= 0.35 s: at most 0 .. 0.8 neighbours, so one
        assert len(admitted) == 1
        rej = next(d for d in out if isinstance(d, Rejection))
        assert "TTFT SLO" in rej.reason


def test_a_late_head_and_the_contention_are_not_counted_twice() -> None:
    # the head is 2x its estimate late, the contention predicts 2x: the check multiplies by 2, not 4
    cl = _cluster(2)
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=100.0))
    _publish(sched, contention_slope=math.log(2.0))
    head = _req(0)
    d0 = sched.schedule(head, 0.0)
    assert isinstance(d0, Decision)
    cl.on_scheduled(d0, head, 0.0)
    other = _req(1)
    cl.on_prefill_start("p1" if d0.prefill_id == "p0" else "p0", other, 0.0, est_s=10.0)  # a busy neighbour
    est = d0.est_ttft_s
    plan = sched.local_plan(d0.prefill_id, _req(2), 2 * est)
    done = sched._prefill_done_in(plan, 2 * est)
    assert done == pytest.approx(2.0 * plan.est_ttft_s, rel=1e-6)


def test_the_tbt_check_expects_the_busy_prefills_that_interfere_to_slow_the_decode() -> None:
    cl = _cluster(3)
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(tbt_s=0.03))
    assert isinstance(sched.schedule(_req(0), 0.0), Decision)  # 20 ms step
    _publish(sched, interference={"d0": {"p0": 1.0}})  # p0 shares the decode's core, p1 and p2 do not
    cl.on_prefill_start("p1", _req(10), 0.0, est_s=1.0)
    cl.on_prefill_start("p2", _req(11), 0.0, est_s=1.0)
    assert isinstance(sched.schedule(_req(1), 0.0), Decision)  # busy, but not interfering
    cl.on_prefill_start("p0", _req(12), 0.0, est_s=1.0)
    r = sched.schedule(_req(2), 0.0)  # 20 ms x e = 54 ms
    assert isinstance(r, Rejection) and "TBT SLO" in r.reason


def test_a_prefill_that_would_slow_the_running_decodes_goes_elsewhere_or_gets_a_429() -> None:
    cl = _cluster(2)
    sched = make_scheduler("conductor", cl, BASE, SloConfig(tbt_s=0.05))
    running = _req(0)
    cl.on_decode_start("d0", running, 0.0)  # one request decoding: 20 ms steps
    _publish(sched, interference={"d0": {"p0": 1.5}})  # a prefill on p0 makes them 90 ms
    assert sched.tbt_harm("p0", "d0") == pytest.approx(0.02 * math.exp(1.5), rel=0.05)
    assert sched.tbt_harm("p1", "d0") == pytest.approx(0.02, rel=0.05)
    for i in range(1, 5):
        d = sched.schedule(_req(i), 0.0)
        assert isinstance(d, Decision) and d.prefill_id == "p1", d  # the rotation would give p0 half
    _publish(sched, interference={"d0": {"p0": 1.5, "p1": 1.5}})
    r = sched.schedule(_req(9), 0.0)
    assert isinstance(r, Rejection) and "would slow decode 'd0'" in r.reason
    cl.on_decode_done("d0", running, 1.0)  # nothing decoding: nothing to harm
    assert isinstance(sched.schedule(_req(10), 1.0), Decision)


def test_interference_fits_which_prefill_slows_the_decode() -> None:
    import random

    rng = random.Random(0)
    it = Interference(forget=1.0, ridge=1.0)
    for _ in range(300):
        busy = {"p0": rng.random(), "p1": rng.random(), "p2": rng.random()}
        it.observe("d0", busy, 0.3 + 1.5 * busy["p1"] + rng.gauss(0, 0.05))  # p1 co-located
        it.observe("d1", busy, -2.0 * busy["p0"])  # faster while p0 works: not physical
    c = it.coefs("d0")
    assert c["p1"] == pytest.approx(1.5, abs=0.1) and c.get("p0", 0.0) < 0.1 and c.get("p2", 0.0) < 0.1
    assert all(v < 0.05 for v in it.coefs("d1").values())
    it.forget_instance("p1")
    assert "p1" not in it.coefs("d0")
    it.forget_instance("d0")
    assert it.coefs("d0") == {}
    assert not it.observe("d0", {"p0": float("nan")}, 1.0)
    with pytest.raises(ValueError, match="ridge"):
        Interference(ridge=0.0)


def test_the_calibrator_learns_the_interference_from_decode_samples() -> None:
    cal = LatencyCalibrator(BASE)
    for k in range(60):
        busy = {"p0": (k % 3) / 2, "p1": ((k // 3) % 2) * 1.0}
        cal.observe_decode(0.02, 0.02 * 1.2 * math.exp(1.0 * busy["p0"]), instance="d0", prefill_busy=busy)
    coef = cal.interference()["d0"]
    assert coef["p0"] == pytest.approx(1.0, abs=0.15) and coef.get("p1", 0.0) < 0.1
    assert cal.factor("decode", "d0") == pytest.approx(1.2, rel=0.1)  # its speed with no prefill busy


def test_the_cluster_keeps_each_prefills_busy_time() -> None:
    cl = _cluster(2)
    cl.on_prefill_start("p0", _req(0), 1.0)
    cl.on_prefill_start("p0", _req(1), 1.5)
    cl.on_prefill_done("p0", _req(0), 2.0)
    cl.on_prefill_done("p0", _req(1), 3.0)  # busy 1.0 .. 3.0
    cl.on_prefill_start("p1", _req(2), 2.5)
    assert cl.is_prefill_busy("p1") and not cl.is_prefill_busy("p0")
    assert cl.busy_times(4.0) == {"p0": pytest.approx(2.0), "p1": pytest.approx(1.5)}
    cl.remove_instance("p1")
    assert cl.busy_times(5.0) == {"p0": pytest.approx(2.0)}


def test_recent_busy_is_the_moving_share_of_time_each_prefill_was_busy() -> None:
    r = RecentBusy(tau_s=2.0)
    assert r.update(0.0, {"p0": 0.0, "p1": 0.0}) == {}
    for t in range(1, 21):  # p0 busy all the time, p1 half of it
        r.update(0.5 * t, {"p0": 0.5 * t, "p1": 0.25 * t})
    assert r.share("p0") == pytest.approx(1 - math.exp(-5), abs=1e-9)  # 10 s = 5 time constants
    assert r.share("p1") == pytest.approx(0.5 * (1 - math.exp(-5)), abs=1e-9)
    assert r.update(10.0, {"p0": 10.0, "p1": 5.0}) is not None and r.share("p0") < 1  # same clock: no change
    r.update(12.0, {"p0": 10.0, "p1": 5.0})  # both idle 2 s: one time constant
    assert r.share("p0") == pytest.approx((1 - math.exp(-5)) * math.exp(-1), abs=1e-9)
    r.update(13.0, {"p0": 10.0})  # p1 removed
    assert r.share("p1") == 0.0 and r.share("nobody") == 0.0
    with pytest.raises(ValueError, match="tau_s must be > 0"):
        RecentBusy(tau_s=0)


def test_the_tbt_check_counts_a_prefill_busy_most_of_the_recent_past_though_idle_now() -> None:
    cl = ClusterState(block_size=4)
    for i in ("p0", "p1"):
        cl.add_instance(InstanceInfo(i, "prefill"))
    cl.add_instance(InstanceInfo("d0", "decode"))
    s = make_scheduler("load_balance", cl, BASE, SloConfig(tbt_s=0.05, prediction_horizon_s=5.0),
                       settings=SchedulerSettings(recent_busy_tau=2.0))
    _publish(s, interference={"d0": {"p1": math.log(3.0)}})  # p1 triples the decode's steps (20 ms -> 60 ms)
    # p1 computed back to back for 10 s and went idle a moment ago
    t = 0.0
    for k in range(20):
        r = RequestInfo(f"r{k}", 100)
        cl.on_prefill_start("p1", r, t, cached_blocks=0)
        s.schedule(RequestInfo("probe", 4), t + 0.25)  # the scheduler sees the clock advance
        t += 0.5
        cl.on_prefill_done("p1", r, t)
    assert not cl.is_prefill_busy("p1")
    off = make_scheduler("load_balance", cl, BASE, SloConfig(tbt_s=0.05, prediction_horizon_s=5.0))
    _publish(off, interference=s.interference)  # without a RecentBusy only the prefills busy now count
    assert isinstance(off.schedule(RequestInfo("new", 4), t), Decision)
    out = s.schedule(RequestInfo("new", 4), t)
    assert isinstance(out, Rejection) and "TBT SLO" in out.reason  # ~57 ms predicted
    # without a prediction horizon the check is on the current load: p1 idle now, no slowdown
    s.slo = SloConfig(tbt_s=0.05)
    assert isinstance(s.schedule(RequestInfo("new", 4), t), Decision)
    # after 10 s of rest its share has faded and the stream is admitted
    s.slo = SloConfig(tbt_s=0.05, prediction_horizon_s=5.0)
    assert isinstance(s.schedule(RequestInfo("new", 4), t + 10.0), Decision)


def test_projected_prefill_contention_counts_neighbours_busy_in_the_recent_past() -> None:
    cl = ClusterState(block_size=4)
    for i in ("p0", "p1", "p2"):
        cl.add_instance(InstanceInfo(i, "prefill"))
    cl.add_instance(InstanceInfo("d0", "decode"))
    s = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=10.0, prediction_horizon_s=5.0),
                       settings=SchedulerSettings(recent_busy_tau=2.0))
    _publish(s, contention_slope=0.5)
    t = 0.0
    for k in range(20):  # p1 and p2 busy back to back for 10 s, idle just now
        rs = [RequestInfo(f"r{k}-{p}", 100) for p in ("p1", "p2")]
        for p, r in zip(("p1", "p2"), rs):
            cl.on_prefill_start(p, r, t, cached_blocks=0)
        s.schedule(RequestInfo("probe", 4), t + 0.25)
        t += 0.5
        for p, r in zip(("p1", "p2"), rs):
            cl.on_prefill_done(p, r, t)
    s.schedule(RequestInfo("probe", 4), t)
    assert s.prefill_contention("p0", t, 0.5) == pytest.approx(math.exp(0.5 * 2 * (1 - math.exp(-9.75 / 2))), rel=1e-6)  # seen from t = 0.25
    s.slo = SloConfig(ttft_s=10.0)  # the current load: nobody is busy now
    assert s.prefill_contention("p0", t, 0.5) == 1.0


def test_the_calibrator_learns_which_prefills_share_hardware_from_prefill_samples() -> None:
    # p0 and p2 share a core (2x while the other computes), p1 and p3 the other; every sample also
    # says how long each *other* prefill was busy (its own share, also passed, is ignored)
    import random

    rng = random.Random(1)
    cal = LatencyCalibrator(BASE)
    mate = {"p0": "p2", "p2": "p0", "p1": "p3", "p3": "p1"}
    for k in range(120):
        me = f"p{k % 4}"
        busy = {p: float(rng.random() < 0.5) for p in ("p0", "p1", "p2", "p3")} | {me: 1.0}
        observed = 0.5 * 1.3 * (2.0 if busy[mate[me]] else 1.0)
        cal.observe_prefill(0.5, observed, now=0.0, instance=me, busy=busy)
    pairs = cal.prefill_interference()
    for me, other in mate.items():
        assert pairs[me][other] == pytest.approx(math.log(2.0), abs=0.15), pairs
        assert all(v < 0.1 for p, v in pairs[me].items() if p != other), pairs
        assert me not in pairs[me]
        assert cal.factor("prefill", me) == pytest.approx(1.3, rel=0.1)  # its speed with its core to itself
    assert cal.slope("prefill") == 0.0  # the busy count is not fitted from these samples
    cal.forget("p2")
    assert "p2" not in cal.prefill_interference()["p0"] and "p2" not in cal.prefill_interference()


def test_the_ttft_check_counts_only_the_busy_neighbours_that_share_hardware() -> None:
    # p0 shares hardware with p2 (2x), not with p1. Each request takes 0.2 s alone; SLO 0.35 s.
    cl = _cluster(3)
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=0.35))
    _publish(sched, prefill_interference={"p0": {"p2": math.log(2.0)}, "p2": {"p0": math.log(2.0)}})
    cl.on_prefill_start("p1", _req(1), 0.0, est_s=10.0)  # busy, on other hardware
    assert sched.prefill_contention("p0", 0.0, 0.2) == 1.0
    cl.on_prefill_start("p2", _req(2), 0.0, est_s=0.1)  # busy for half the request's time
    assert sched.prefill_contention("p0", 0.0, 0.2) == pytest.approx(math.sqrt(2.0), rel=1e-6)
    _publish(sched, contention_slope=0.1)  # both models: the slope for every busy neighbour, the pair on top
    assert sched.prefill_contention("p0", 0.0, 0.2) == pytest.approx(math.exp(0.1 * 1.5 + 0.5 * math.log(2.0)), rel=1e-6)
    _publish(sched, contention_slope=0.0)
    cl.on_prefill_done("p1", _req(1), 0.0)
    cl.on_prefill_done("p2", _req(2), 0.0)
    cl.on_prefill_start("p2", _req(3), 0.0, est_s=10.0)  # p0's neighbour busy throughout: 0.4 s > SLO
    d = sched.schedule(_req(4), 0.0)
    assert isinstance(d, Decision) and d.prefill_id == "p1", d  # p0 would miss; p1 shares with no one busy
    cl.on_scheduled(d, _req(4), 0.0)
    cl.on_prefill_done("p1", _req(4), 0.0)
    _publish(sched, prefill_interference={**sched.prefill_interference, "p1": {"p2": math.log(2.0)}})
    r = sched.schedule(_req(5), 0.0)
    assert isinstance(r, Rejection) and "TTFT SLO" in r.reason, r


@pytest.mark.parametrize("known", ["pairs", "groups"])
def test_a_request_that_would_slow_one_queued_on_its_core_mate_past_the_slo_goes_elsewhere_or_gets_a_429(
        known: str) -> None:
    # p0 and p2 share hardware. r0 is queued on p2 with 0.3 s left; p0 is idle, so r0 was predicted at
    # 0.3 s. A request on p0 keeps it busy for its whole 0.2 s: r0 then runs 0.2 s of its 0.3 s slower,
    # past the 0.45 s SLO -- 2x while both compute as a learned pair (log 2), or, declared as a hardware
    # group, by processor sharing (0.3 + 0.2 = 0.5 s). p1 shares with no one.
    cl = _cluster(3)
    groups = HardwareGroups([["p0", "p2"]]) if known == "groups" else HardwareGroups()
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=0.45),
                           settings=SchedulerSettings(hardware_groups=groups))
    if known == "pairs":
        _publish(sched, prefill_interference={"p0": {"p2": math.log(2.0)}, "p2": {"p0": math.log(2.0)}})
        expected = 0.3 * 2 ** (0.2 / 0.3)
    else:
        expected = 0.5
    r0 = _req(0)
    cl.on_prefill_start("p2", r0, 0.0, est_s=0.3)
    plan = sched.local_plan("p0", _req(1), 0.0)
    assert plan.est_ttft_s == pytest.approx(0.2, rel=0.05)
    hurt = sched.pair_harm(plan, 0.0)
    assert hurt is not None and hurt[:2] == ("p2", "r0") and hurt[2] == pytest.approx(expected, rel=0.05)
    assert sched.pair_harm(sched.local_plan("p1", _req(1), 0.0), 0.0) is None
    d = sched.schedule(_req(1), 0.0)
    assert isinstance(d, Decision) and d.prefill_id == "p1", d
    cl.on_scheduled(d, _req(1), 0.0)
    cl.on_prefill_start("p1", _req(2), 0.0, est_s=5.0)  # p1 now queued far past the SLO
    r = sched.schedule(_req(3), 0.0)
    assert isinstance(r, Rejection) and "would slow request 'r0' queued on 'p2'" in r.reason, r
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=0.45))  # nothing known: p0 is idle and fits
    d = sched.schedule(_req(3), 0.0)
    assert isinstance(d, Decision) and d.prefill_id == "p0", d


def test_a_streaming_decode_counts_as_a_neighbour_of_the_prefills_it_slows() -> None:
    # the cluster keeps each decode's streaming time; the calibrator fits a decode column for a prefill
    # sharing its hardware (not mirrored: the decode has no prefill samples); the TTFT check counts a
    # decode streaming now
    cl = _cluster(2)
    cl.on_decode_start("d0", _req(0), 1.0)
    cl.on_decode_start("d0", _req(1), 2.0)
    cl.on_decode_done("d0", _req(0), 3.0)
    assert cl.is_decode_busy("d0") and cl.decode_busy_times(4.0) == {"d0": 3.0}
    cl.on_decode_done("d0", _req(1), 5.0)
    assert not cl.is_decode_busy("d0") and cl.decode_busy_times(9.0) == {"d0": 4.0}
    import random

    rng = random.Random(2)
    cal = LatencyCalibrator(BASE)
    for k in range(80):
        busy = {"p0": float(rng.random() < 0.5), "p1": float(rng.random() < 0.5), "d0": float(rng.random() < 0.5)}
        me = f"p{k % 2}"
        cal.observe_prefill(0.5, 0.5 * (1.8 if me == "p1" and busy["d0"] else 1.0), instance=me, busy=busy)
    pairs = cal.prefill_interference()
    assert pairs["p1"]["d0"] == pytest.approx(math.log(1.8), abs=0.1) and "d0" not in pairs, pairs
    assert pairs.get("p0", {}).get("d0", 0.0) < 0.1, pairs
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=10.0))
    _publish(sched, prefill_interference=pairs)
    assert sched.prefill_contention("p1", 9.0, 0.2) == 1.0  # the decode is idle
    cl.on_decode_start("d0", _req(2), 9.0)
    assert sched.prefill_contention("p1", 9.0, 0.2) == pytest.approx(math.exp(pairs["p1"]["d0"]), rel=1e-6)
    assert sched.pair_harm(sched.local_plan("p0", _req(3), 9.0), 9.0) is None  # decodes are not prefills to harm


# ---------------------------------------------------------------- declared hardware groups
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
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=0.35),
                           settings=SchedulerSettings(hardware_groups=HardwareGroups([["p0", "p1", "d0"]])))
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


def _ps_finish(totals: dict[str, float]) -> dict[str, float]:
    """Exact processor sharing of each instance's work (all present at 0): when each one's is done."""
    return {p: sum(min(t, x) for x in totals.values()) for p, t in totals.items()}


def test_processor_sharing_predicts_a_burst_on_one_core() -> None:
    # Four prefills on one core, requests of 0.2 s alone, SLO 1.0 s, eight arrive at once. The check
    # admits while processor sharing of the admitted work keeps every one within the SLO, and no more:
    # one more request, on any instance, would end past it (or push one already admitted past it).
    # Undeclared (each instance on its own core) it admits all eight.
    cl = _cluster(4)
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=1.0),
                           settings=SchedulerSettings(hardware_groups=HardwareGroups([["p0", "p1", "p2", "p3"]])))
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
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=10.0),
                           settings=SchedulerSettings(hardware_groups=HardwareGroups([["p0", "p1"]])))
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
    plain = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=10.0))
    assert plain.head_done("p0", 4.5) == pytest.approx(1.0)  # undeclared: wall time


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
    sched = make_scheduler("load_balance", cl, BASE, SloConfig(ttft_s=10.0),
                           settings=SchedulerSettings(hardware_groups=groups))
    cl.on_prefill_start("p1", _req(1), 0.0, est_s=5.0)
    assert sched.prefill_contention("p0", 0.0, 0.2) == pytest.approx(2 ** groups.exponent("p0"))
    # a sample that ran nearly alone says nothing about sharing
    assert not groups.observe("p0", {"p1": 0.1}, 3.0)
    with pytest.raises(ValueError, match="max_exponent >= 1"):
        HardwareGroups(max_exponent=0.5)
