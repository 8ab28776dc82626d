"""Pure scheduling for the PD proxy and the simulator (no I/O, no clock reads).

Usage::

    from mooncake_proxy.scheduling import (BlockHasher, RequestInfo, InstanceInfo, ClusterState,
        Decision, Rejection, CostModel, SloConfig, make_scheduler, POLICIES)

    cluster = ClusterState(block_size=512)
    cluster.add_instance(InstanceInfo("p0", "prefill", cache_capacity_blocks=10_000))
    cluster.add_instance(InstanceInfo("d0", "decode"))
    sched = make_scheduler("conductor", cluster, CostModel.default(), SloConfig(ttft_s=30, tbt_s=0.1))
    req = RequestInfo("r1", prompt_tokens=n, block_hashes=BlockHasher(512).hash_tokens(ids))
    out = sched.schedule(req, now)
    if isinstance(out, Rejection): ...  # 429, Retry-After: out.retry_after_s
    else:
        cluster.on_scheduled(out, req, now)          # prefill queued, blocks recorded
        ...; cluster.on_prefill_done(out.prefill_id, req, now2)
        cluster.on_decode_start(out.decode_id, req, now2); ...; cluster.on_decode_done(...)
"""

from .admission import REJECTION_MODES, decode_stage_rejection, split_rejection
from .calibration import LatencyCalibrator
from .cluster import STORE, ClusterState, DecodeEntry, DecodeLoad, PrefillEntry, PrefillLoad
from .contention import HardwareGroups, RecentBusy
from .cost import CostModel
from .datatypes import Decision, InstanceInfo, Rejection, RequestInfo, SloConfig
from .handoff_queue import HandoffQueue
from .hashing import BlockHasher
from .latency import LatencyBoard, LatencyModel, SchedulerSettings
from .lru import LruBlockCache
from .ttft_error import TtftErrorQuantile
from .policies import POLICIES, PrefillPlan, Scheduler
from .registry import make_scheduler, policy_names

__all__ = [
    "BlockHasher", "RequestInfo", "InstanceInfo", "ClusterState", "Decision", "Rejection",
    "CostModel", "SloConfig", "make_scheduler", "policy_names", "POLICIES", "Scheduler", "PrefillPlan",
    "LruBlockCache", "STORE", "PrefillEntry", "DecodeEntry", "PrefillLoad", "DecodeLoad",
    "REJECTION_MODES", "split_rejection", "decode_stage_rejection", "LatencyCalibrator",
    "HandoffQueue", "TtftErrorQuantile", "RecentBusy", "HardwareGroups", "LatencyBoard", "LatencyModel",
    "SchedulerSettings",
]
