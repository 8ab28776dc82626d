"""The decode stream's timing the calibration learns from (relay.StreamTiming; pure)."""

from __future__ import annotations

import numpy as np
import pytest

from mooncake_proxy.relay import StreamTiming


def test_the_gap_quantile_is_numpys_percentile_of_the_gaps() -> None:
    t = StreamTiming()
    assert t.gap_quantile() is None
    t.gaps = [0.02, 0.02, 0.5, 0.02, 0.03, 0.02, 0.04]  # one long gap: the mean hides it, the p90 not
    assert t.gap_quantile(0.9) == pytest.approx(float(np.percentile(t.gaps, 90)))
    assert t.gap_quantile(0.5) == pytest.approx(0.02)
    assert t.gap_quantile(1.0) == 0.5 and t.gap_quantile(0.0) == 0.02
    t.gaps = [0.1]
    assert t.gap_quantile() is None  # one gap says nothing about a quantile
