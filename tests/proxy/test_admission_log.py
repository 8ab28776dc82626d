"""The DEBUG ``admitted`` line's fields (mooncake_proxy/admission_log.py), which the SLO bench pairs with each
request's first token: pure, a real ClusterState and scheduler."""

from __future__ import annotations

from mooncake_proxy.admission_log import admitted_fields
from mooncake_proxy.scheduling import (ClusterState, CostModel, Decision, InstanceInfo, RequestInfo, SloConfig,
                                       TtftErrorQuantile, make_scheduler)

COST = CostModel(c0=0.0, c1=0.001, c2=0.0, d0=0.01, d1=0.001, d2=0.0, transfer_latency_s=0.0,
                 bytes_per_token=1.0, bandwidth_bytes_per_s=4000.0, block_size=4, name="test")


def test_a_request_admitted_behind_another_is_logged_with_the_queued_class_margin() -> None:
    cl = ClusterState(block_size=4)
    cl.add_instance(InstanceInfo("p0", "prefill"))
    cl.add_instance(InstanceInfo("d0", "decode"))
    errs = cl.ttft_errors = TtftErrorQuantile()
    for _ in range(2):  # two queued requests came 0.3 s late, on another prefill
        errs.observe("p1", "d0", 0.1, 0.4, now=0.0, queued=True)
    s = make_scheduler("load_balance", cl, COST, SloConfig(ttft_s=5.0))
    first = RequestInfo("a", 100, [1])
    d1 = s.schedule(first, now=0.0)
    assert isinstance(d1, Decision)
    f1 = admitted_fields(cl, d1, first, "p0", "d0", 0.0)
    assert f1["behind"] is False and f1["margin_s"] == 0.0 and f1["queue_s"] == 0.0
    cl.on_prefill_start("p0", first, 0.0, cached_blocks=0, decode_id="d0")
    second = RequestInfo("b", 40, [2])
    d2 = s.schedule(second, now=0.0)
    assert isinstance(d2, Decision)
    f2 = admitted_fields(cl, d2, second, "p0", "d0", 0.0)
    assert f2["behind"] is True and f2["margin_s"] == 0.3 and f2["queue_s"] == 0.1
    assert f2["est_prefill_s"] == 0.14 and f2["prompt_tokens"] == 40 and f2["in_prefill_to_decode"] == 1
