"""The demos' round statistics: the cold round apart, the median of the warm ones."""

from __future__ import annotations

import pytest

from mooncake_core.utils.rounds import Rounds


def test_first_round_is_kept_apart_from_the_warm_median() -> None:
    r = Rounds((1.0, 0.1, 0.3, 0.2))
    assert r.first == 1.0
    assert r.warm == pytest.approx(0.2)
    assert r.rate(10**9) == "5.00 GB/s (median of 3 warm rounds; first 1.00 GB/s)"


def test_one_round_is_its_own_warm_figure() -> None:
    r = Rounds((0.5,))
    assert r.warm == 0.5 and r.rate(10**9) == "2.00 GB/s (1 round)"


def test_no_round_is_an_error() -> None:
    with pytest.raises(ValueError, match="no round"):
        Rounds(())
