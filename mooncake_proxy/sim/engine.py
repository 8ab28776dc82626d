"""Trace-driven discrete-event simulation of a P/D-disaggregated cluster.

N prefill instances (each a FIFO that runs one prefill at a time, with an LRU prefix cache of
``cache_blocks`` blocks) and M decode instances (continuous batching), optionally a shared
store tier, driven by a Mooncake trace and scheduled by the SAME scheduler code as the live
proxy (:mod:`mooncake_proxy.scheduling`). Events live in a heapq; arrivals are merged in from
the (sorted) trace so the heap only holds in-flight work.

Timing model (all from the :class:`CostModel`):

* prefill: fetch the decision's remote blocks (``transfer_time``) then compute the uncached
  tokens (``prefill_time(new, cached)``); the first token is out when it ends — TTFT.
* hand-off: the prompt's KV moves to the decode instance (``transfer_time`` of its blocks).
* decode: fluid continuous batching. All running requests advance one token per step and a
  step takes ``decode_step_time(batch, kv)`` for the current batch and KV (prompt + tokens
  generated so far); the step time is re-evaluated whenever a request joins or leaves. A
  request's TBT is its decode time / (output_length − 1).

With a store tier (``store_blocks``), every finished prefill writes its blocks to it (an LRU
of that many blocks), as Mooncake's prefill nodes put KV into the distributed pool; the
conductor can then fetch prefixes from it after they left every instance's cache.

The prefix index is fed at routing time (as the live proxy does), so the scheduler's view and
the simulated caches are the same object: a block recorded on an instance is reusable by the
requests queued behind it on that instance.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from mooncake_proxy.scheduling import (ClusterState, CostModel, Decision, InstanceInfo, Rejection, RequestInfo,
                                       SloConfig, make_scheduler)
from mooncake_proxy.scheduling.admission import REJECTION_MODES, split_rejection

from .trace import TRACE_BLOCK_SIZE, TraceRecord

__all__ = ["SimConfig", "RequestOutcome", "SimResult", "Simulator", "simulate"]


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Cluster shape and knobs of one simulation run."""

    policy: str = "conductor"
    prefill: int = 8
    decode: int = 8
    cache_blocks: int = 0              # per prefill instance; 0 = unlimited
    store_blocks: int | None = None    # global store tier; None = none, 0 = unlimited
    speed: float = 1.0                 # arrival-time compression (2 = twice as fast)
    slo: SloConfig = field(default_factory=SloConfig)
    seed: int = 0
    replicate_hot: bool = False
    block_size: int = TRACE_BLOCK_SIZE
    #: where requests breaking the SLOs are rejected (the rows of the paper's Table 3):
    #: "early" -- on arrival only (the scheduler's checks); "decode" -- the paper's baseline: no
    #: TBT check on arrival, a request whose decode instance would break ``slo.tbt_s`` when its
    #: prefill ends is rejected there (its prefill wasted); "early+decode" -- both.
    rejection: str = "early"

    def __post_init__(self) -> None:
        if self.prefill < 1 or self.decode < 1:
            raise ValueError(f"need at least 1 prefill and 1 decode instance, got {self.prefill}P/{self.decode}D")
        if not self.speed > 0:
            raise ValueError(f"speed must be > 0, got {self.speed}")
        if self.cache_blocks < 0:
            raise ValueError(f"cache_blocks must be >= 0 (0 = unlimited), got {self.cache_blocks}")
        if self.rejection not in REJECTION_MODES:
            raise ValueError(f"rejection must be one of {REJECTION_MODES}, got {self.rejection!r}")


@dataclass(slots=True)
class RequestOutcome:
    """What happened to one trace request (times in simulated seconds)."""

    index: int
    arrival: float
    input_length: int
    output_length: int
    rejected: bool = False
    reason: str = ""
    prefill_id: str = ""
    decode_id: str = ""
    cached_tokens: int = 0
    remote_blocks: int = 0
    est_ttft: float = math.nan
    ttft: float = math.nan
    tbt: float = math.nan
    finish: float = math.nan


@dataclass(slots=True)
class SimResult:
    config: SimConfig
    outcomes: list[RequestOutcome]
    sim_time: float            # simulated seconds until the last event
    wall_time: float = 0.0     # real seconds the simulation took


