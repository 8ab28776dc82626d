"""The proxy's calibration loop (mooncake_proxy/calibration_loop.py), without sockets: what it is
told goes into the calibrator, and what the calibrator learns reaches the scheduler only through
the latency model the loop publishes, the decode loads and the metrics."""

from __future__ import annotations

import pytest

from mooncake_proxy.calibration_loop import CalibrationLoop
from mooncake_proxy.metrics import ProxyMetrics
from mooncake_proxy.scheduling import (ClusterState, CostModel, HardwareGroups, InstanceInfo, RequestInfo,
                                       SchedulerSettings, SloConfig, make_scheduler)


def _setup(contention: str = "pairs") -> tuple[ClusterState, CalibrationLoop, ProxyMetrics, object]:
    cl = ClusterState(block_size=16)
    for iid, role in (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode")):
        cl.add_instance(InstanceInfo(iid, role))
    metrics = ProxyMetrics()
    groups = HardwareGroups()
    loop = CalibrationLoop(CostModel.default(), cl, metrics, groups, contention)
    sched = make_scheduler("load_balance", cl, CostModel.default(), SloConfig(),
                           settings=SchedulerSettings(hardware_groups=groups), latency=loop.board)
    return cl, loop, metrics, sched


def _gauge(metrics: ProxyMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


@pytest.mark.parametrize("contention", ["pairs", "count"])
def test_slow_prefills_reach_the_scheduler_through_the_published_model(contention: str) -> None:
    cl, loop, metrics, sched = _setup(contention)
    before = sched.cost_for("p0").prefill_time(1000)  # type: ignore[attr-defined]
    t = 0.0
    for k in range(8):  # p0 takes twice its estimate, alone
        req = RequestInfo(f"r{k}", 1000)
        s = loop.prefill_sent("p0", t)
        cl.on_prefill_start("p0", req, t, cached_blocks=0)
        t += 2 * before
        cl.on_prefill_done("p0", req, t)
        loop.prefill_answered(s, before, t)
        t += 1.0
    after = sched.cost_for("p0").prefill_time(1000)  # type: ignore[attr-defined]
    assert after > 1.5 * before  # learned slower (the calibrator decides by how much)
    assert loop.board.model.instance_costs["p0"].prefill_time(1000) == after
    assert _gauge(metrics, "mooncake_proxy_cost_factor", side="prefill") > 1.3
    assert _gauge(metrics, "mooncake_proxy_instance_cost_factor", instance="p0", side="prefill") > 1.6
    loop.forget("p0")  # a removed instance's own model goes
    assert "p0" not in loop.board.model.instance_costs


def test_first_token_delays_reach_the_decode_loads_and_the_metrics() -> None:
    cl, loop, metrics, _ = _setup()
    loop.first_token("d0", 0.25, 1.0)
    assert cl.decode_load("d0").first_token_s == pytest.approx(0.25)
    assert _gauge(metrics, "mooncake_proxy_decode_first_token_seconds", instance="d0") == pytest.approx(0.25)
