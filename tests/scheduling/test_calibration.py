"""Online cost-model calibration from observed latencies, shared and per instance (pure)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from mooncake_proxy.scheduling import LatencyBoard, LatencyModel
from mooncake_proxy.scheduling import (ClusterState, CostModel, Decision, InstanceInfo, LatencyCalibrator, Rejection,
                                       RequestInfo, SloConfig, make_scheduler)

BASE = CostModel(c0=0.01, c1=0.001, c2=1e-9, d0=0.02, d1=0.002, d2=1e-8, transfer_latency_s=0.003,
                 block_size=4, name="base")


def test_first_sample_sets_the_factor_and_later_ones_move_it_by_alpha() -> None:
    cal = LatencyCalibrator(BASE, alpha=0.5)
    assert cal.factor("prefill") == 1.0 and cal.cost() is not None
    assert cal.observe_prefill(0.5, 5.0)  # 10x slower than predicted
    assert cal.factor("prefill") == pytest.approx(10.0)
    assert cal.observe_prefill(0.5, 0.5)  # one on-time sample halves the log factor
    assert cal.factor("prefill") == pytest.approx(math.sqrt(10.0))
    assert cal.factor("decode") == 1.0 and cal.samples("prefill") == 2 and cal.samples("decode") == 0


def test_cost_scales_compute_not_transfer() -> None:
    cal = LatencyCalibrator(BASE)
    cal.observe_prefill(0.1, 0.4)
    cal.observe_decode(0.02, 0.01)
    c = cal.cost()
    assert c.prefill_time(100, 20) == pytest.approx(4 * BASE.prefill_time(100, 20))
    assert c.decode_step_time(3, 1000) == pytest.approx(0.5 * BASE.decode_step_time(3, 1000))
    assert c.transfer_time(7) == BASE.transfer_time(7)
    assert cal.cost() is c  # cached until a factor moves
    cal.observe_decode(0.02, 0.04)
    assert cal.cost() is not c


def test_converges_on_a_steady_slowdown_and_is_clamped() -> None:
    cal = LatencyCalibrator(BASE, alpha=0.2, lo=0.5, hi=20.0)
    cal.observe_prefill(1.0, 1.0)
    for _ in range(60):
        cal.observe_prefill(1.0, 3.0)
    assert cal.factor("prefill") == pytest.approx(3.0, rel=1e-3)
    for _ in range(100):
        cal.observe_prefill(1.0, 1000.0)
    assert cal.factor("prefill") == pytest.approx(20.0)
    for _ in range(100):
        cal.observe_decode(1.0, 1e-6)
    assert cal.factor("decode") == pytest.approx(0.5)


def test_ignores_meaningless_samples() -> None:
    cal = LatencyCalibrator(BASE, min_predicted_s=0.01)
    for pred, obs in ((0.001, 1.0), (1.0, 0.0), (float("nan"), 1.0), (1.0, float("inf"))):
        assert not cal.observe_prefill(pred, obs)
    assert cal.samples("prefill") == 0 and cal.factor("prefill") == 1.0


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="alpha"):
        LatencyCalibrator(BASE, alpha=0.0)
    with pytest.raises(ValueError, match="lo"):
        LatencyCalibrator(BASE, lo=2.0)
    with pytest.raises(ValueError, match="'prefill' or 'decode'"):
        LatencyCalibrator(BASE).factor("store")


def test_an_unconfirmed_factor_fades_after_stale_s() -> None:
    cal = LatencyCalibrator(BASE, stale_s=10.0, half_life_s=5.0)
    assert not cal.tick(100.0)  # nothing learned: nothing to fade
    cal.observe_prefill(0.1, 1.6, now=0.0)  # x16
    assert not cal.tick(9.0) and cal.factor("prefill") == pytest.approx(16.0)
    assert cal.tick(15.0)  # 5 s past stale: one half-life -> x4
    assert cal.factor("prefill") == pytest.approx(4.0)
    assert cal.cost().prefill_time(100) == pytest.approx(4.0 * BASE.prefill_time(100))
    assert cal.tick(20.0) and cal.factor("prefill") == pytest.approx(2.0)  # no double counting
    cal.observe_prefill(0.1, 1.6, now=21.0)  # a fresh sample restarts the clock
    f = cal.factor("prefill")
    assert not cal.tick(30.0) and cal.factor("prefill") == f
    assert cal.tick(1000.0) and cal.factor("prefill") == 1.0
    with pytest.raises(ValueError, match="half_life_s"):
        LatencyCalibrator(BASE, half_life_s=0.0)


def test_first_token_delay_per_decode_instance() -> None:
    cal = LatencyCalibrator(BASE, alpha=0.5, stale_s=10.0, half_life_s=5.0)
    assert cal.first_token("d0") == 0.0
    assert cal.observe_first_token("d0", 4.0, now=0.0)
    cal.observe_first_token("d0", 2.0, now=1.0)
    cal.observe_first_token("d1", 0.5, now=1.0)
    assert cal.first_token("d0") == pytest.approx(3.0) and cal.first_token_all() == {"d0": 3.0, "d1": 0.5}
    assert not cal.observe_first_token("d0", -1.0) and not cal.observe_first_token("d0", float("nan"))
    assert cal.tick(16.0)  # 5 s past stale
    assert cal.first_token("d0") == pytest.approx(1.5) and cal.first_token("d1") == pytest.approx(0.25)
    cal.forget("d1")
    assert cal.first_token_all() == {"d0": pytest.approx(1.5)}


def _steady(cal: LatencyCalibrator, instance: str, ratio: float, n: int, now: float = 0.0) -> None:
    for _ in range(n):
        cal.observe_prefill(0.1, 0.1 * ratio, now=now, instance=instance)


def test_a_frozen_instances_samples_leave_the_other_instances_estimate_unchanged() -> None:
    # The live bench: one prefill's vLLM process froze and its samples took the (then global)
    # prefill factor to 17x, so every instance's TTFT looked 17x and every request got a 429.
    cal = LatencyCalibrator(BASE, alpha=0.5)
    _steady(cal, "p0", 1.5, 6)
    _steady(cal, "p1", 1.5, 6)
    f0, c0 = cal.factor("prefill", "p0"), cal.cost_for("p0")
    assert f0 == pytest.approx(1.5)
    _steady(cal, "p1", 17.0, 30, now=1.0)
    assert cal.factor("prefill", "p1") == pytest.approx(17.0, rel=1e-3)
    assert cal.factor("prefill", "p0") == f0  # exactly: none of p1's samples reach it
    assert cal.cost_for("p0").prefill_time(100) == c0.prefill_time(100)
    assert cal.cost_for("p1").prefill_time(100) == pytest.approx(17.0 * BASE.prefill_time(100), rel=1e-3)
    assert cal.factor("prefill") > 10.0  # the shared factor did see them...
    # ...but a new instance's prior is the healthy confirmed instance's factor, not that inflation
    assert cal.prior("prefill") == pytest.approx(1.5) and cal.factor("prefill", "p2") == pytest.approx(1.5)
    assert cal.cost_for("p2") is cal.cost() and cal.cost().prefill_time(100) == c0.prefill_time(100)
    assert cal.instance_factors()[("prefill", "p0")] == f0
    assert cal.samples("prefill", "p1") == 36 and cal.samples("prefill", "p2") == 0


def test_a_new_instance_starts_from_the_shared_prior() -> None:
    cal = LatencyCalibrator(BASE, alpha=0.5, prior_samples=4)
    _steady(cal, "p0", 4.0, 10)
    assert cal.factor("prefill", "p9") == pytest.approx(4.0)  # never seen: the shared factor
    assert cal.cost_for("p9") is cal.cost()
    cal.observe_prefill(0.1, 0.1, instance="p9")  # one on-time sample: 1/4 of the way from the prior
    shared = math.log(cal.factor("prefill"))
    assert math.log(cal.factor("prefill", "p9")) == pytest.approx(0.75 * shared)
    for _ in range(3):
        cal.observe_prefill(0.1, 0.1, instance="p9")
    assert cal.factor("prefill", "p9") == pytest.approx(1.0)  # 4 samples of its own: its own factor
    assert cal.cost_for("p9").prefill_time(50) == pytest.approx(BASE.prefill_time(50))
    # sides are apart: a prefill instance's decode factor is the shared decode factor
    cal.observe_decode(0.02, 0.06, instance="d0")
    assert cal.factor("decode", "p9") == pytest.approx(3.0) and cal.factor("decode", "d0") == pytest.approx(3.0)
    with pytest.raises(ValueError, match="prior_samples"):
        LatencyCalibrator(BASE, prior_samples=0)


def test_the_prior_is_the_best_confirmed_instance_not_the_inflated_shared_factor() -> None:
    # The live bench's freeze: one prefill's samples at 17x took the shared factor to ~10x for
    # tens of seconds; an instance borrowing it (new, or faded back) got no traffic and no sample.
    cal = LatencyCalibrator(BASE, alpha=0.5, prior_samples=3, stale_s=10.0, half_life_s=10.0)
    _steady(cal, "p0", 1.2, 4)
    _steady(cal, "p1", 17.0, 4, now=1.0)
    assert cal.factor("prefill") > 8.0
    assert cal.prior("prefill") == pytest.approx(1.2)
    assert cal.factor("prefill", "new") == pytest.approx(1.2)
    # an unconfirmed instance is pulled towards that prior, not towards the shared factor
    cal.observe_prefill(0.1, 0.3, now=1.0, instance="p2")  # one sample at 3x
    assert math.log(cal.factor("prefill", "p2")) == pytest.approx(math.log(1.2) + (math.log(3.0) - math.log(1.2)) / 3)
    # the frozen instance, once avoided, fades towards the healthy factor: halfway 10 s after stale
    _steady(cal, "p0", 1.2, 1, now=20.0)
    assert cal.tick(21.0)
    assert cal.factor("prefill", "p1") == pytest.approx(math.sqrt(17.0 * 1.2), rel=1e-2)
    # a prior never above the shared factor: when every confirmed instance is slower, it is the shared one
    cal2 = LatencyCalibrator(BASE, alpha=1.0, prior_samples=2)
    _steady(cal2, "a", 4.0, 2)
    cal2.observe_prefill(0.1, 0.2, instance="b")  # the shared factor (alpha 1) now 2x; b unconfirmed
    assert cal2.prior("prefill") == pytest.approx(2.0)


def test_an_avoided_instance_fades_back_to_the_shared_factor() -> None:
    # After a freeze the scheduler sends nothing to the slow instance, so no sample corrects it:
    # the fade brings it back to the shared factor and it is tried again.
    cal = LatencyCalibrator(BASE, alpha=1.0, stale_s=10.0, half_life_s=5.0, prior_samples=1)
    cal.observe_prefill(0.1, 0.2, now=0.0, instance="p0")  # x2
    cal.observe_prefill(0.1, 3.2, now=0.0, instance="p1")  # x32
    cal.observe_prefill(0.1, 0.2, now=0.0, instance="p0")  # the shared factor back at x2
    for t in range(1, 15):  # p0 keeps serving at x2
        cal.observe_prefill(0.1, 0.2, now=float(t), instance="p0")
    assert not cal.tick(9.0)
    assert cal.factor("prefill", "p1") == pytest.approx(32.0)
    assert cal.tick(15.0)  # 5 s past stale: p1 halfway (in log) to the shared x2 -> x8
    assert cal.factor("prefill", "p1") == pytest.approx(8.0)
    assert cal.factor("prefill", "p0") == pytest.approx(2.0) and cal.factor("prefill") == pytest.approx(2.0)
    assert cal.cost_for("p1").prefill_time(100) == pytest.approx(8.0 * BASE.prefill_time(100))
    cal.observe_prefill(0.1, 0.2, now=15.0, instance="p0")
    assert cal.tick(200.0)  # long after: p1 at the shared factor, which itself faded to 1
    assert cal.factor("prefill", "p1") == pytest.approx(1.0) and cal.factor("prefill") == 1.0
    cal.forget("p1")
    assert ("prefill", "p1") not in cal.instance_factors() and "p1" not in cal.costs()


def test_the_scheduler_routes_around_a_frozen_prefill_instead_of_rejecting() -> None:
    # Pure end to end: calibrator -> conductor's TTFT check. p1's samples are 17x, p0's 1x; with one
    # global factor a 0.5 s TTFT SLO rejects the request everywhere, with per-instance costs p0 takes it.
    cost = CostModel(c0=0.0, c1=0.001, c2=0.0, d0=0.01, d1=0.0, d2=0.0, block_size=4, name="t")
    cl = ClusterState(block_size=4)
    for iid, role in (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode")):
        cl.add_instance(InstanceInfo(iid, role))
    cal = LatencyCalibrator(cost, alpha=0.5)
    _steady(cal, "p0", 1.0, 5)
    _steady(cal, "p1", 17.0, 40)
    r = RequestInfo("r", 100, [1, 2], max_output_tokens=4)  # 0.1 s at 1x, 1.7 s at 17x
    shared = dataclasses.replace(cost, c1=cost.c1 * cal.factor("prefill"))  # the old global factor
    board = LatencyBoard(LatencyModel(shared))
    s = make_scheduler("conductor", cl, shared, SloConfig(ttft_s=0.5), latency=board)
    assert isinstance(s.schedule(r, 0.0), Rejection)  # the global factor (> 10x) alone
    board.publish(LatencyModel(shared, instance_costs=cal.costs()))
    d = s.schedule(r, 0.0)
    assert isinstance(d, Decision) and d.prefill_id == "p0" and d.est_ttft_s == pytest.approx(0.1)
    assert s.cost_for("p1").prefill_time(100) == pytest.approx(1.7, rel=1e-3)
