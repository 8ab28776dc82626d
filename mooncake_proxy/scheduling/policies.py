"""Scheduling policies: pick a (prefill, decode) pair for a request, or reject it early.

All policies share the estimation code (queue time, prefill time of the uncached tokens,
transfer of fetched blocks, predicted decode TBT) and the SLO checks; they differ only in how
they choose:

* ``random`` / ``round_robin`` — baselines; the chosen prefill still reuses whatever prefix
  it happens to hold locally (engines cache prefixes whatever the router does).
* ``load_balance`` — least predicted prefill queue time; decode with the lowest predicted TBT.
* ``cache_aware`` — the paper's *local* cache-aware scheduler: minimise
  queue + prefill(tokens not held by THAT instance).
* ``conductor`` — the paper's global KVCache-centric scheduler: for every prefill instance,
  TTFT = queue + prefill(uncached) [+ transfer of the prefix blocks it lacks but another
  instance or the store holds, when fetching them beats recomputing], pick the minimum. A busy
  instance holding a hot prefix is thus bypassed and the prefix copied elsewhere (the paper's
  KVCache balancing); with ``replicate_hot=True`` hot prefixes are also pushed to the store.

``schedule()`` is pure with respect to the cluster: it reads ``ClusterState`` and never
changes load or the index (the caller does, with ``on_scheduled`` / ``on_prefill_start``...);
only round-robin cursors, the random generator and hotness counters advance.
"""

from __future__ import annotations

import abc
import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Iterable, Iterator, Mapping, Sequence

from .batched_queue import finish_offsets
from .cluster import STORE, ClusterState, DecodeLoad, PrefillEntry, kv_footprint
from .contention import HardwareGroups, RecentBusy, expected_busy_neighbours
from .cost import CostModel
from .datatypes import Decision, InstanceInfo, Rejection, RequestInfo, SloConfig
from .latency import LatencyBoard, LatencyModel, SchedulerSettings

__all__ = ["BUILTIN_SCHEDULERS", "POLICIES", "Scheduler", "RandomScheduler",
           "RoundRobinScheduler", "LoadBalanceScheduler", "CacheAwareScheduler", "ConductorScheduler"]


@dataclass(slots=True)
class PrefillPlan:
    """A policy's choice of prefill instance with its TTFT estimate."""

    instance_id: str
    est_ttft_s: float
    est_queue_s: float
    cached_blocks: int
    remote_source: str | None = None
    remote_blocks: int = 0


