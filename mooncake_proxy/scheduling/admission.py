"""Where SLO-breaking requests are rejected: on arrival, at the decode stage, or both (pure).

The rows of the paper's Table 3, shared by the live proxy (``--rejection``) and the simulator:

* ``early`` -- on arrival only, by the scheduler's TTFT and TBT checks (with ``--prediction-horizon``
  the TBT check uses the decode load projected to when the request would join it: the paper's
  prediction-based early rejection);
* ``decode`` -- the paper's baseline: the TTFT check stays on arrival, but the TBT check happens
  only once the prefill is done, against the decode instance's load at that moment; a request
  rejected there has had its prefill computed for nothing;
* ``early+decode`` -- both: early rejection plus the decode-stage backstop.
"""

from __future__ import annotations

from .cluster import ClusterState, kv_footprint
from .cost import CostModel
from .datatypes import Rejection, RequestInfo, SloConfig

__all__ = ["REJECTION_MODES", "split_rejection", "decode_stage_rejection"]

REJECTION_MODES: tuple[str, ...] = ("early", "decode", "early+decode")


def split_rejection(slo: SloConfig, mode: str) -> tuple[SloConfig, float | None]:
    """(the SLOs the scheduler checks on arrival, the TBT limit checked at the decode stage)."""
    if mode not in REJECTION_MODES:
        raise ValueError(f"rejection mode must be one of {', '.join(REJECTION_MODES)}, got {mode!r}")
    decode_limit = slo.tbt_s if mode != "early" else None
    if mode == "decode":
        slo = SloConfig(ttft_s=slo.ttft_s, retry_after_s=slo.retry_after_s)
    return slo, decode_limit


def decode_stage_rejection(cluster: ClusterState, cost: CostModel, decode_id: str, req: RequestInfo,
                           limit_s: float, retry_after_s: float, contention: float = 1.0) -> Rejection | None:
    """Reject ``req`` when its prefill is done and decode ``decode_id``'s current batch plus it
    would step slower than ``limit_s`` (None: admit). Current load only: that is the baseline.
    ``contention``: the multiplier of the step from the prefills busy now
    (``Scheduler.decode_contention``; 1.0 where instances do not share hardware)."""
    load = cluster.decode_load(decode_id)
    tbt = contention * cost.decode_step_time(load.running + 1,
                                             load.kv_tokens + kv_footprint(req.prompt_tokens, req.max_output_tokens))
    if tbt <= limit_s:
        return None
    return Rejection(f"TBT SLO at the decode stage: predicted {tbt * 1000:.1f}ms > {limit_s * 1000:.1f}ms on "
                     f"decode {decode_id!r} ({load.running} running)", retry_after_s, None, tbt)