class _DecodeInstance:
    """Fluid model of continuous batching on one decode instance (see module docstring).

    ``v`` counts tokens generated per running request since the instance started; a request
    joining at ``v0`` with ``k`` tokens to generate finishes when ``v`` reaches ``v0 + k``.
    KV in use = Σ prompt + n·v − Σ v0 (every running request holds its prompt plus what it
    generated), maintained in O(1)."""

    __slots__ = ("iid", "v", "last", "step", "heap", "info", "sum_prompt", "sum_v0", "version")

    def __init__(self, iid: str) -> None:
        self.iid = iid
        self.v = 0.0
        self.last = 0.0
        self.step = 0.0
        self.heap: list[tuple[float, int]] = []
        self.info: dict[int, tuple[float, float, int, RequestInfo]] = {}
        self.sum_prompt = 0
        self.sum_v0 = 0.0
        self.version = 0

    def advance(self, now: float) -> None:
        if self.info and self.step > 0:
            self.v += (now - self.last) / self.step
        self.last = now

    def kv(self) -> float:
        return self.sum_prompt + len(self.info) * self.v - self.sum_v0


class Simulator:
    """One run of one policy over a trace. ``progress(n_done)`` is called every ~1000 arrivals."""

    def __init__(self, config: SimConfig, cost: CostModel | None = None) -> None:
        self.config = config
        self.cost = cost if cost is not None else CostModel.default()
        c = config
        self.cluster = ClusterState(block_size=c.block_size, store_capacity_blocks=c.store_blocks)
        self.prefill_ids = [f"p{i}" for i in range(c.prefill)]
        self.decode_ids = [f"d{i}" for i in range(c.decode)]
        for p in self.prefill_ids:
            self.cluster.add_instance(InstanceInfo(p, "prefill", cache_capacity_blocks=c.cache_blocks))
        for d in self.decode_ids:
            self.cluster.add_instance(InstanceInfo(d, "decode"))
        slo, self.decode_tbt_limit = split_rejection(c.slo, c.rejection)
        self.scheduler = (make_scheduler(c.policy, self.cluster, self.cost, slo, c.seed, replicate_hot=True)
                          if c.replicate_hot else make_scheduler(c.policy, self.cluster, self.cost, slo, c.seed))

    def run(self, records: Sequence[TraceRecord], progress: Callable[[int], None] | None = None) -> SimResult:
        import time as _time

        t_wall = _time.perf_counter()
        c = self.config
        cost = self.cost
        cluster = self.cluster
        sched = self.scheduler
        bs = c.block_size
        seq = itertools.count()
        heap: list[tuple[float, int, int, object]] = []
        push = heapq.heappush
        PREFILL_DONE, DECODE_START, DECODE_CHECK = 0, 1, 2

        outcomes: list[RequestOutcome] = []
        reqs: list[RequestInfo] = []
        queues: dict[str, list[tuple[int, float]]] = {p: [] for p in self.prefill_ids}  # FIFO (idx, duration)
        qpos: dict[str, int] = {p: 0 for p in self.prefill_ids}
        busy: dict[str, bool] = {p: False for p in self.prefill_ids}
        decs = {d: _DecodeInstance(d) for d in self.decode_ids}
        now = 0.0

        def start_next_prefill(pid: str, t: float) -> None:
            q = queues[pid]
            i = qpos[pid]
            if i < len(q):
                idx, dur = q[i]
                qpos[pid] = i + 1
                if qpos[pid] > 1024:  # compact the consumed head occasionally
                    del q[: qpos[pid]]
                    qpos[pid] = 0
                busy[pid] = True
                push(heap, (t + dur, next(seq), PREFILL_DONE, (pid, idx)))
            else:
                busy[pid] = False

        def reschedule_decode(di: _DecodeInstance) -> None:
            di.version += 1
            if not di.info:
                di.step = 0.0
                return
            di.step = cost.decode_step_time(len(di.info), int(di.kv()))
            fin_v = di.heap[0][0]
            dt = max(0.0, (fin_v - di.v) * di.step)
            push(heap, (di.last + dt, next(seq), DECODE_CHECK, (di.iid, di.version)))

        def finish_request(idx: int, t: float) -> None:
            outcomes[idx].finish = t

        def handle(ev_time: float, kind: int, payload) -> None:
            if kind == PREFILL_DONE:
                pid, idx = payload
                o = outcomes[idx]
                req = reqs[idx]
                cluster.on_prefill_done(pid, req, ev_time)
                if store_on:
                    cluster.store_record(req.block_hashes)  # prefill KV lands in the shared pool
                o.ttft = ev_time - o.arrival
                start_next_prefill(pid, ev_time)
                if o.output_length <= 1:
                    finish_request(idx, ev_time)
                    return
                nblocks = -(-o.input_length // bs)
                push(heap, (ev_time + cost.transfer_time(nblocks), next(seq), DECODE_START, idx))
            elif kind == DECODE_START:
                idx = payload
                o = outcomes[idx]
                req = reqs[idx]
                di = decs[o.decode_id]
                di.advance(ev_time)
                if tbt_limit is not None and cost.decode_step_time(
                        len(di.info) + 1, int(di.kv()) + o.input_length) > tbt_limit:
                    o.rejected = True  # decode-stage rejection (baseline): the prefill was wasted
                    o.reason = "tbt_at_decode"
                    cluster.on_decode_done(o.decode_id, req, ev_time)
                    return
                cluster.on_decode_start(o.decode_id, req, ev_time)
                k = o.output_length - 1
                di.info[idx] = (di.v, ev_time, o.input_length, req)
                di.sum_prompt += o.input_length
                di.sum_v0 += di.v
                heapq.heappush(di.heap, (di.v + k, idx))
                reschedule_decode(di)
            else:
                iid, version = payload
                di = decs[iid]
                if version != di.version:
                    return  # superseded by a later join/leave
                di.advance(ev_time)
                eps = 1e-6
                while di.heap and di.heap[0][0] <= di.v + eps:
                    _, idx = heapq.heappop(di.heap)
                    v0, t0, prompt, req = di.info.pop(idx)
                    di.sum_prompt -= prompt
                    di.sum_v0 -= v0
                    o = outcomes[idx]
                    o.tbt = (ev_time - t0) / (o.output_length - 1)
                    cluster.on_decode_done(iid, req, ev_time)
                    finish_request(idx, ev_time)
                if not di.info:
                    di.v = 0.0
                    di.sum_v0 = 0.0
                reschedule_decode(di)

        speed = c.speed
        store_on = cluster.store_enabled
        tbt_limit = self.decode_tbt_limit
        for n, rec in enumerate(records):
            arrival = rec.timestamp / 1000.0 / speed
            while heap and heap[0][0] <= arrival:
                t, _, kind, payload = heapq.heappop(heap)
                now = t
                handle(t, kind, payload)
            now = arrival
            req = RequestInfo(str(n), rec.input_length, rec.hash_ids, rec.output_length, arrival)
            o = RequestOutcome(n, arrival, rec.input_length, rec.output_length)
            outcomes.append(o)
            reqs.append(req)
            out = sched.schedule(req, arrival)
            if isinstance(out, Rejection):
                o.rejected = True
                o.reason = out.reason
                o.est_ttft = out.est_ttft_s if out.est_ttft_s is not None else math.nan
            else:
                self._admit(out, req, o, arrival, queues, busy, start_next_prefill)
            if progress is not None and n % 1000 == 999:
                progress(n + 1)
        while heap:
            t, _, kind, payload = heapq.heappop(heap)
            now = t
            handle(t, kind, payload)
        if progress is not None:
            progress(len(records))
        return SimResult(c, outcomes, now, _time.perf_counter() - t_wall)

    def _admit(self, d: Decision, req: RequestInfo, o: RequestOutcome, now: float, queues, busy,
               start_next_prefill) -> None:
        cost = self.cost
        self.cluster.on_scheduled(d, req, now)
        new, cached = self.scheduler.split_prompt(req, d.cached_blocks)
        o.prefill_id, o.decode_id = d.prefill_id, d.decode_id
        o.cached_tokens = cached
        o.remote_blocks = d.remote_blocks
        o.est_ttft = d.est_ttft_s
        dur = cost.transfer_time(d.remote_blocks) + cost.prefill_time(new, cached)
        queues[d.prefill_id].append((int(req.request_id), dur))
        if not busy[d.prefill_id]:
            start_next_prefill(d.prefill_id, now)


def simulate(records: Sequence[TraceRecord], config: SimConfig, cost: CostModel | None = None,
             progress: Callable[[int], None] | None = None) -> SimResult:
    """Run one simulation (convenience wrapper)."""
    return Simulator(config, cost).run(records, progress)
