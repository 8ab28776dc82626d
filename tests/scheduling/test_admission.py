"""Rejection modes (early / decode / early+decode) and the decode-stage check (pure)."""

from __future__ import annotations

import pytest

from mooncake_proxy.scheduling import (REJECTION_MODES, ClusterState, CostModel, InstanceInfo, Rejection,
                                       RequestInfo, SloConfig, decode_stage_rejection, split_rejection)

# decode step 10 ms + 1 ms per running request, no KV term
COST = CostModel(c0=0.0, c1=0.001, c2=0.0, d0=0.01, d1=0.001, d2=0.0, block_size=4, name="test")


def test_split_rejection_follows_the_papers_rows() -> None:
    slo = SloConfig(ttft_s=2.0, tbt_s=0.05, retry_after_s=3.0, prediction_horizon_s=5.0)
    early, limit = split_rejection(slo, "early")
    assert early == slo and limit is None
    base, limit = split_rejection(slo, "decode")
    # the baseline: TTFT still on arrival, no TBT (nor its prediction) before the prefill
    assert (base.ttft_s, base.tbt_s, base.prediction_horizon_s, base.retry_after_s) == (2.0, None, None, 3.0)
    assert limit == 0.05
    both, limit = split_rejection(slo, "early+decode")
    assert both == slo and limit == 0.05
    assert REJECTION_MODES == ("early", "decode", "early+decode")
    with pytest.raises(ValueError, match="early, decode, early\\+decode"):
        split_rejection(slo, "late")


def test_decode_stage_rejection_uses_the_current_batch() -> None:
    cl = ClusterState(block_size=4)
    cl.add_instance(InstanceInfo("d0", "decode"))
    r = RequestInfo("new", 40, [], max_output_tokens=10)
    assert decode_stage_rejection(cl, COST, "d0", r, 0.0115, 1.0) is None  # alone: 11 ms
    for i in range(3):
        cl.on_decode_start("d0", RequestInfo(f"run{i}", 40, [], max_output_tokens=10), 0.0)
    rej = decode_stage_rejection(cl, COST, "d0", r, 0.0135, 2.0)  # 4 in the batch: 14 ms
    assert isinstance(rej, Rejection)
    assert rej.est_tbt_s == pytest.approx(0.014) and rej.retry_after_s == 2.0
    assert "decode stage" in rej.reason and "'d0'" in rej.reason and "3 running" in rej.reason
    assert decode_stage_rejection(cl, COST, "d0", r, 0.0145, 1.0) is None
    # requests still in prefill towards d0 do not count: that lag is what prediction removes
    cl.add_instance(InstanceInfo("p0", "prefill"))
    cl.on_prefill_start("p0", RequestInfo("coming", 40, [], max_output_tokens=10), 0.0, decode_id="d0")
    assert decode_stage_rejection(cl, COST, "d0", r, 0.0145, 1.0) is None
