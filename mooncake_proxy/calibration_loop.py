"""The proxy's online calibration loop (``--calibrate``): observed latencies in, a latency model out.

It owns the ``LatencyCalibrator`` (scheduling/calibration.py). The request pipeline reports
what it saw -- a prefill's time under the contention it ran in, the delay to a decode's first
token, a stream's time between tokens -- and the loop feeds the calibrator. Whenever a factor,
slope or coefficient moves it publishes a new ``LatencyModel`` on its ``board``, which the
scheduler reads (the scheduler has nothing copied into it), copies the first-token delays into
the decode loads the TTFT check reads, and shows the factors in the metrics.

Why samples carry the contention: the scheduler's estimates were made with each instance's
factors and contention in force at scheduling time, so a sample is compared with the estimate
with those taken out, and the contention the work actually ran under goes with it (busy
neighbours' shares, contention.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .metrics import ProxyMetrics
from .scheduling import ClusterState, CostModel, HardwareGroups, LatencyBoard, LatencyCalibrator, LatencyModel


@dataclass(frozen=True)
class PrefillSample:
    """What a prefill ran under, taken when it was sent."""

    instance: str
    t_sent: float
    factor: float  # the instance's prefill factor the estimate was made with
    busy_area: float  # ClusterState.busy_area at t_sent
    busy_times: dict[str, float] | None  # prefills' and decodes' busy times at t_sent (pairs/groups)


def _mean_other_busy(cluster: ClusterState, area_then: float, then: float, now: float) -> float | None:
    """The mean number of busy prefill instances from ``then`` to ``now`` (``ClusterState.busy_area``
    read at ``then``: ``area_then``) besides the sample's own; None when no time passed."""
    if now <= then:
        return None
    return max(0.0, (cluster.busy_area(now) - area_then) / (now - then) - 1)


def _busy_shares(cluster: ClusterState, then_times: dict[str, float], then: float, now: float, *,
                 decodes: bool = False) -> dict[str, float] | None:
    """The share of the time from ``then`` to ``now`` each prefill instance (and with ``decodes``
    each decode instance) was busy (``ClusterState.busy_times`` / ``decode_busy_times`` read at
    ``then``: ``then_times``); None when no time passed."""
    if now <= then:
        return None
    times = {**cluster.busy_times(now), **cluster.decode_busy_times(now)} if decodes else cluster.busy_times(now)
    return {p: max(0.0, t - then_times.get(p, 0.0)) / (now - then) for p, t in times.items()}


class CalibrationLoop:
    """Feeds the calibrator and publishes what it learns (module doc)."""

    def __init__(self, cost: CostModel, cluster: ClusterState, metrics: ProxyMetrics, groups: HardwareGroups,
                 prefill_contention: str) -> None:
        self._cal = LatencyCalibrator(cost, groups=groups)
        self._cluster = cluster
        self._metrics = metrics
        #: "pairs"/"groups": prefill samples carry each neighbour's busy share; "count": their mean number
        self._pairs = prefill_contention in ("pairs", "groups")
        self.board = LatencyBoard(LatencyModel(cost))
        for side in ("prefill", "decode"):
            metrics.cost_factor.labels(side).set(1.0)

    def factor(self, side: str, instance: str) -> float:
        return self._cal.factor(side, instance)

    def tick(self, now: float) -> None:
        """Fade stale factors (once in a while, on the request path)."""
        if self._cal.tick(now):
            self._publish("prefill")
            self._publish("decode")
            self._sync_first_token()

    def forget(self, instance: str) -> None:
        """A removed instance: its factors and coefficients go."""
        self._cal.forget(instance)
        self.board.publish(replace(self.board.model, instance_costs=self._cal.costs(),
                                   interference=self._cal.interference(),
                                   prefill_interference=self._cal.prefill_interference()))

    # ------------------------------------------------------------------ samples
    def prefill_sent(self, instance: str, t_sent: float) -> PrefillSample:
        cl = self._cluster
        return PrefillSample(instance, t_sent, self._cal.factor("prefill", instance), cl.busy_area(t_sent),
                             {**cl.busy_times(t_sent), **cl.decode_busy_times(t_sent)} if self._pairs else None)

    def prefill_answered(self, s: PrefillSample, est_s: float, t_done: float) -> None:
        """The prefill of ``s`` answered at ``t_done``; ``est_s`` the scheduler's estimate."""
        cl = self._cluster
        self._changed("prefill", self._cal.observe_prefill(
            est_s / s.factor, t_done - s.t_sent, t_done, s.instance,
            None if self._pairs else _mean_other_busy(cl, s.busy_area, s.t_sent, t_done),
            _busy_shares(cl, s.busy_times, s.t_sent, t_done, decodes=True) if s.busy_times is not None else None))

    def first_token(self, decode: str, delay_s: float, now: float) -> None:
        """The delay from a prefill's answer to decode ``decode``'s first token."""
        self._cal.observe_first_token(decode, delay_s, now)
        self._sync_first_token()

    def decode_streamed(self, decode: str, est_tbt_s: float, factor: float, gap_s: float, t_start: float,
                        busy_then: dict[str, float], t_end: float) -> None:
        """A stream on ``decode`` ended with ``gap_s`` (its p90 time between tokens); ``est_tbt_s``
        was estimated with ``factor`` (the instance's decode factor x the contention then)."""
        self._changed("decode", self._cal.observe_decode(
            est_tbt_s / factor, gap_s, t_end, decode, _busy_shares(self._cluster, busy_then, t_start, t_end)))

    # ------------------------------------------------------------------ publishing
    def _changed(self, side: str, changed: bool) -> None:
        if changed:
            self._publish(side)

    def _publish(self, side: str) -> None:
        cal = self._cal
        model = LatencyModel(cost=cal.cost(), instance_costs=cal.costs(), contention_slope=cal.slope("prefill"),
                             interference=cal.interference(), prefill_interference=cal.prefill_interference())
        self.board.publish(model)
        pre = side == "prefill"
        self._metrics.show_calibration(side, cal.factor(side), cal.slope(side) if pre else None,
                                       cal.groups.exponents() if pre else {},
                                       model.prefill_interference if pre else model.interference,
                                       cal.instance_factors(), self._cluster)

    def _sync_first_token(self) -> None:
        """Copy the calibrator's first-token delays into the decode loads the TTFT check reads."""
        for iid, s in self._cal.first_token_all().items():
            if iid in self._cluster:
                self._cluster.decode_load(iid).first_token_s = s
                self._metrics.first_token_delay.labels(iid).set(s)

