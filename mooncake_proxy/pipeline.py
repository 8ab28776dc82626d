"""The request pipeline: one scheduled request's pair lifecycle, prefill to the end of its decode stream.

Given the scheduler's decision, it builds the hand-off's two payloads (``handoff/``), adds the
prefix hints the plan calls for (``prefix_hints.py``), runs the prefill -- first and alone, or
with the decode at once for a concurrent hand-off -- and streams the decode back (``relay.py``),
keeping the cluster's load bookkeeping (what the scheduler reads) in step with each stage and
reporting what it saw to the calibration loop. The pieces it drives are handed to it, so a
caller other than the HTTP server (the simulator's clock and engines, a test's fakes) could
drive the same lifecycle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from mooncake_core.utils.log import get_logger

from . import first_token as ftok
from .calibration_loop import CalibrationLoop
from .errors import error_response
from .handoff import HandoffProtocol
from .metrics import ProxyMetrics
from .prefix_hints import PeerPrefixExporter, with_store_hint
from .registry import Instance, Registry
from .relay import Relay, StreamTiming, forward_headers
from .scheduling import STORE, ClusterState, Scheduler, decode_stage_rejection

log = get_logger("mooncake_proxy.server")


@dataclass(frozen=True)
class PipelineSettings:
    """The flags the pipeline follows (``ProxyConfig``)."""

    block_size: int
    retry_after: float
    #: --prefill-first-token: stream the prefill's first token at once (first_token.py)
    prefill_first_token: bool = False
    #: --rejection decode / early+decode: the TBT limit of the check at the decode stage (None: off)
    decode_tbt_limit: float | None = None


class PairPipeline:
    """Runs a scheduled request on its (prefill, decode) pair (module doc)."""

    def __init__(self, settings: PipelineSettings, cluster: ClusterState, scheduler: Scheduler,
                 registry: Registry, handoff: HandoffProtocol, relay: Relay, metrics: ProxyMetrics,
                 calibration: CalibrationLoop | None, peer_prefix: PeerPrefixExporter | None,
                 resolve_engine_id: Callable[[Instance, dict[str, Any]], Awaitable[None]]) -> None:
        self.settings = settings
        self._cluster = cluster
        self._scheduler = scheduler
        self._registry = registry
        self._handoff = handoff
        self._relay = relay
        self._metrics = metrics
        self._cal = calibration
        self._peer_prefix = peer_prefix
        self._resolve_engine_id = resolve_engine_id

    def _inflight(self, inst: Instance, delta: int) -> None:
        inst.in_flight += delta
        if self._registry.get(inst.instance_id) is not inst:
            return  # removed meanwhile: do not resurrect its metric series
        self._metrics.set_in_flight(inst.instance_id, inst.role, inst.in_flight)

    async def run(self, request: web.Request, route: str, rid: str, body: dict[str, Any],
                  req: Any, decision: Any, p: Instance, d: Instance, t0: float,
                  token_ids: Any = None) -> web.StreamResponse:
        headers = forward_headers(request, rid)
        ho = self._handoff
        ctx = ho.new_context(rid)
        cluster = self._cluster
        now = time.monotonic
        c_dec = self._scheduler.decode_contention(d.instance_id)  # as when est_tbt_s was made (before this prefill)
        cluster.on_prefill_start(p.instance_id, req, now(), cached_blocks=decision.cached_blocks,
                                 decode_id=d.instance_id)
        # Record the prompt's blocks now, not when the prefill ends: requests sharing the prefix
        # that arrive meanwhile should queue behind this one rather than recompute elsewhere.
        cluster.record_blocks(p.instance_id, req.block_hashes)
        self._inflight(p, 1)
        prefill_open = True

        def prefill_finished() -> None:
            nonlocal prefill_open
            if prefill_open:
                prefill_open = False
                self._inflight(p, -1)
                cluster.on_prefill_done(p.instance_id, req, now())

        ptask: asyncio.Task[dict[str, Any]] | None = None
        cal = self._cal
        # the scheduler's estimates were made with each instance's factors in force now: undo them
        # for the sample, and note the contention the prefill runs under (contention.py)
        f_dec = cal.factor("decode", d.instance_id) if cal is not None else 1.0
        t_sent = now()
        sample = cal.prefill_sent(p.instance_id, t_sent) if cal is not None else None
        t_answered: float | None = None  # perf_counter of the prefill's answer (sequential hand-off)
        timing = StreamTiming() if cal is not None else None
        # a request counts against both instances until it ends: a drained prefill must outlive
        # the decode's read of its KV, not just its own answer
        p.active += 1
        d.active += 1
        try:
            pheaders = headers
            if ho.needs_engine_id:
                await self._resolve_engine_id(p, ctx)
                extra = ho.prefill_headers(ctx)
                if extra:
                    pheaders = {**headers, **extra}
            ppayload = ho.prefill_payload(body, route, p.addr, ctx)
            src = decision.remote_source
            if src == STORE and decision.remote_blocks:
                ppayload = with_store_hint(ppayload, decision, self.settings.block_size)
            elif src is not None and decision.remote_blocks and self._peer_prefix is not None:
                ppayload = await self._peer_prefix.with_peer_prefix(ppayload, body, decision, token_ids, headers, rid)
            prefix: bytes | None = None
            rewrite: ftok.UsageShift | None = None
            if not ho.is_concurrent(p.addr):
                first = self._first_token_wanted(body, route, rid)
                if first:
                    ppayload = ftok.prefill_body(ppayload, body)
                presp = await self._relay.post_json(p, route, ppayload, pheaders, "prefill")
                t_done = now()
                prefill_finished()
                if cal is not None and sample is not None:
                    t_answered = time.perf_counter()
                    cal.prefill_answered(sample, decision.est_ttft_s, t_done)
                if log.isEnabledFor(logging.DEBUG):  # the prefill's side of the TTFT check's error
                    usage = presp.get("usage") if isinstance(presp, dict) else None
                    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
                    log.debug("prefill answered", extra={
                        "request_id": rid, "prefill": p.instance_id, "took_s": round(t_done - t_sent, 3),
                        "est_prefill_s": round(decision.est_ttft_s, 3),
                        "engine_cached_tokens": details.get("cached_tokens") if isinstance(details, dict) else None})
                ho.on_prefill_answer(p.addr, presp)
                ft = ftok.parse_first_token(presp) if first else None
                if first and ft is None:
                    self._metrics.first_token.labels("fallback").inc()
                    log.warning("--prefill-first-token: the prefill's answer has no token ids (an engine "
                                "without return_token_ids?); normal hand-off",
                                extra={"request_id": rid, "instance": p.url})
                if ft is not None and not ftok.needs_decode(body, ft):
                    self._metrics.first_token.labels("prefill_only").inc()
                    return await self._relay.send_sse(request, route, rid, t0,
                                                      ftok.first_chunks(body, ft, final=True))
                rejected = self._decode_stage_check(d, req)
                if rejected is not None:
                    return rejected
                dbody = body
                if ft is not None:
                    self._metrics.first_token.labels("streamed").inc()
                    prefix, rewrite = ftok.first_chunks(body, ft, final=False), ftok.UsageShift(ft)
                    dbody = ftok.decode_body(body, ft)
                why = ho.recompute_reason(presp)
                if why is not None:
                    self._metrics.decode_recomputes.labels(p.instance_id, d.instance_id, why).inc()
                    log.warning("the decode will recompute the prompt: the prefill handed off no KV",
                                extra={"request_id": rid, "prefill": p.instance_id, "decode": d.instance_id,
                                       "reason": why})
                dpayload = ho.decode_payload(dbody, route, p.addr, ctx, presp)
            else:
                ptask = asyncio.create_task(self._relay.post_json(p, route, ppayload, pheaders, "prefill"))

                def prefill_answered(t: asyncio.Task[dict[str, Any]], addr: Any = p.addr) -> None:
                    # The prefill's load ends when its answer comes, not when the decode stream does.
                    prefill_finished()
                    if not t.cancelled() and t.exception() is None:
                        ho.on_prefill_answer(addr, t.result())

                ptask.add_done_callback(prefill_answered)
                # concurrent hand-off: the decode is sent with the prefill, so its stage check is now
                rejected = self._decode_stage_check(d, req)
                if rejected is not None:
                    return rejected
                dpayload = ho.decode_payload(body, route, p.addr, ctx, None)
            t_decode = now()
            cluster.on_decode_start(d.instance_id, req, t_decode)
            busy_decode = cluster.busy_times(t_decode)  # which prefills slow this stream (contention.py)
            self._inflight(d, 1)
            hq = cluster.decode_load(d.instance_id).handoff if t_answered is not None else None
            if hq is not None and timing is not None:
                hq.handed_off(req.request_id, now(), p.instance_id)
            errs = cluster.ttft_errors if decision.est_first_token_s >= 0 else None
            if timing is not None and (hq is not None or errs is not None):

                def first_token() -> None:
                    service = hq.first_token(req.request_id, now()) if hq is not None else None
                    ttft = time.perf_counter() - t0
                    if errs is not None:  # the TTFT check's error on this pair (ttft_error.py)
                        errs.observe(p.instance_id, d.instance_id, decision.est_first_token_s, ttft, now(),
                                     queued=decision.waits_behind)
                    if log.isEnabledFor(logging.DEBUG):
                        log.debug("first token", extra={"request_id": rid, "ttft_s": round(ttft, 3),
                                                        "handoff_service_s": service})

                timing.on_first = first_token
            try:
                if ptask is None:
                    return await self._relay.stream_decode(request, route, d, dpayload, headers, rid, t0, None,
                                                           timing, prefix=prefix, rewrite=rewrite)
                return await self._relay.race_decode(request, route, d, dpayload, headers, rid, t0, ptask, timing)
            finally:
                self._inflight(d, -1)
                cluster.on_decode_done(d.instance_id, req, now())
                if hq is not None:
                    hq.dropped(req.request_id)  # no first token came (a no-op when one did)
                if cal is not None and timing is not None:
                    if t_answered is not None and timing.chunks:
                        cal.first_token(d.instance_id, timing.first - t_answered, now())
                    if (gap := timing.gap_quantile(0.9)) is not None:  # the TBT SLO is a p90 (relay.py)
                        cal.decode_streamed(d.instance_id, decision.est_tbt_s, f_dec * c_dec, gap, t_decode,
                                            busy_decode, now())
        finally:
            p.active -= 1
            d.active -= 1
            if ptask is not None:
                if not ptask.done():
                    ptask.cancel()
                    try:
                        await ptask
                    except BaseException:
                        pass
                elif not ptask.cancelled():
                    ptask.exception()  # retrieved: no "never retrieved" warning
            prefill_finished()

    def _first_token_wanted(self, body: dict[str, Any], route: str, rid: str) -> bool:
        """Whether this request takes the ``--prefill-first-token`` path (first_token.py)."""
        if not self.settings.prefill_first_token:
            return False
        why = ftok.ineligible(body, route)
        if why is None:
            return True
        self._metrics.first_token.labels("ineligible").inc()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("--prefill-first-token: normal hand-off", extra={"request_id": rid, "reason": why})
        return False

    def _decode_stage_check(self, d: Instance, req: Any) -> web.StreamResponse | None:
        """``--rejection decode`` / ``early+decode``: the paper's baseline check once the prefill is
        done -- a 429 when decode ``d``'s current batch plus this request would break --tbt-slo.
        The prefill's KV is then never pulled; the P2P connector's lease frees it."""
        limit = self.settings.decode_tbt_limit
        if limit is None:
            return None
        sched = self._scheduler
        rej = decode_stage_rejection(self._cluster, sched.cost_for(d.instance_id), d.instance_id, req, limit,
                                     self.settings.retry_after, sched.decode_contention(d.instance_id))
        if rej is None:
            return None
        self._metrics.rejections.labels("slo_decode").inc()
        rid = req.request_id.rsplit("#", 1)[0]
        return error_response(429, f"overloaded, request rejected after its prefill: {rej.reason}",
                              "rate_limit_exceeded", request_id=rid, retry_after=rej.retry_after_s)
