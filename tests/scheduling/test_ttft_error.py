"""The TTFT check's per-pair safety margin from its own errors (scheduling/ttft_error.py): pure."""

from __future__ import annotations

import pytest

from mooncake_proxy.scheduling import TtftErrorQuantile


def test_margin_is_the_quantile_of_the_pairs_residuals() -> None:
    e = TtftErrorQuantile(quantile=0.9, window=10, prior=0)
    assert e.margin("p0", "d0", 0.0) == 0.0  # nothing learned: nothing held against the pair
    for i in range(10):  # residuals 0.0, 0.1, ..., 0.9 s
        assert e.observe("p0", "d0", 0.2, 0.2 + 0.1 * i, now=1.0) == pytest.approx(0.1 * i)
    assert e.margin("p0", "d0", 1.0) == pytest.approx(0.8)  # nearest rank: the 9th of 10
    assert e.margin("p1", "d0", 1.0) == 0.0 and e.samples("p0", "d0") == 10  # per pair
    # the window keeps the last 10: five more late requests push the quantile up
    for _ in range(5):
        e.observe("p0", "d0", 0.2, 2.2, now=1.0)
    assert e.margin("p0", "d0", 1.0) == pytest.approx(2.0)


def test_over_predictions_never_make_the_margin_negative() -> None:
    e = TtftErrorQuantile()
    for _ in range(5):
        e.observe("p0", "d0", 1.0, 0.1, now=0.0)  # predicted 1 s, came in 0.1 s
    assert e.margin("p0", "d0", 0.0) == 0.0
    assert e.observe("p0", "d0", float("nan"), 1.0, 0.0) is None and e.samples("p0", "d0") == 5


def test_one_late_request_is_not_a_quantile_two_are() -> None:
    e = TtftErrorQuantile()  # 9 pseudo-residuals of 0 next to the pair's own
    e.observe("p0", "d0", 0.1, 1.6, now=0.0)  # one clash: ignored
    assert e.margin("p0", "d0", 0.0) == 0.0
    e.observe("p0", "d0", 0.1, 1.1, now=0.0)  # a second late one: the lower of the two
    assert e.margin("p0", "d0", 0.0) == pytest.approx(1.0)
    for _ in range(14):  # a full window: 2 late of 16 real + 9 prior residuals is under 10 %
        e.observe("p0", "d0", 0.1, 0.1, now=1.0)
    assert e.margin("p0", "d0", 1.0) == 0.0


def test_old_residuals_fade_so_an_avoided_pair_is_tried_again() -> None:
    e = TtftErrorQuantile(stale_s=10.0, half_life_s=10.0, prior=0)
    e.observe("p1", "d0", 0.1, 35.1, now=0.0)  # one request caught in a 35 s freeze
    assert e.margin("p1", "d0", 5.0) == pytest.approx(35.0)
    assert e.margin("p1", "d0", 20.0) == pytest.approx(17.5)  # 10 s past stale: halved
    assert e.margin("p1", "d0", 70.0) < 0.6
    # a fresh good sample next to the faded bad one: the quantile of both, the old one faded
    e.observe("p1", "d0", 0.1, 0.15, now=70.0)
    assert e.margin("p1", "d0", 70.0) == pytest.approx(35.0 * 0.5 ** 6)


def test_forget_and_bad_parameters() -> None:
    e = TtftErrorQuantile()
    e.observe("p0", "d0", 0.1, 1.1, 0.0)
    e.observe("p1", "d0", 0.1, 1.1, 0.0)
    e.forget("p0")
    assert e.samples("p0", "d0") == 0 and e.samples("p1", "d0") == 1
    for kw in ({"quantile": 0.0}, {"quantile": 1.5}, {"window": 0}, {"prior": -1}, {"half_life_s": 0.0},
               {"stale_s": -1.0}):
        with pytest.raises(ValueError, match="TtftErrorQuantile"):
            TtftErrorQuantile(**kw)  # type: ignore[arg-type]


def test_requests_admitted_behind_others_are_learned_as_one_class_over_all_pairs() -> None:
    # The live bench's misses: queued requests answered at the end of a batched step, late, next to
    # unqueued ones that came early on the same pairs -- the pair's quantile sees the mix.
    e = TtftErrorQuantile()
    for p in ("p0", "p1", "p2"):  # each pair: 4 early unqueued requests and 1 late queued one
        for _ in range(4):
            e.observe(p, "d0", 1.0, 0.5, now=0.0)
        e.observe(p, "d0", 1.0, 1.4, now=0.0, queued=True)
    assert e.margin("p0", "d0", 0.0) == 0.0  # one late request per pair is no quantile of its own
    assert e.queued_samples() == 3
    # pooled, three late queued requests are: a request that would queue anywhere gets their margin
    assert e.margin("p3", "d0", 0.0, queued=True) == pytest.approx(0.4)
    assert e.margin("p3", "d0", 0.0) == 0.0  # an unqueued one does not
    # ... and the class fades like a pair, so a refused class is tried again
    assert e.margin("p3", "d0", 30.0, queued=True) == pytest.approx(0.1)
    off = TtftErrorQuantile(queued_class=False)
    off.observe("p0", "d0", 1.0, 1.4, now=0.0, queued=True)
    off.observe("p0", "d0", 1.0, 1.4, now=0.0, queued=True)
    assert off.queued_samples() == 0 and off.margin("p1", "d0", 0.0, queued=True) == 0.0
    e.forget("p0")  # the pooled class outlives any one instance
    assert e.samples("p0", "d0") == 0 and e.queued_samples() == 3