class Scheduler(abc.ABC):
    """Base class: estimation helpers, decode choice and SLO checks. Subclasses implement
    :meth:`choose_prefill` (and may override :meth:`choose_decode`)."""

    policy: ClassVar[str] = ""
    #: with a TTFT SLO, pick the prefill by the predicted first token (hand-off and the pair's
    #: known error included, :meth:`_soonest_first_token`) instead of :meth:`choose_prefill`'s
    #: estimate alone -- for policies whose objective is the TTFT (the conductor)
    ranks_by_first_token: ClassVar[bool] = False
    #: keyword options ``make_scheduler`` may pass on (``--policy-opt`` style); none by default
    options: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cluster: ClusterState, cost: CostModel | None = None,
                 slo: SloConfig | None = None, seed: int = 0, *, settings: SchedulerSettings | None = None,
                 latency: LatencyBoard | None = None) -> None:
        """``latency``: where the latency model is published (the live proxy's calibration loop);
        None: a board of its own holding ``cost`` (the profile, or the default one)."""
        self.cluster = cluster
        self.latency = latency if latency is not None else LatencyBoard(
            LatencyModel(cost if cost is not None else CostModel.default()))
        self.settings = settings if settings is not None else SchedulerSettings()
        #: each prefill's share of the last seconds it was busy (contention.RecentBusy), read by
        #: :meth:`decode_contention` and :meth:`prefill_contention` with a prediction horizon; advanced
        #: by :meth:`schedule` while a contention slope or interference is known. None (the default):
        #: only the prefills busy now count
        self.recent_busy: RecentBusy | None = (RecentBusy(tau_s=self.settings.recent_busy_tau)
                                               if self.settings.recent_busy_tau > 0 else None)
        self.slo = slo if slo is not None else SloConfig()
        self.rng = random.Random(seed)
        self._rot = 0   # rotating tie-break / round-robin cursor for prefill
        self._rot_d = 0  # same for decode

    # ------------------------------------------------------------------ what it is built from (read-only)
    @property
    def cost(self) -> CostModel:
        """The shared cost model (instances without their own, ``instance_costs``)."""
        return self.latency.model.cost

    @property
    def instance_costs(self) -> Mapping[str, CostModel]:
        return self.latency.model.instance_costs

    @property
    def contention_slope(self) -> float:
        return self.latency.model.contention_slope

    @property
    def interference(self) -> Mapping[str, Mapping[str, float]]:
        return self.latency.model.interference

    @property
    def prefill_interference(self) -> Mapping[str, Mapping[str, float]]:
        return self.latency.model.prefill_interference

    @property
    def hardware_groups(self) -> HardwareGroups:
        return self.settings.hardware_groups

    @property
    def prefill_batch_tokens(self) -> int:
        return self.settings.prefill_batch_tokens

    @property
    def queue_margin(self) -> float:
        return self.settings.queue_margin

    # ------------------------------------------------------------------ entry point
    def schedule(self, req: RequestInfo, now: float) -> Decision | Rejection:
        """Choose where ``req`` runs at time ``now``, or reject it early (see module doc)."""
        cl = self.cluster
        retry = self.slo.retry_after_s
        if self.recent_busy is not None and (self.interference or self.prefill_interference
                                             or self.contention_slope > 0 or self.hardware_groups):
            self.recent_busy.update(now, cl.busy_times(now))
        prefills = cl.healthy_instances("prefill")
        if not prefills:
            n = len(cl.instances("prefill"))
            return Rejection(f"no healthy prefill instance ({n} registered, all unhealthy)" if n
                             else "no prefill instance registered", retry)
        decodes = cl.healthy_instances("decode")
        if not decodes:
            n = len(cl.instances("decode"))
            return Rejection(f"no healthy decode instance ({n} registered, all unhealthy)" if n
                             else "no decode instance registered", retry)
        plan = self.choose_prefill(req, prefills, now)
        dchoice = self.choose_decode(req, decodes, now, plan.est_ttft_s)
        if dchoice is None:
            return Rejection(f"request {req.request_id!r}: no decode instance has KV room for "
                             f"{req.prompt_tokens}+{req.max_output_tokens} tokens", retry, plan.est_ttft_s)
        decode_id, tbt = dchoice
        slo = self.slo
        first = -1.0
        if slo.ttft_s is not None:
            if self.ranks_by_first_token and len(prefills) > 1:
                plan, decode_id, tbt = self._soonest_first_token(req, prefills, decodes, plan, decode_id, tbt, now)
            first, margin = self._first_token(plan, decode_id, now)
            if first + margin > slo.ttft_s:
                alt = self._other_prefill_within(req, prefills, decodes, plan, now, slo.ttft_s)
                if alt is None:
                    ttft = first + margin
                    slow = self.prefill_slowdown(plan.instance_id, now)
                    handoff = first - self._prefill_done_in(plan, now)
                    return Rejection(
                        f"TTFT SLO: predicted {ttft:.3f}s > {slo.ttft_s:.3f}s on prefill "
                        f"{plan.instance_id!r} (queue {plan.est_queue_s:.3f}s"
                        + (f", its running request at {slow:.1f}x its estimate" if slow > 1 else "")
                        + (f", then {handoff:.3f}s to decode {decode_id!r}'s first token" if handoff > 0 else "")
                        + (f", margin {margin:.3f}s from its recent errors" if margin > 0 else "")
                        + (f"; none of the other {len(prefills) - 1} prefill instance(s) does better)"
                           if len(prefills) > 1 else ")"),
                        retry, ttft, tbt)
                plan, decode_id, tbt, first = alt
            if (harmed := self._harm(plan, req, now)) is not None:
                alt = self._other_prefill_within(req, prefills, decodes, plan, now, slo.ttft_s)
                if alt is None:
                    return Rejection(f"TTFT SLO: {harmed}; none of the other {len(prefills) - 1} prefill "
                                     f"instance(s) does better", retry, plan.est_ttft_s, tbt)
                plan, decode_id, tbt, first = alt
        if slo.tbt_s is not None and tbt > slo.tbt_s:
            return Rejection(
                f"TBT SLO: predicted {tbt * 1000:.1f}ms > {slo.tbt_s * 1000:.1f}ms on decode "
                f"{decode_id!r}", retry, plan.est_ttft_s, tbt)
        if slo.tbt_s is not None and (harm := self.tbt_harm(plan.instance_id, decode_id)) > slo.tbt_s:
            # its prefill would slow the requests decoding there past the SLO (contention.Interference)
            alt = self._harmless_elsewhere(req, prefills, decodes, plan, now)
            if alt is None:
                return Rejection(
                    f"TBT SLO: a prefill on {plan.instance_id!r} would slow decode {decode_id!r}'s "
                    f"{self.cluster.decode_load(decode_id).running} running request(s) to "
                    f"{harm * 1000:.1f}ms > {slo.tbt_s * 1000:.1f}ms, and no other prefill instance does better",
                    retry, plan.est_ttft_s, tbt)
            plan, decode_id, tbt, first = alt
        return Decision(plan.instance_id, decode_id, plan.est_ttft_s, tbt, plan.cached_blocks,
                        plan.remote_source, plan.remote_blocks, plan.est_queue_s,
                        self.replicate_blocks(req, plan), first, self.waits_behind(plan))

    def _harm(self, plan: PrefillPlan, req: RequestInfo, now: float) -> str | None:
        """Why admitting ``req`` as ``plan`` would push a request already queued past the TTFT SLO
        (:meth:`queue_harm`: one on the same instance; :meth:`pair_harm`: one on an instance sharing
        its hardware), or None when it would not."""
        limit = self.slo.ttft_s
        if (q := self.queue_harm(plan, req, now)) is not None:
            return (f"on prefill {plan.instance_id!r} it would share the last forward step of request {q[0]!r} "
                    f"queued there and delay that request's first token to {q[1]:.3f}s > {limit:.3f}s (the "
                    f"engine batches its queue in steps of {self.prefill_batch_tokens} tokens)")
        if (p := self.pair_harm(plan, now)) is not None:
            return (f"prefill {plan.instance_id!r} shares hardware with {p[0]!r}, and computing this request "
                    f"there would slow request {p[1]!r} queued on {p[0]!r} to {p[2]:.3f}s > {limit:.3f}s")
        return None

    def _first_token(self, plan: PrefillPlan, decode_id: str, now: float, *, fade: bool = True) -> tuple[float, float]:
        """(predicted TTFT of ``plan`` handed off to ``decode_id``, the pair's safety margin -- the
        queued class's, or :attr:`queue_margin` times the predicted wait, if larger, when ``plan``
        waits behind others; ``fade=False``: the margin without the fade of old errors)."""
        cl = self.cluster
        behind = self.waits_behind(plan)
        margin = cl.ttft_margin(plan.instance_id, decode_id, now, fade=fade, queued=behind)
        if behind and self.queue_margin > 0:
            margin = max(margin, self.queue_margin * plan.est_queue_s)
        return cl.first_token_in(decode_id, now, self._prefill_done_in(plan, now), plan.instance_id), margin

    def waits_behind(self, plan: PrefillPlan) -> bool:
        """Whether ``plan``'s request would wait behind others on its prefill (a head running past its
        estimate included), the class whose TTFT errors ttft_error.py also learns apart."""
        return plan.est_queue_s > 0 or bool(self.cluster.prefill_load(plan.instance_id).entries)

    def _prefill_done_in(self, plan: PrefillPlan, now: float) -> float:
        """Seconds until ``plan``'s prefill is done as the TTFT check sees it: everything runs at the
        contention the other prefill instances' queues predict (:meth:`prefill_contention`), or at
        the head's slowdown where that is worse, and a head late even for the contention needs its
        lateness again."""
        iid = plan.instance_id
        m = self.prefill_contention(iid, now, plan.est_ttft_s)
        return self.prefill_lateness(iid, now, m) + max(m, self.prefill_slowdown(iid, now)) * plan.est_ttft_s

    def prefill_contention(self, instance_id: str, now: float, est_s: float,
                           busy_as: tuple[str, float] | None = None) -> float:
        """The multiplier of an estimate of ``est_s`` seconds (queue + prefill) on ``instance_id``
        from the other prefill instances busy meanwhile: exp(slope * their expected number), each
        counted for the share of ``est_s`` its own queue lasts (contention.py) -- with a prediction
        horizon and :attr:`recent_busy`, at least for its recent busy share. Each neighbour counts
        with the slope and, where :attr:`prefill_interference` knows the pair, with its own
        coefficient. 1.0 without either.

        An instance in a declared hardware group (:attr:`hardware_groups`) is multiplied instead by
        processor sharing: (1 + each busy mate's share of ``est_s``) ** the group's exponent
        (HardwareGroups.multiplier, 1 until learned; a streaming decode mate counts whole). ``busy_as``:
        (instance, seconds) -- count that instance as busy for that long (what :meth:`pair_harm`
        asks: the contention once a request is admitted there).

        Why: where instances share cores, a burst makes all of them busy at once and each runs
        slower than its factor, learned at the calmer load before, says -- before any head is late."""
        if instance_id in self.hardware_groups:
            return self._shared_hardware(instance_id, now, est_s, busy_as)
        slope = self.contention_slope
        coef = self.prefill_interference.get(instance_id) or {}
        if slope <= 0 and not coef:
            return 1.0
        others = [j for j in self.cluster.prefill_ids() if j != instance_id]
        busy = [self.queue_time(j, now) + self.prefill_lateness(j, now) for j in others]
        recent = self.recent_busy if self.slo.prediction_horizon_s is not None else None
        # projected (the paper's prediction-based rejection): a neighbour busy most of the recent past
        # is expected busy during the request too, though its queue now is short (a burst arrives
        # one request at a time, so at each admission the others' queues hold only what came before)
        cl = self.cluster
        return math.exp(sum((slope + coef.get(j, 0.0)) * max(expected_busy_neighbours(est_s, [b]),
                                                             recent.share(j) if recent is not None else 0.0)
                            for j, b in zip(others, busy))
                        # a decode streaming now (its steps share the hardware) is taken to go on meanwhile
                        + sum(c for d, c in coef.items() if d in cl and d not in cl.prefill_ids()
                              and cl.is_decode_busy(d)))

    def _shared_hardware(self, instance_id: str, now: float, est_s: float,
                         busy_as: tuple[str, float] | None) -> float:
        """:meth:`prefill_contention` of an instance in a declared hardware group: processor sharing
        with its mates (contention.HardwareGroups), each prefill mate counted for the share of
        ``est_s`` its queue lasts -- with a prediction horizon and :attr:`recent_busy`, at least its
        recent busy share -- and each decode mate streaming now whole."""
        cl = self.cluster
        prefill_ids = set(cl.prefill_ids())
        recent = self.recent_busy if self.slo.prediction_horizon_s is not None else None
        groups = self.hardware_groups
        m = 1.0
        for j in groups.mates(instance_id):
            if j in prefill_ids:
                b = (busy_as[1] if busy_as is not None and busy_as[0] == j
                     else self.queue_time(j, now) + self.prefill_lateness(j, now))
                m += max(expected_busy_neighbours(est_s, [b]), recent.share(j) if recent is not None else 0.0)
            elif j in cl and cl.is_decode_busy(j):
                m += 1.0
        return groups.multiplier(instance_id, m - 1.0)

    def decode_contention(self, decode_id: str, also_busy: str | None = None) -> float:
        """The multiplier of decode ``decode_id``'s step estimate from the prefill instances that will
        compute while its streams run: exp(sum of their interference coefficients x their share of the
        time; 1.0 without any). A prefill busy now, or ``also_busy`` (one about to be), counts whole. With
        a prediction horizon (the paper's prediction-based rejection, which projects the decode's load to
        when the request joins it) and :attr:`recent_busy`, an idle one counts for the share of the last
        seconds it was busy: a stream lasts its tokens' steps, and a prefill busy most of the recent
        past will likely compute during them. Without one, only the prefills busy now (the current load).
        Where a decode shares cores with some prefills, its steps slow down while they compute."""
        coef = self.interference.get(decode_id)
        if not coef:
            return 1.0
        cl = self.cluster
        recent = self.recent_busy if self.slo.prediction_horizon_s is not None else None
        return math.exp(sum(c * (1.0 if p == also_busy or cl.is_prefill_busy(p)
                                 else recent.share(p) if recent is not None else 0.0)
                            for p, c in coef.items()))

    def tbt_harm(self, prefill_id: str, decode_id: str) -> float:
        """The step time of decode ``decode_id``'s running requests while a prefill runs on
        ``prefill_id`` (0.0 when nothing decodes there, or no interference is known): what placing a
        request's prefill there costs the requests already decoding."""
        load = self.cluster.decode_load(decode_id)
        if not load.running or not self.interference.get(decode_id):
            return 0.0
        return (self.cost_for(decode_id).decode_step_time(load.running, load.kv_tokens)
                * self.decode_contention(decode_id, also_busy=prefill_id))

    def _harmless_elsewhere(self, req: RequestInfo, prefills: Sequence[InstanceInfo],
                            decodes: Sequence[InstanceInfo], failed: PrefillPlan, now: float,
                            ) -> tuple[PrefillPlan, str, float, float] | None:
        """The policy's plan on another prefill instance whose prefill keeps the running decodes
        within the TBT SLO (and the request within the TTFT SLO, if set): the one predicted soonest,
        as (plan, decode, its TBT, its first token), or None."""
        slo = self.slo
        assert slo.tbt_s is not None
        best: tuple[float, tuple[PrefillPlan, str, float, float]] | None = None
        for plan, d, tbt in self._plans_elsewhere(req, prefills, decodes, failed.instance_id, now):
            if tbt > slo.tbt_s or self.tbt_harm(plan.instance_id, d) > slo.tbt_s:
                continue
            first, margin = self._first_token(plan, d, now)
            if slo.ttft_s is not None and (first + margin > slo.ttft_s or self._harm(plan, req, now)):
                continue
            if best is None or first + margin < best[0]:
                best = (first + margin, (plan, d, tbt, first))
        return best[1] if best is not None else None

    def _soonest_first_token(self, req: RequestInfo, prefills: Sequence[InstanceInfo],
                             decodes: Sequence[InstanceInfo], plan: PrefillPlan, decode_id: str, tbt: float,
                             now: float) -> tuple[PrefillPlan, str, float]:
        """The policy's plan on each prefill instance, ranked by predicted first token plus the
        pair's *unfaded* error margin; ``plan`` (the policy's own choice) wins ties.

        Why: :meth:`choose_prefill` ranks by queue + prefill, which cannot see that one pair's
        hand-off is slow. On the live bench the decode shares a core with one prefill, whose
        requests got their first token ~1 s late half the time; the check's margin rejected that
        pair only until the margin faded, then the rotation sent it every other request again (2-5
        misses a run, most of the misses left). Ranked by what the pair is known to cost, it gets a
        request only when the other pair would be as late -- and the faded margin still lets the
        check fall back to it (:meth:`_other_prefill_within`) when the preferred one would miss."""
        best = (sum(self._first_token(plan, decode_id, now, fade=False)), plan, decode_id, tbt)
        for p, d, t in self._plans_elsewhere(req, prefills, decodes, plan.instance_id, now):
            sc = sum(self._first_token(p, d, now, fade=False))
            if sc < best[0]:
                best = (sc, p, d, t)
        return best[1], best[2], best[3]

    def _plans_elsewhere(self, req: RequestInfo, prefills: Sequence[InstanceInfo], decodes: Sequence[InstanceInfo],
                         skip_id: str, now: float) -> Iterator[tuple[PrefillPlan, str, float]]:
        """The policy's own plan on each prefill instance but ``skip_id``, with its decode and TBT
        (instances whose request no decode has room for are left out)."""
        for inst in prefills:
            if inst.instance_id == skip_id:
                continue
            plan = self.choose_prefill(req, [inst], now)
            dchoice = self.choose_decode(req, decodes, now, plan.est_ttft_s)
            if dchoice is not None:
                yield plan, dchoice[0], dchoice[1]

    def queue_harm(self, plan: PrefillPlan, req: RequestInfo, now: float) -> tuple[str, float] | None:
        """A request queued on ``plan``'s prefill instance that admitting ``req`` there would push past
        the TTFT SLO, as (its id, its predicted TTFT then) -- the first in queue order; None when none
        would be, or without a TTFT SLO or ``prefill_batch_tokens``.

        Why: engines batch their queue (batched_queue.py), so ``req`` is computed in the last step of
        every queued request whose last step has room, and those are answered only when it is. A
        request already predicted past the SLO does not count (it is not harmed by the admission,
        and holding it against every later request would turn one late request into 429s)."""
        budget, limit = self.prefill_batch_tokens, self.slo.ttft_s
        iid = plan.instance_id
        load = self.cluster.prefill_load(iid)
        if budget <= 0 or limit is None or not load.entries:
            return None
        self.queue_time(iid, now)  # fills in the entries' estimates
        entries = list(load.entries.values())
        tokens = [e.new_tokens for e in entries]
        times = [e.est_s for e in entries]
        new, _ = self.split_prompt(req, plan.cached_blocks)
        before = finish_offsets(tokens, times, budget)
        after = finish_offsets([*tokens, new], [*times, max(0.0, plan.est_ttft_s - plan.est_queue_s)], budget)
        if not any(a > b for a, b in zip(after, before)):
            return None
        # the same speed as the new request's own check (_prefill_done_in)
        m = max(self.prefill_contention(iid, now, plan.est_ttft_s), self.prefill_slowdown(iid, now))
        late = self.prefill_lateness(iid, now, m)
        elapsed = self.head_done(iid, now)
        for e, b, a in zip(entries, before, after):
            if a > b and (self._queued_ttft(iid, e, late + m * max(0.0, b - elapsed), now) <= limit
                          < (late_ttft := self._queued_ttft(iid, e, late + m * max(0.0, a - elapsed), now))):
                return e.request_id, late_ttft
        return None

    def _queued_ttft(self, iid: str, e: PrefillEntry, done_in: float, now: float) -> float:
        """The TTFT of request ``e`` queued on prefill ``iid`` if its prefill is done in ``done_in``
        seconds: its wait so far, the hand-off to its decode and that pair's margin."""
        if e.decode_id is None:
            return now - e.enqueued_at + done_in
        cl = self.cluster
        return (now - e.enqueued_at + cl.first_token_in(e.decode_id, now, done_in, iid)
                + cl.ttft_margin(iid, e.decode_id, now))

    def pair_harm(self, plan: PrefillPlan, now: float) -> tuple[str, str, float] | None:
        """A request queued on another prefill instance that shares hardware with ``plan``'s (a
        positive :attr:`prefill_interference` coefficient, or a mate in a declared hardware group) and
        that admitting ``plan`` would push past the TTFT SLO, as (its instance, its id, its predicted
        TTFT then); None when none would be, or without a TTFT SLO or either.

        Why: the new request keeps its instance busy until it is done (its queue, then itself), and
        for that time it slows the instances sharing its hardware. Each request queued there was
        admitted for the contention it expected then; a burst that fills the neighbour afterwards
        slows it past the SLO (run m2 in BENCHMARKS.md: four requests on prefill 2 estimated at
        0.6-1.1 s took 2.1-4.2 s while prefill 0, on the same core, took six more). Each entry's time
        left is scaled by exp(coefficient x the added share of it the new request's instance is busy),
        or, for a declared mate, by the processor sharing with the new request's instance busy for longer."""
        limit = self.slo.ttft_s
        j = plan.instance_id
        grouped = j in self.hardware_groups
        if limit is None or not (self.prefill_interference or grouped):
            return None
        late_j = self.prefill_lateness(j, now)
        busy_before = self.queue_time(j, now) + late_j
        busy_after = late_j + plan.est_ttft_s
        prefill_ids = set(self.cluster.prefill_ids())
        # the instances it slows: its declared mates (processor sharing, c None), else the learned pairs
        slowed: list[tuple[str, float | None]] = (
            [(q, None) for q in sorted(self.hardware_groups.mates(j))] if grouped
            else [(iid, coefs.get(j, 0.0)) for iid, coefs in self.prefill_interference.items()])
        for iid, c in slowed:
            load = (self.cluster.prefill_load(iid) if iid != j and (c is None or c > 0) and iid in prefill_ids
                    else None)
            if load is None or not load.entries:
                continue
            self.queue_time(iid, now)  # fills in the entries' estimates
            slow = self.prefill_slowdown(iid, now)
            elapsed = self.head_done(iid, now)
            offset = 0.0
            for e in load.entries.values():
                offset += max(0.0, e.est_s)
                left = max(0.0, offset - elapsed)  # its estimated time left, uncontended
                if left <= 0:
                    continue
                m = max(self.prefill_contention(iid, now, left), slow)
                late = self.prefill_lateness(iid, now, m)
                if c is None:
                    m_after = max(self.prefill_contention(iid, now, left, (j, busy_after)), slow)
                else:
                    added = min(1.0, busy_after / left) - min(1.0, busy_before / left)
                    m_after = m * math.exp(c * added) if added > 0 else m
                if m_after <= m:
                    continue
                if (self._queued_ttft(iid, e, late + m * left, now) <= limit
                        < (late_ttft := self._queued_ttft(iid, e, late + m_after * left, now))):
                    return iid, e.request_id, late_ttft
        return None

    def prefill_lateness(self, instance_id: str, now: float, factor: float = 1.0) -> float:
        """How far the head of the prefill instance's queue is past ``factor`` x its estimate (0 if
        not late). The TTFT check expects it to need that long again: :meth:`queue_time` counts a
        late head as done, so a stalled engine -- seen for 35 s on the live bench -- would look idle."""
        head, _ = self._head(instance_id)
        if head is None or head.est_s < 0:
            return 0.0
        if instance_id in self.hardware_groups:  # head_done has the contention so far taken out
            factor = 1.0
        return max(0.0, self.head_done(instance_id, now) - factor * head.est_s)

    def _head(self, instance_id: str) -> tuple[PrefillEntry | None, float]:
        """The prefill instance's running request (None when idle) and when it started."""
        load = self.cluster.prefill_load(instance_id)
        return (next(iter(load.entries.values())) if load.entries else None), load.head_since

    def prefill_slowdown(self, instance_id: str, now: float) -> float:
        """How many times slower than estimated the prefill instance runs, at least: the head's
        time so far over its estimate (1.0 when the head is not late, or nothing runs). The TTFT
        check multiplies the queue behind the head and the new request's own prefill by it.

        Why: a late head is a censored sample of the instance's speed -- it has not answered, so
        the calibrator (calibration.py) has not learned from it, but it already took ``ratio``
        times its estimate. Under a burst on the live bench (4 prefills on 2 cores, 40 requests in
        3 s) each instance ran 2-8x its idle profile, the whole window arrived before the first
        prefill answered, and with only :meth:`prefill_lateness` added once the check admitted
        every request on estimates 2-8x too low. The ratio grows with every second the head runs,
        so the check tightens while the burst arrives instead of after it. Entries with an estimate
        under 1 ms give no ratio (their estimate is noise)."""
        head, _ = self._head(instance_id)
        if head is None or head.est_s < 1e-3:
            return 1.0
        return max(1.0, self.head_done(instance_id, now) / head.est_s)

    def head_done(self, instance_id: str, now: float) -> float:
        """How many seconds of its estimate the prefill instance's head has done: the time since it
        started, or, in a declared hardware group (with ``ClusterState.track_head_busy``), that time
        divided by the processor sharing it ran under (HardwareGroups.multiplier of its mates' busy
        shares since it started).

        Why: a queue's wait is the head's estimate less what it has done. Counting every second as a
        second of work says a head that has shared its core with three mates for 1 s is 1 s along,
        when it is 0.25 s along: the queue behind it looked 0.75 s shorter, and under a burst the
        check admitted work the core could not do in the SLO (run g1 in BENCHMARKS.md)."""
        load = self.cluster.prefill_load(instance_id)
        elapsed = now - load.head_since
        mates = self.hardware_groups.mates(instance_id)
        if not mates or load.head_busy is None or elapsed <= 0 or not load.entries:
            return max(0.0, elapsed)
        cl = self.cluster
        busy = {**cl.busy_times(now), **cl.decode_busy_times(now)}
        since = load.head_busy
        # an instance never busy before the head started is absent from the snapshot: 0 s then
        share = sum(min(1.0, max(0.0, (busy[j] - since.get(j, 0.0)) / elapsed)) for j in mates if j in busy)
        return elapsed / self.hardware_groups.multiplier(instance_id, share)

    def _other_prefill_within(self, req: RequestInfo, prefills: Sequence[InstanceInfo],
                              decodes: Sequence[InstanceInfo], failed: PrefillPlan, now: float,
                              limit_s: float) -> tuple[PrefillPlan, str, float, float] | None:
        """The policy's first choice breaks the TTFT SLO: before answering 429, the policy's own
        plan on each other prefill instance, with its hand-off and margin -- the one predicted
        soonest if within ``limit_s`` (plan, decode, its TBT, its TTFT without margin), else None.
        Why: the margin and the hand-off time are per pair (ttft_error.py, handoff_queue.py), and a
        request the first choice would fail may well meet the SLO on another instance."""
        best: tuple[float, tuple[PrefillPlan, str, float, float]] | None = None
        for plan, d, tbt in self._plans_elsewhere(req, prefills, decodes, failed.instance_id, now):
            first, margin = self._first_token(plan, d, now)
            if (first + margin <= limit_s and (best is None or first + margin < best[0])
                    and self._harm(plan, req, now) is None):
                best = (first + margin, (plan, d, tbt, first))
        return best[1] if best is not None else None

    # ------------------------------------------------------------------ policy hooks
    @abc.abstractmethod
    def choose_prefill(self, req: RequestInfo, prefills: Sequence[InstanceInfo], now: float) -> PrefillPlan:
        """Pick the prefill instance (and what it reuses) for ``req``; the policy's core."""

    def choose_decode(self, req: RequestInfo, decodes: Sequence[InstanceInfo], now: float,
                      est_ttft_s: float) -> tuple[str, float] | None:
        """Default: the decode instance with the lowest predicted TBT (ties rotate)."""
        best: tuple[str, float] | None = None
        n = len(decodes)
        start = self._rot_d % n
        self._rot_d += 1
        for k in range(n):
            inst = decodes[(start + k) % n]
            tbt = self.predicted_tbt(inst, req, now, est_ttft_s)
            if tbt is None:
                continue
            if best is None or tbt < best[1]:
                best = (inst.instance_id, tbt)
        return best

    def replicate_blocks(self, req: RequestInfo, plan: PrefillPlan) -> int:
        return 0

    # ------------------------------------------------------------------ estimates
    def cost_for(self, instance_id: str) -> CostModel:
        """The cost model that estimates ``instance_id``: its own when it has one (a frozen engine's
        slow samples then slow down only its estimates, not every instance's), else ``cost``."""
        return self.instance_costs.get(instance_id, self.cost)

    @staticmethod
    def _entry_time(e: PrefillEntry, cost: CostModel) -> float:
        if e.est_s < 0:
            return cost.transfer_time(e.remote_blocks) + cost.prefill_time(e.new_tokens, e.cached_tokens)
        return e.est_s

    def queue_time(self, instance_id: str, now: float) -> float:
        """Predicted wait before a new request could start on this prefill instance: the
        head's remaining time plus the full predicted time of everything queued behind it.
        O(1) when entries carry estimates (``on_scheduled`` passes them)."""
        load = self.cluster.prefill_load(instance_id)
        if not load.entries:
            return 0.0
        if load.n_unknown:
            cost = self.cost_for(instance_id)
            for e in load.entries.values():
                if e.est_s < 0:
                    load.set_estimate(e, self._entry_time(e, cost))
        head = next(iter(load.entries.values()))
        return self.head_remaining(instance_id, now) + max(0.0, load.est_sum - head.est_s)

    def head_remaining(self, instance_id: str, now: float) -> float:
        """Predicted time until the request running on this prefill instance finishes (0 when idle)."""
        load = self.cluster.prefill_load(instance_id)
        if not load.entries:
            return 0.0
        head = next(iter(load.entries.values()))
        if head.est_s < 0:
            load.set_estimate(head, self._entry_time(head, self.cost_for(instance_id)))
        return max(0.0, head.est_s - self.head_done(instance_id, now))

    def split_prompt(self, req: RequestInfo, cached_blocks: int) -> tuple[int, int]:
        """(tokens to compute, tokens reused) when ``cached_blocks`` leading blocks are reused."""
        cached = min(req.prompt_tokens, cached_blocks * self.cluster.block_size)
        new = req.prompt_tokens - cached
        if new <= 0 and req.prompt_tokens:
            new = 1  # engines always recompute at least the last token to get logits
        return new, cached

    def local_plan(self, instance_id: str, req: RequestInfo, now: float,
                   local_blocks: int | None = None, queue: float | None = None) -> PrefillPlan:
        """TTFT on ``instance_id`` reusing only what it holds itself."""
        if local_blocks is None:
            local_blocks = self.cluster.prefix_hit_blocks(instance_id, req.block_hashes)
        if queue is None:
            queue = self.queue_time(instance_id, now)
        new, cached = self.split_prompt(req, local_blocks)
        return PrefillPlan(instance_id, queue + self.cost_for(instance_id).prefill_time(new, cached), queue,
                           local_blocks)

    def predicted_tbt(self, inst: InstanceInfo, req: RequestInfo, now: float,
                      est_ttft_s: float) -> float | None:
        """Predicted time between tokens on decode ``inst`` once ``req`` joins it; None when
        its KV capacity cannot take the request.

        Without a prediction horizon: current running set + this request. With one: the
        load projected to ``now + min(est_ttft, horizon)`` — running requests expected to have
        finished by then are dropped, requests in prefill headed there are added.
        """
        load: DecodeLoad = self.cluster.decode_load(inst.instance_id)
        cost = self.cost_for(inst.instance_id)
        mine = kv_footprint(req.prompt_tokens, req.max_output_tokens)
        horizon = self.slo.prediction_horizon_s
        if horizon is None:
            n = load.running + 1
            kv = load.kv_tokens + mine
        else:
            t = now + min(est_ttft_s, horizon)
            step_now = cost.decode_step_time(load.running, load.kv_tokens)
            n = 1
            kv = mine
            for e in load.entries.values():
                if e.started_at + e.max_output_tokens * step_now > t:
                    n += 1
                    kv += kv_footprint(e.prompt_tokens, e.max_output_tokens)
            for pe in load.incoming.values():
                n += 1
                kv += kv_footprint(pe.prompt_tokens, pe.max_output_tokens)
        cap = inst.cache_capacity_blocks
        if cap and kv > cap * self.cluster.block_size and load.running > 0:
            return None
        return cost.decode_step_time(n, kv) * self.decode_contention(inst.instance_id)

    def _argmin_prefill(self, plans_iter: Iterable[PrefillPlan]) -> PrefillPlan:
        best: PrefillPlan | None = None
        for p in plans_iter:
            if best is None or p.est_ttft_s < best.est_ttft_s:
                best = p
        assert best is not None
        return best

    def _rotated(self, items: Sequence[InstanceInfo]) -> list[InstanceInfo]:
        """Instances starting at a rotating offset, so exact ties spread across instances."""
        n = len(items)
        s = self._rot % n
        self._rot += 1
        return list(items[s:]) + list(items[:s])


