"""AttainmentFeedback (pure): outcomes of admitted requests -> the TTFT check's budget."""

from __future__ import annotations

import pytest

from mooncake_proxy.scheduling import AttainmentFeedback


def outcomes(fb: AttainmentFeedback, ttfts: list[float], now: float, tag: str = "r") -> None:
    for i, t in enumerate(ttfts):
        fb.admitted(f"{tag}{i}", now - t)
        fb.first_token(f"{tag}{i}", t, now)


def test_budget_stays_whole_while_the_admitted_meet_the_slo() -> None:
    fb = AttainmentFeedback(slo_s=2.0)
    assert fb.attainment(0.0) == 1.0 and fb.budget(0.0) == 1.0  # nothing to go by
    outcomes(fb, [0.5] * 20, now=10.0)
    assert fb.attainment(10.0) == 1.0 and fb.budget(10.0) == 1.0


def test_misses_shrink_the_budget_by_the_shortfall_and_the_prior_damps_the_first() -> None:
    fb = AttainmentFeedback(slo_s=2.0, target=0.9, headroom=0.05, gain=3.0, floor=0.5, prior=4)
    outcomes(fb, [2.5], now=1.0)
    # one miss among 4 met pseudo-outcomes: 80 %, 15 points short of 95 % -> 1 - 0.45
    assert fb.attainment(1.0) == pytest.approx(0.8)
    assert fb.budget(1.0) == pytest.approx(0.55)
    outcomes(fb, [0.4] * 15, now=2.0, tag="ok")
    assert fb.attainment(2.0) == pytest.approx(19 / 20)
    assert fb.budget(2.0) == 1.0  # at the goal: the prediction alone decides
    outcomes(fb, [3.0] * 5, now=3.0, tag="late")
    assert fb.budget(3.0) == 0.5  # never below the floor


def test_a_request_waiting_past_the_slo_counts_as_missed_before_its_first_token() -> None:
    fb = AttainmentFeedback(slo_s=2.0, prior=4)
    for i in range(3):
        fb.admitted(f"w{i}", 0.0)
    assert fb.budget(1.9) == 1.0  # not late yet
    assert fb.attainment(2.5) == pytest.approx(4 / 7) and fb.budget(2.5) < 1.0
    # its late first token is the same miss, counted once
    assert fb.first_token("w0", 3.0, now=3.0) is False
    assert fb.attainment(3.0) == pytest.approx(4 / 7)
    # one that ends without a token: a miss if it was past the SLO, else no outcome
    fb.dropped("w1", 3.0)
    fb.admitted("quick", 3.0)
    fb.dropped("quick", 3.5)
    assert fb.attainment(3.5) == pytest.approx(4 / 7) and fb.waiting() == 1
    assert fb.first_token("unknown", 1.0, now=4.0) is None


def test_misses_age_out_so_the_check_reopens_by_itself() -> None:
    fb = AttainmentFeedback(slo_s=2.0, window_s=30.0)
    outcomes(fb, [5.0] * 4, now=10.0)
    assert fb.budget(10.0) == 0.5
    assert fb.budget(39.9) == 0.5
    assert fb.budget(40.1) == 1.0


@pytest.mark.parametrize("kw, what", [
    ({"slo_s": 0.0}, "slo_s"), ({"slo_s": 2.0, "target": 1.0}, "target"),
    ({"slo_s": 2.0, "target": 0.97}, "headroom"), ({"slo_s": 2.0, "floor": 0.0}, "floor"),
    ({"slo_s": 2.0, "window_s": 0.0}, "window_s")])
def test_bad_parameters_name_themselves(kw: dict, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        AttainmentFeedback(**kw)
