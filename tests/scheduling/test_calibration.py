"""Online cost-model calibration from observed latencies (pure)."""

from __future__ import annotations

import math

import pytest

from mooncake_proxy.scheduling import CostModel, LatencyCalibrator

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