class RandomScheduler(Scheduler):
    """Uniformly random prefill and decode (baseline)."""

    policy = "random"

    def choose_prefill(self, req: RequestInfo, prefills: Sequence[InstanceInfo], now: float) -> PrefillPlan:
        return self.local_plan(self.rng.choice(prefills).instance_id, req, now)

    def choose_decode(self, req: RequestInfo, decodes: Sequence[InstanceInfo], now: float,
                      est_ttft_s: float) -> tuple[str, float] | None:
        order = list(decodes)
        self.rng.shuffle(order)
        for inst in order:
            tbt = self.predicted_tbt(inst, req, now, est_ttft_s)
            if tbt is not None:
                return inst.instance_id, tbt
        return None


class RoundRobinScheduler(Scheduler):
    """Prefill and decode in turn (baseline; the toy proxies' behaviour)."""

    policy = "round_robin"

    def choose_prefill(self, req: RequestInfo, prefills: Sequence[InstanceInfo], now: float) -> PrefillPlan:
        inst = prefills[self._rot % len(prefills)]
        self._rot += 1
        return self.local_plan(inst.instance_id, req, now)

    def choose_decode(self, req: RequestInfo, decodes: Sequence[InstanceInfo], now: float,
                      est_ttft_s: float) -> tuple[str, float] | None:
        n = len(decodes)
        for k in range(n):
            inst = decodes[(self._rot_d + k) % n]
            tbt = self.predicted_tbt(inst, req, now, est_ttft_s)
            if tbt is not None:
                self._rot_d += k + 1
                return inst.instance_id, tbt
        return None


