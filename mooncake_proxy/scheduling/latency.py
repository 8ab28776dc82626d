"""What a ``Scheduler`` is built from besides the cluster: its settings and the latency model it reads.

Why two objects: the settings are fixed for a scheduler's life (flags of the proxy, options of
the simulator); the latency model changes while the proxy runs -- the online calibration
(``calibration.LatencyCalibrator``, driven by the proxy's calibration loop) learns it from
observed latencies. The calibration publishes each new model whole on a ``LatencyBoard``; the
scheduler reads the board's current model and never has a setting copied into it from outside.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .contention import HardwareGroups
from .cost import CostModel


@dataclass(frozen=True)
class SchedulerSettings:
    """A scheduler's fixed settings (the live proxy's flags)."""

    #: the prefill engines' token budget per forward step (vLLM's --max-num-batched-tokens): they
    #: batch their queue, so a request admitted behind others can delay them (batched_queue.py)
    #: and the TTFT check also keeps those within the SLO (``Scheduler.queue_harm``); 0: one at a time
    prefill_batch_tokens: int = 0
    #: with a TTFT SLO, a request that would wait behind others is held to a margin of at least this
    #: times its predicted wait (the live proxy's --ttft-queue-margin); 0: only the learned margins.
    #: Why: in a burst on shared cores queued requests came 2-5x their estimate before any of them
    #: answered, while the warm-up's queued requests had shown 0.6-1.5x
    queue_margin: float = 0.0
    #: > 0: the scheduler keeps each prefill's share of the last seconds it was busy
    #: (contention.RecentBusy with this time constant), read with a prediction horizon;
    #: 0 (the live proxy's --recent-busy-tau 0): only the prefills busy now count
    recent_busy_tau: float = 0.0
    #: instances declared to share hardware (the live proxy's --hardware-group): a prefill of one
    #: is slowed by its busy mates by processor sharing (contention.HardwareGroups), and neither the
    #: slope nor the pairs count for it; empty: every instance on hardware of its own. The object
    #: is shared with the calibrator and forgets removed instances.
    hardware_groups: HardwareGroups = field(default_factory=HardwareGroups)

    def is_default(self) -> bool:
        return (self.prefill_batch_tokens == 0 and self.queue_margin == 0 and self.recent_busy_tau == 0
                and not self.hardware_groups)


@dataclass(frozen=True)
class LatencyModel:
    """How long work takes: the cost model, and what the calibration learned on top of it."""

    cost: CostModel
    #: instance -> its own cost model (per-instance calibration); the others use ``cost``
    instance_costs: Mapping[str, CostModel] = field(default_factory=dict)
    #: log-slowdown of a prefill per busy neighbouring prefill instance (contention.py); 0: none
    contention_slope: float = 0.0
    #: decode -> {prefill: log-slowdown of its steps while that prefill computes}; absent: none
    interference: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: prefill -> {other prefill: log-slowdown of its work while that one is busy}; absent: see the slope
    prefill_interference: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


class LatencyBoard:
    """Where the current ``LatencyModel`` is published: its owner (the calibration, or whoever
    built the scheduler) publishes a whole new model; schedulers read ``model``."""

    def __init__(self, model: LatencyModel) -> None:
        self._model = model

    @property
    def model(self) -> LatencyModel:
        return self._model

    def publish(self, model: LatencyModel) -> None:
        self._model = model