class LoadBalanceScheduler(Scheduler):
    """Least predicted prefill queue time (ignores prefix locality); decode by predicted TBT."""

    policy = "load_balance"

    def choose_prefill(self, req: RequestInfo, prefills: Sequence[InstanceInfo], now: float) -> PrefillPlan:
        best_id: str | None = None
        best_q = 0.0
        for inst in self._rotated(prefills):
            q = self.queue_time(inst.instance_id, now)
            if best_id is None or q < best_q:
                best_id, best_q = inst.instance_id, q
        assert best_id is not None  # schedule() only asks with at least one healthy prefill
        return self.local_plan(best_id, req, now, queue=best_q)


class CacheAwareScheduler(Scheduler):
    """Local cache-aware: minimise queue + prefill(tokens the instance itself lacks)."""

    policy = "cache_aware"

    def choose_prefill(self, req: RequestInfo, prefills: Sequence[InstanceInfo], now: float) -> PrefillPlan:
        hits = self.cluster.prefix_hits_all(req.block_hashes)
        return self._argmin_prefill(
            self.local_plan(i.instance_id, req, now, hits.get(i.instance_id, 0)) for i in self._rotated(prefills))


class ConductorScheduler(Scheduler):
    """Global KVCache-centric scheduling (the paper's Conductor), see module docstring.

    ``replicate_hot``: when a request reuses a prefix whose last reused block has been hit at
    least ``hot_threshold`` times, the decision asks the caller to copy that prefix into the
    store (``Decision.replicate_blocks``), so it survives eviction from any single instance
    and every instance can fetch it. Needs the store tier enabled in the ClusterState.
    """

    policy = "conductor"
    ranks_by_first_token = True
    options = ("replicate_hot", "hot_threshold", "hot_window")

    def __init__(self, cluster: ClusterState, cost: CostModel | None = None, slo: SloConfig | None = None,
                 seed: int = 0, *, settings: SchedulerSettings | None = None, latency: LatencyBoard | None = None,
                 replicate_hot: bool = False, hot_threshold: int = 4, hot_window: int = 100_000) -> None:
        super().__init__(cluster, cost, slo, seed, settings=settings, latency=latency)
        self.replicate_hot = replicate_hot
        self.hot_threshold = hot_threshold
        self._hot_window = hot_window
        self._hits: Counter[int] = Counter()

    def choose_prefill(self, req: RequestInfo, prefills: Sequence[InstanceInfo], now: float) -> PrefillPlan:
        cl = self.cluster
        hashes = req.block_hashes
        hits = cl.prefix_hits_all(hashes)
        # Top two healthy holders, so "best remote excluding me" is O(1) per instance.
        top1: tuple[str | None, int] = (None, 0)
        top2: tuple[str | None, int] = (None, 0)
        for inst_id, n in hits.items() if cl.peer_fetch else ():
            if not cl.get_instance(inst_id).healthy:
                continue
            n = cl.ready_prefix(inst_id, hashes, n)  # only computed blocks can be fetched
            if n > top1[1]:
                top1, top2 = (inst_id, n), top1
            elif n > top2[1]:
                top2 = (inst_id, n)
        store_n = cl.store_hit_blocks(hashes)
        exports: dict[str, float] = {}  # holder -> when its export answers (cl.peer_export_waits)
        best: PrefillPlan | None = None
        for inst in self._rotated(prefills):
            iid = inst.instance_id
            cost = self.cost_for(iid)
            local = hits.get(iid, 0)
            plan = self.local_plan(iid, req, now, local)
            src, rn = top2 if top1[0] == iid else top1
            # a tie goes to the instance (its copy is in a peer's memory) unless reading a peer means
            # waiting for its export (live --peer-prefix): the store's copy costs no engine a step
            if store_n > rn or (cl.peer_export_waits and store_n and store_n >= rn):
                src, rn = STORE, store_n
            if rn > local:
                new, cached = self.split_prompt(req, rn)
                start = plan.est_queue_s
                if src is not None and src != STORE and cl.peer_export_waits:  # sent once the holder exported
                    start = max(start, self._export_done_s(src, rn, now, exports))
                ttft = start + cost.transfer_time(rn - local) + cost.prefill_time(new, cached)
                if ttft < plan.est_ttft_s:
                    plan = PrefillPlan(iid, ttft, plan.est_queue_s, rn, src, rn - local)
            if best is None or plan.est_ttft_s < best.est_ttft_s:
                best = plan
        assert best is not None
        return best

    def _export_done_s(self, holder: str, blocks: int, now: float, memo: dict[str, float]) -> float:
        """Seconds until ``holder`` answers an export of ``blocks`` leading blocks: the step it runs
        now (vLLM batches the small export into its next step, ahead of no queue of whole prompts),
        then the last block (an engine recomputes at least the last token of a fully cached prompt)."""
        if holder not in memo:
            bs = self.cluster.block_size
            memo[holder] = (self.head_remaining(holder, now)
                            + self.cost_for(holder).prefill_time(bs, (blocks - 1) * bs))
        return memo[holder]

    def replicate_blocks(self, req: RequestInfo, plan: PrefillPlan) -> int:
        n = plan.cached_blocks
        if n <= 0 or not self.replicate_hot:
            return 0
        key = req.block_hashes[n - 1]
        self._hits[key] += 1
        if len(self._hits) > self._hot_window:  # bounded memory: forget the cold half
            self._hits = Counter(dict(self._hits.most_common(self._hot_window // 2)))
        if (self.cluster.store_enabled and self._hits[key] >= self.hot_threshold
                and self.cluster.store_hit_blocks(req.block_hashes[:n]) < n):
            return n
        return 0



#: the built-in policies (registered with the plugin manager by .registry), in --help order
BUILTIN_SCHEDULERS: tuple[type[Scheduler], ...] = (
    RandomScheduler, RoundRobinScheduler, LoadBalanceScheduler, CacheAwareScheduler, ConductorScheduler)
#: names of the built-in policies
POLICIES: tuple[str, ...] = tuple(c.policy for c in BUILTIN_SCHEDULERS)
