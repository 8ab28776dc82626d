"""The PD proxy HTTP server (aiohttp).

One request: parse → hash the prompt into blocks → ``Scheduler.schedule`` picks a
(prefill, decode) pair or rejects early (429 + Retry-After) → the hand-off protocol builds the
two payloads → prefill (first, or concurrently) → decode, streamed back chunk by chunk.

Why aiohttp on both sides: one event loop, pooled keep-alive connections per instance, and
``iter_any()`` hands each upstream chunk over as soon as it arrives (no re-chunking), which is
what keeps the added latency well under the 2 ms target. The response to the client is only
started when the first decode byte arrives, so a failure before that (prefill error, decode
error, timeout) still becomes a proper 502/504 JSON error instead of a truncated 200.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from mooncake_core import auth
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.tls import server_context

from . import first_token as ftok
from . import scheduling
from .admin import AdminApi
from .admission_log import admitted_fields
from .bootstrap import BootstrapDirectory, BootstrapError
from .dashboard import ProxyDashboard
from .errors import error_response
from .handoff import HandoffProtocol, make_handoff
from .handoff.mooncake import bootstrap_url
from .health import HealthChecker
from .health_state import HealthState, ProbePolicy
from .metrics import ProxyMetrics
from .prefix_hints import with_peer_prefix, with_store_hint
from .prompt import BadRequest, PromptHasher
from .registry import Instance, Registry, normalize_url
from .relay import Relay, RelayTimeouts, StreamTiming, UpstreamError, forward_headers

log = get_logger("mooncake_proxy.server")

_dec = msgspec.json.Decoder()

COMPLETION_ROUTES = ("/v1/completions", "/v1/chat/completions", "/generate")
__all__ = ["COMPLETION_ROUTES", "ProxyConfig", "ProxyServer", "UpstreamError", "install_uvloop", "start_server"]


@dataclass
class ProxyConfig:
    """Everything the server needs; ``cli.py`` fills it from flags."""

    prefill_urls: list[str] = field(default_factory=list)
    decode_urls: list[str] = field(default_factory=list)
    prefill_bootstrap_ports: list[int | None] = field(default_factory=list)
    policy: str = "load_balance"
    handoff: str = "vllm"
    #: --prefill-first-token: stream the prefill's first token at once (first_token.py)
    prefill_first_token: bool = False
    ttft_slo: float | None = None
    tbt_slo: float | None = None
    prediction_horizon: float | None = None
    #: --rejection: where SLO-breaking requests get their 429 (scheduling/admission.py)
    rejection: str = "early"
    #: --calibrate: scale the cost model by observed / predicted latencies (scheduling/calibration.py)
    calibrate: bool = False
    #: --prefill-batch-tokens: the engines batch their queue in steps of this many tokens (0: one at a time)
    prefill_batch_tokens: int = 0
    #: --ttft-margin-quantile: the quantile of a pair's recent TTFT errors the check adds (ttft_error.py)
    ttft_margin_quantile: float = 0.9
    ttft_margin_queued: bool = True  # --[no-]ttft-margin-queued: requests admitted behind others as a class
    ttft_queue_margin: float = 1.0  # --ttft-queue-margin: a queued request's margin >= this x its predicted wait
    #: --recent-busy-tau: an idle prefill counts for its recent busy share (contention.RecentBusy); 0: off
    recent_busy_tau: float = 0.0
    #: --prefill-contention: with --calibrate, how prefills slowing each other is learned (contention.py):
    #: "count" = one slope per busy neighbour, "pairs" = a coefficient per (prefill, other prefill or decode),
    #: "groups" = processor sharing within the declared --hardware-group's (pairs for the other instances)
    prefill_contention: str = "pairs"
    #: --hardware-group: groups of instance URLs that share hardware (with prefill_contention "groups":
    #: processor sharing within each, contention.HardwareGroups)
    hardware_groups: list[list[str]] = field(default_factory=list)
    retry_after: float = 1.0
    health_interval: float = 5.0
    health_timeout: float = 2.0
    health_timeouts_to_down: int = 3
    #: --upstream-keepalive: below the engines' idle timeout (uvicorn: 5 s), see cli.py
    upstream_keepalive: float = 4.0
    request_timeout: float = 300.0
    connect_timeout: float = 5.0
    profile: str | None = None
    block_size: int = 512
    cache_blocks: int = 0
    decode_kv_blocks: int = 0
    tokenizer: str | None = None
    kv_events_config: str | None = None
    admin_key: str | None = None
    seed: int = 0
    #: largest request body accepted (413 above, naming the limit)
    max_request_bytes: int = 64 * 1024 * 1024
    #: serve HTTPS with this PEM certificate and key (both or neither)
    tls_cert: str | None = None
    tls_key: str | None = None
    store_master: str | None = None
    store_view: str = "events"
    store_model_tag: str | None = None
    #: --peer-prefix: the Conductor may plan a prefix load from another prefill instance
    peer_prefix: bool = False
    peer_prefix_timeout: float = 2.0


def _mean_other_busy(cluster: Any, area_then: float, then: float, now: float) -> float | None:
    """The mean number of busy prefill instances from ``then`` to ``now`` (``ClusterState.busy_area``
    read at ``then``: ``area_then``) besides the sample's own; None when no time passed."""
    if now <= then:
        return None
    return max(0.0, (cluster.busy_area(now) - area_then) / (now - then) - 1)


def _busy_shares(cluster: Any, then_times: dict[str, float], then: float, now: float, *,
                 decodes: bool = False) -> dict[str, float] | None:
    """The share of the time from ``then`` to ``now`` each prefill instance (and with ``decodes``
    each decode instance) was busy (``ClusterState.busy_times`` / ``decode_busy_times`` read at
    ``then``: ``then_times``); None when no time passed."""
    if now <= then:
        return None
    times = {**cluster.busy_times(now), **cluster.decode_busy_times(now)} if decodes else cluster.busy_times(now)
    return {p: max(0.0, t - then_times.get(p, 0.0)) / (now - then) for p, t in times.items()}


class ProxyServer:
    MAX_ATTEMPTS = 3  # a request is retried on another pair only when an instance was unreachable
    # A request that finds no healthy instance of a role probes that role's instances for at most
    # this long before answering 503 (engines that just came up are then served at once).
    REPROBE_BUDGET_S = 1.0

    def __init__(self, cfg: ProxyConfig) -> None:
        self.cfg = cfg
        sched = scheduling
        self.sched_mod = sched
        self.cluster = sched.ClusterState(block_size=cfg.block_size)
        # Engines load a prefix from the store; from a peer only with --peer-prefix (our P2P connector
        # on the prefills reads what the peer exports, mooncake_core/pd/peer_prefix.py).
        self.cluster.peer_fetch = self.cluster.peer_export_waits = cfg.peer_prefix
        cost = sched.CostModel.from_file(cfg.profile) if cfg.profile else sched.CostModel.default()
        if cost.block_size != cfg.block_size:
            # the scheduler counts --block-size blocks; a profile made for another block size would
            # price each fetched block as one of its own (the shipped one: 512 tokens)
            cost = replace(cost, block_size=cfg.block_size)
        slo = sched.SloConfig(ttft_s=cfg.ttft_slo, tbt_s=cfg.tbt_slo, retry_after_s=cfg.retry_after,
                              prediction_horizon_s=cfg.prediction_horizon)
        slo, self.decode_tbt_limit = sched.split_rejection(slo, cfg.rejection)
        self.scheduler = sched.make_scheduler(cfg.policy, self.cluster, cost, slo, seed=cfg.seed)
        self.scheduler.prefill_batch_tokens = cfg.prefill_batch_tokens
        self.scheduler.queue_margin = cfg.ttft_queue_margin if cfg.calibrate else 0.0
        if cfg.recent_busy_tau > 0:
            self.scheduler.recent_busy = sched.RecentBusy(tau_s=cfg.recent_busy_tau)
        self.calibrator = sched.LatencyCalibrator(cost) if cfg.calibrate else None
        if cfg.calibrate:  # the TTFT check's per-pair margin from its own errors (ttft_error.py)
            self.cluster.ttft_errors = sched.TtftErrorQuantile(cfg.ttft_margin_quantile,
                                                               queued_class=cfg.ttft_margin_queued)
        tokenize = chat_tokenize = None
        if cfg.tokenizer:  # the engine's token ids: BOS on completions, the chat template on chat
            from .prompt import load_chat_tokenizer, load_tokenizer

            tokenize = load_tokenizer(cfg.tokenizer)
            chat_tokenize = load_chat_tokenizer(cfg.tokenizer)
        self.store_view: Any = None
        if cfg.store_master:
            from .store_view import StoreBlockHasher, make_store_view

            if not cfg.store_model_tag:
                raise ValueError("--store-master needs --store-model-tag (the engine's '<model>|<dtype>', "
                                 "e.g. 'Qwen/Qwen3-0.6B|torch.bfloat16') to compute the connector's block keys")
            hasher: Any = StoreBlockHasher(cfg.store_model_tag, cfg.block_size)
            self.store_view = make_store_view(cfg.store_view, cfg.store_master)
            self.cluster.set_store_view(self.store_view)
        else:
            hasher = sched.BlockHasher(block_size=cfg.block_size)
        self.hasher = PromptHasher(hasher, tokenize, chat_tokenize)
        self.handoff: HandoffProtocol = make_handoff(cfg.handoff)
        self.registry = Registry()
        self.metrics = ProxyMetrics()
        if self.calibrator is not None:
            for side in ("prefill", "decode"):
                self.metrics.cost_factor.labels(side).set(1.0)
        self.session: aiohttp.ClientSession | None = None
        self.health: HealthChecker | None = None
        self.probe_policy = ProbePolicy(interval=max(0.0, cfg.health_interval),
                                        timeouts_to_down=cfg.health_timeouts_to_down)
        self.bootstrap = BootstrapDirectory(lambda: self.session, cfg.health_timeout)
        self.relay = Relay(lambda: self.session, RelayTimeouts(cfg.request_timeout, cfg.connect_timeout),
                           self.metrics, lambda inst, why: self.set_healthy(inst, False, why),
                           lambda route, s: self._hist("ttft", route).observe(s))
        self.kv_events: Any = None
        if cfg.kv_events_config:  # parse now: a bad config fails before the port is bound
            from .kv_events import KvEventsSubscriber

            self.kv_events = KvEventsSubscriber.from_config(
                cfg.kv_events_config, registry=self.registry, cluster=self.cluster,
                hasher=self.hasher.hasher, events=self.metrics.kv_events)
        # prometheus ``.labels()`` costs a lock + dict lookup; cache the children (hot path).
        self._req_counters: dict[tuple[str, int], Any] = {}
        self._route_hist: dict[tuple[str, str], Any] = {}
        self._decision_ctr: dict[tuple[str, str], Any] = {}
        self._inflight_gauge: dict[str, Any] = {}
        self._prefix_ctr: dict[str, tuple[Any, Any]] = {}
        self._factor_gauge: dict[tuple[str, str], Any] = {}  # (side, instance) -> instance_cost_factor child
        self._interference_shown: set[tuple[str, str]] = set()  # (decode, prefill) pairs with a gauge series
        self._pairs_shown: set[tuple[str, str]] = set()  # (prefill, other instance) pairs with a gauge series
        self._seq = 0
        bports = list(cfg.prefill_bootstrap_ports)
        for i, url in enumerate(cfg.prefill_urls):
            self.add_instance("prefill", url, bports[i] if i < len(bports) else None)
        for url in cfg.decode_urls:
            self.add_instance("decode", url)
        self._declare_hardware_groups(cfg)

    def _declare_hardware_groups(self, cfg: ProxyConfig) -> None:
        """--hardware-group: the instances (by URL) that share hardware, for the scheduler's and the
        calibrator's processor sharing (contention.HardwareGroups). ValueError naming the URL or
        the flag that is wrong."""
        if cfg.prefill_contention == "groups" and not cfg.hardware_groups:
            raise ValueError("--prefill-contention groups needs at least one --hardware-group (the instance URLs "
                             "that share one piece of hardware)")
        if cfg.hardware_groups and cfg.prefill_contention != "groups":
            raise ValueError(f"--hardware-group needs --prefill-contention groups (got {cfg.prefill_contention!r})")
        by_url = {inst.url: inst.instance_id for inst in self.registry.all()}
        ids: list[list[str]] = []
        for group in cfg.hardware_groups:
            ids.append([])
            for url in group:
                iid = by_url.get(normalize_url(url))
                if iid is None:
                    raise ValueError(f"--hardware-group: {url!r} is not a --prefill or --decode instance "
                                     f"(known: {sorted(by_url)})")
                ids[-1].append(iid)
        groups = self.sched_mod.HardwareGroups(ids)
        self.scheduler.hardware_groups = groups
        self.cluster.track_head_busy = bool(groups)  # how far a head is along (Scheduler.head_done)
        if self.calibrator is not None:
            self.calibrator.groups = groups
        if groups:
            log.info("hardware groups declared", extra={"groups": groups.groups()})

    # ------------------------------------------------------------------ instances
    def add_instance(self, role: str, url: str, bootstrap_port: int | None = None) -> Instance:
        inst = self.registry.add(role, url, bootstrap_port)
        self.cluster.add_instance(self.sched_mod.InstanceInfo(
            instance_id=inst.instance_id, role=inst.role,
            cache_capacity_blocks=self.cfg.cache_blocks if role == "prefill" else self.cfg.decode_kv_blocks))
        if role == "decode" and self.calibrator is not None:  # the hand-off as a queue (handoff_queue.py)
            self.cluster.decode_load(inst.instance_id).handoff = self.sched_mod.HandoffQueue()
        # Not schedulable until its first answered /health (probed at once, see health.py).
        self.cluster.set_healthy(inst.instance_id, False)
        self.metrics.healthy.labels(inst.instance_id, role).set(0)
        self.metrics.in_flight.labels(inst.instance_id, role).set(0)
        log.info("instance added", extra={"instance": inst.instance_id})
        if self.health is not None:
            self.health.wake()
        return inst

    def remove_instance(self, instance_id: str) -> Instance:
        inst = self.registry.remove(instance_id)
        self.cluster.remove_instance(instance_id)
        self.scheduler.hardware_groups.forget(instance_id)
        if self.calibrator is not None:
            self.calibrator.forget(instance_id)
            self.scheduler.instance_costs = self.calibrator.costs()
            try:
                self.metrics.first_token_delay.remove(instance_id)
            except KeyError:
                pass
            for side in ("prefill", "decode"):
                self._factor_gauge.pop((side, instance_id), None)
                try:
                    self.metrics.instance_cost_factor.remove(instance_id, side)
                except KeyError:
                    pass
            for shown, gauge in ((self._interference_shown, self.metrics.decode_interference),
                                 (self._pairs_shown, self.metrics.prefill_interference)):
                for pair in [pr for pr in shown if instance_id in pr]:
                    shown.discard(pair)
                    try:
                        gauge.remove(*pair)
                    except KeyError:
                        pass
            self.scheduler.interference = self.calibrator.interference()
            self.scheduler.prefill_interference = self.calibrator.prefill_interference()
        self._forget_bootstrap(inst)
        self._inflight_gauge.pop(instance_id, None)
        self._prefix_ctr.pop(instance_id, None)
        self._decision_ctr = {k: v for k, v in self._decision_ctr.items() if instance_id not in k}
        for g in (self.metrics.healthy, self.metrics.in_flight):
            try:
                g.remove(inst.instance_id, inst.role)
            except KeyError:
                pass
        for c in (self.metrics.prompt_blocks, self.metrics.prompt_cached_blocks):
            try:
                c.remove(inst.instance_id)
            except KeyError:
                pass
        log.info("instance removed", extra={"instance": instance_id})
        return inst

    def _forget_bootstrap(self, inst: Instance) -> None:
        if inst.role == "prefill":
            self.bootstrap.forget(bootstrap_url(inst.addr))

    def set_healthy(self, inst: Instance, ok: bool, why: str = "", timed_out: bool = False) -> None:
        """Apply a probe result (or a refused connection on the request path) to ``inst``: the
        one place that changes what the scheduler may choose."""
        if self.registry.get(inst.instance_id) is not inst:
            return
        was = inst.health.state
        if not inst.health.on_probe(ok, why, time.monotonic(), self.probe_policy, timed_out):
            return
        self.cluster.set_healthy(inst.instance_id, ok)
        self.metrics.healthy.labels(inst.instance_id, inst.role).set(1 if ok else 0)
        if ok:
            self._forget_bootstrap(inst)  # it may have restarted with new engine ids
            log.info("instance up", extra={"instance": inst.instance_id, "was": was.value})
        else:
            log.warning("instance taken out", extra={"instance": inst.instance_id, "why": why,
                                                     "was": was.value})
            if self.health is not None:
                self.health.wake()  # re-probe it on the fast back-off

    # ------------------------------------------------------------------ app
    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.max_request_bytes)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/healthcheck", self._healthcheck)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        ProxyDashboard(self).register(app)
        AdminApi(self.registry, self.add_instance, self.remove_instance, self._probe_now,
                 self.cfg.admin_key, self.prefix_view).register(app)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    def prefix_view(self, body: dict[str, Any], route: str) -> dict[str, Any]:
        """What the scheduler sees for ``body`` (``POST /admin/prefix``): prompt tokens, full
        blocks, and the leading blocks each prefill instance and the store hold in its index."""
        pinfo = self.hasher.info(body, route)
        hashes = pinfo.block_hashes
        out: dict[str, Any] = {
            "prompt_tokens": pinfo.prompt_tokens, "blocks": len(hashes), "block_size": self.hasher.block_size,
            "instances": {i.instance_id: self.cluster.prefix_hit_blocks(i.instance_id, hashes)
                          for i in self.registry.all("prefill")}}
        if self.cluster.store_enabled:
            out["store"] = self.cluster.store_hit_blocks(hashes)
        return out

    async def _probe_now(self, inst: Instance) -> None:
        """Probe a just-added instance (bounded by --health-timeout), so the admin answer says
        whether it is in rotation yet."""
        if self.health is not None:
            await self.health.probe_now(inst)

    async def _on_startup(self, app: web.Application) -> None:
        # aiohttp keeps idle connections 15 s by default, longer than uvicorn's 5 s under vLLM and
        # SGLang: a request written into one the engine is closing fails with a connection reset
        ka = self.cfg.upstream_keepalive
        conn = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300,
                                    keepalive_timeout=ka if ka > 0 else None, force_close=ka <= 0)
        self.session = aiohttp.ClientSession(connector=conn, auto_decompress=False,
                                             timeout=aiohttp.ClientTimeout(total=None))
        self.health = HealthChecker(self.registry, self.session, self.probe_policy,
                                    self.cfg.health_timeout,
                                    lambda inst, r: self.set_healthy(inst, r.ok, r.why, r.timed_out))
        self.health.start()
        if self.kv_events is not None:
            self.kv_events.start()
        if self.store_view is not None:  # its first pull (a snapshot) may take a moment
            await asyncio.get_running_loop().run_in_executor(None, self.store_view.start)

    async def _on_cleanup(self, app: web.Application) -> None:
        if self.kv_events is not None:
            await self.kv_events.stop()
        if self.store_view is not None:
            self.store_view.stop()
        if self.health is not None:
            await self.health.stop()
        if self.session is not None:
            await self.session.close()

    # ------------------------------------------------------------------ helpers
    def _count(self, route: str, status: int) -> None:
        key = (route, status)
        c = self._req_counters.get(key)
        if c is None:
            c = self._req_counters[key] = self.metrics.requests.labels(route, str(status))
        c.inc()

    def _hist(self, which: str, route: str) -> Any:
        key = (which, route)
        h = self._route_hist.get(key)
        if h is None:
            h = self._route_hist[key] = getattr(self.metrics, which).labels(route)
        return h

    # ------------------------------------------------------------------ routes
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "/v1/completions")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "/v1/chat/completions")

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "/generate")

    async def _handle(self, request: web.Request, route: str) -> web.StreamResponse:
        t0 = time.perf_counter()
        rid = request.headers.get("X-Request-Id") or f"cmpl-{uuid.uuid4().hex}"
        try:
            resp = await self._handle_inner(request, route, rid, t0)
        except asyncio.CancelledError:
            # Client went away: aiohttp cancelled us; leaving the `async with` blocks closed the
            # upstream connections, which is what cancels the work on the engines.
            self._count(route, 499)
            log.info("client disconnected; upstream requests cancelled", extra={"request_id": rid})
            raise
        except ConnectionResetError:
            self._count(route, 499)  # client vanished while we were writing to it
            raise
        except Exception as e:  # a bug must not become an opaque 500 text or a hang
            log.exception("internal error", extra={"request_id": rid})
            resp = error_response(500, f"proxy internal error: {type(e).__name__}: {e}", "internal_error",
                                  request_id=rid)
        self._count(route, resp.status)
        self._hist("e2e", route).observe(time.perf_counter() - t0)
        return resp

    async def _handle_inner(self, request: web.Request, route: str, rid: str, t0: float) -> web.StreamResponse:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            limit = self.cfg.max_request_bytes
            return error_response(413, f"request body exceeds the proxy's limit of {limit} bytes "
                                       f"(--max-request-bytes)", "invalid_request_error", request_id=rid)
        try:
            body = _dec.decode(raw)
        except msgspec.DecodeError as e:
            return error_response(400, f"request body is not valid JSON: {e}", "invalid_request_error",
                                  request_id=rid)
        if not isinstance(body, dict):
            return error_response(400, "request body must be a JSON object", "invalid_request_error",
                                  request_id=rid)
        try:
            pinfo = self.hasher.info(body, route)
        except BadRequest as e:
            return error_response(400, str(e), "invalid_request_error", request_id=rid)
        last: UpstreamError | None = None
        for _attempt in range(self.MAX_ATTEMPTS):
            try:
                return await self._schedule_and_run(request, route, rid, body, pinfo, t0)
            except UpstreamError as e:
                last = e
                if not e.retryable:
                    break
                log.warning("instance unreachable; retrying on another", extra={
                    "request_id": rid, "instance": e.inst.instance_id})
        assert last is not None
        if last.body is not None:
            return web.Response(status=last.status, body=last.body,
                                content_type=(last.content_type or "application/json").split(";")[0],
                                headers={"X-Request-Id": rid})
        log.warning("upstream failure", extra={"request_id": rid, "instance": last.inst.instance_id,
                                               "status": last.status, "error": last.message})
        return error_response(last.status, last.message, last.err_type, request_id=rid)

    async def _schedule_and_run(self, request: web.Request, route: str, rid: str, body: dict[str, Any],
                                pinfo: Any, t0: float) -> web.StreamResponse:
        for role in ("prefill", "decode"):
            if not self.registry.healthy(role):
                if self.health is not None and self.registry.all(role):
                    await self.health.ensure_up(role, self.REPROBE_BUDGET_S)
                if not self.registry.healthy(role):
                    self.metrics.rejections.labels(f"no_healthy_{role}").inc()
                    return error_response(503, self._unavailable_reason(role), "service_unavailable",
                                          request_id=rid, retry_after=1)
        now = time.monotonic()
        self._seq += 1
        # Internal id: clients may reuse X-Request-Id; load bookkeeping must not merge them.
        req = self.sched_mod.RequestInfo(request_id=f"{rid}#{self._seq}", prompt_tokens=pinfo.prompt_tokens,
                                         block_hashes=pinfo.block_hashes,
                                         max_output_tokens=pinfo.max_output_tokens, arrival=now)
        if self.calibrator is not None and self.calibrator.tick(now):
            self._calibrated("prefill", True)
            self._calibrated("decode", True)
            self._sync_first_token()
        decision = self.scheduler.schedule(req, now)
        if isinstance(decision, self.sched_mod.Rejection):
            self.metrics.rejections.labels("slo").inc()
            log.debug("rejected", extra={"request_id": rid, "reason": decision.reason})
            return error_response(429, f"overloaded, request rejected early: {decision.reason}",
                                  "rate_limit_exceeded", request_id=rid, retry_after=decision.retry_after_s)
        p_inst = self.registry.get(decision.prefill_id)
        d_inst = self.registry.get(decision.decode_id)
        if p_inst is None or d_inst is None:
            return error_response(503, "scheduler chose an instance that was just removed; retry",
                                  "service_unavailable", request_id=rid, retry_after=1)
        key = (p_inst.instance_id, d_inst.instance_id)
        ctr = self._decision_ctr.get(key)
        if ctr is None:
            ctr = self._decision_ctr[key] = self.metrics.decisions.labels(self.cfg.policy, *key)
        ctr.inc()
        if decision.cached_blocks:
            self.metrics.cached_blocks.inc(decision.cached_blocks)
        if req.block_hashes:
            pc = self._prefix_ctr.get(p_inst.instance_id)
            if pc is None:
                pc = self._prefix_ctr[p_inst.instance_id] = (
                    self.metrics.prompt_blocks.labels(p_inst.instance_id),
                    self.metrics.prompt_cached_blocks.labels(p_inst.instance_id))
            pc[0].inc(len(req.block_hashes))
            if decision.cached_blocks:
                pc[1].inc(decision.cached_blocks)
        if log.isEnabledFor(logging.DEBUG):  # predicted vs realized TTFT, request by request (the SLO bench)
            log.debug("admitted", extra={"request_id": rid, **admitted_fields(
                self.cluster, decision, req, p_inst.instance_id, d_inst.instance_id, now)})
        return await self._run_pair(request, route, rid, body, req, decision, p_inst, d_inst, t0, pinfo.token_ids)

    def _inflight(self, inst: Instance, delta: int) -> None:
        inst.in_flight += delta
        if self.registry.get(inst.instance_id) is not inst:
            return  # removed meanwhile: do not resurrect its metric series
        g = self._inflight_gauge.get(inst.instance_id)
        if g is None:
            g = self._inflight_gauge[inst.instance_id] = self.metrics.in_flight.labels(inst.instance_id, inst.role)
        g.set(inst.in_flight)

    async def _run_pair(self, request: web.Request, route: str, rid: str, body: dict[str, Any],
                        req: Any, decision: Any, p: Instance, d: Instance, t0: float,
                        token_ids: Any = None) -> web.StreamResponse:
        headers = forward_headers(request, rid)
        ho = self.handoff
        ctx = ho.new_context(rid)
        cluster = self.cluster
        now = time.monotonic
        c_dec = self.scheduler.decode_contention(d.instance_id)  # as when est_tbt_s was made (before this prefill)
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
        cal = self.calibrator
        # the scheduler's estimates were made with each instance's factors in force now: undo them
        # for the sample
        f_pre, f_dec = ((cal.factor("prefill", p.instance_id), cal.factor("decode", d.instance_id))
                        if cal is not None else (1.0, 1.0))
        t_sent = now()
        busy_sent = cluster.busy_area(t_sent)  # the contention the prefill runs under (contention.py)
        pairs = self.cfg.prefill_contention in ("pairs", "groups")  # groups: the others learn pairs
        # which instances slow this prefill (contention.py): the other prefills and the decodes
        busy_times_sent = ({**cluster.busy_times(t_sent), **cluster.decode_busy_times(t_sent)}
                           if pairs and cal is not None else None)
        t_answered: float | None = None  # perf_counter of the prefill's answer (sequential hand-off)
        timing = StreamTiming() if cal is not None else None
        try:
            pheaders = headers
            if ho.needs_engine_id:
                await self._resolve_engine_id(p, ctx)
                extra = ho.prefill_headers(ctx)
                if extra:
                    pheaders = {**headers, **extra}
            ppayload = ho.prefill_payload(body, route, p.addr, ctx)
            src = decision.remote_source
            if src == self.sched_mod.STORE and decision.remote_blocks:
                ppayload = with_store_hint(ppayload, decision, self.cfg.block_size)
            elif src is not None and decision.remote_blocks and self.cfg.peer_prefix:
                ppayload = await with_peer_prefix(self, ppayload, body, decision, token_ids, headers, rid)
            prefix: bytes | None = None
            rewrite: ftok.UsageShift | None = None
            if not ho.is_concurrent(p.addr):
                first = self._first_token_wanted(body, route, rid)
                if first:
                    ppayload = ftok.prefill_body(ppayload, body)
                presp = await self.relay.post_json(p, route, ppayload, pheaders, "prefill")
                t_done = now()
                prefill_finished()
                if cal is not None:
                    t_answered = time.perf_counter()
                    self._calibrated("prefill", cal.observe_prefill(
                        decision.est_ttft_s / f_pre, t_done - t_sent, t_done, p.instance_id,
                        None if pairs else _mean_other_busy(cluster, busy_sent, t_sent, t_done),
                        _busy_shares(cluster, busy_times_sent, t_sent, t_done, decodes=True)
                        if busy_times_sent is not None else None))
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
                    self.metrics.first_token.labels("fallback").inc()
                    log.warning("--prefill-first-token: the prefill's answer has no token ids (an engine "
                                "without return_token_ids?); normal hand-off",
                                extra={"request_id": rid, "instance": p.url})
                if ft is not None and not ftok.needs_decode(body, ft):
                    self.metrics.first_token.labels("prefill_only").inc()
                    return await self.relay.send_sse(request, route, rid, t0, ftok.first_chunks(body, ft, final=True))
                rejected = self._decode_stage_check(d, req)
                if rejected is not None:
                    return rejected
                dbody = body
                if ft is not None:
                    self.metrics.first_token.labels("streamed").inc()
                    prefix, rewrite = ftok.first_chunks(body, ft, final=False), ftok.UsageShift(ft)
                    dbody = ftok.decode_body(body, ft)
                dpayload = ho.decode_payload(dbody, route, p.addr, ctx, presp)
            else:
                ptask = asyncio.create_task(self.relay.post_json(p, route, ppayload, pheaders, "prefill"))

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
                    return await self.relay.stream_decode(request, route, d, dpayload, headers, rid, t0, None,
                                                          timing, prefix=prefix, rewrite=rewrite)
                return await self.relay.race_decode(request, route, d, dpayload, headers, rid, t0, ptask, timing)
            finally:
                self._inflight(d, -1)
                cluster.on_decode_done(d.instance_id, req, now())
                if hq is not None:
                    hq.dropped(req.request_id)  # no first token came (a no-op when one did)
                if cal is not None and timing is not None:
                    if t_answered is not None and timing.chunks:
                        cal.observe_first_token(d.instance_id, timing.first - t_answered, now())
                        self._sync_first_token()
                    if (gap := timing.gap_quantile(0.9)) is not None:  # the TBT SLO is a p90 (relay.py)
                        t_end = now()
                        self._calibrated("decode", cal.observe_decode(
                            decision.est_tbt_s / (f_dec * c_dec), gap, t_end, d.instance_id,
                            _busy_shares(cluster, busy_decode, t_decode, t_end)))
        finally:
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
        if not self.cfg.prefill_first_token:
            return False
        why = ftok.ineligible(body, route)
        if why is None:
            return True
        self.metrics.first_token.labels("ineligible").inc()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("--prefill-first-token: normal hand-off", extra={"request_id": rid, "reason": why})
        return False

    def _decode_stage_check(self, d: Instance, req: Any) -> web.StreamResponse | None:
        """``--rejection decode`` / ``early+decode``: the paper's baseline check once the prefill is
        done -- a 429 when decode ``d``'s current batch plus this request would break --tbt-slo.
        The prefill's KV is then never pulled; the P2P connector's lease frees it."""
        limit = self.decode_tbt_limit
        if limit is None:
            return None
        rej = self.sched_mod.decode_stage_rejection(self.cluster, self.scheduler.cost_for(d.instance_id),
                                                    d.instance_id, req, limit,
                                                    self.cfg.retry_after,
                                                    self.scheduler.decode_contention(d.instance_id))
        if rej is None:
            return None
        self.metrics.rejections.labels("slo_decode").inc()
        rid = req.request_id.rsplit("#", 1)[0]
        return error_response(429, f"overloaded, request rejected after its prefill: {rej.reason}",
                              "rate_limit_exceeded", request_id=rid, retry_after=rej.retry_after_s)

    def _calibrated(self, side: str, changed: bool) -> None:
        """Install the recalibrated cost models (shared and per instance) in the scheduler when a
        factor moved."""
        cal = self.calibrator
        if changed and cal is not None:
            self.scheduler.cost = cal.cost()
            self.scheduler.instance_costs = cal.costs()
            self.scheduler.contention_slope = cal.slope("prefill")
            self.scheduler.interference = cal.interference()
            self.scheduler.prefill_interference = cal.prefill_interference()
            self.metrics.cost_factor.labels(side).set(cal.factor(side))
            if side == "prefill":
                self.metrics.contention_slope.labels(side).set(cal.slope(side))
                for group, e in cal.groups.exponents().items():
                    self.metrics.hardware_share_exponent.labels(group).set(e)
                for pid, coef in self.scheduler.prefill_interference.items():
                    self._pairs_shown.update((pid, other) for other in coef)
                for pid, other in self._pairs_shown:
                    if pid in self.cluster and other in self.cluster:
                        self.metrics.prefill_interference.labels(pid, other).set(
                            self.scheduler.prefill_interference.get(pid, {}).get(other, 0.0))
            else:  # every pair shown once keeps a series: 0 once its coefficient is gone
                coefs = self.scheduler.interference
                for did, coef in coefs.items():
                    self._interference_shown.update((did, pid) for pid in coef)
                for did, pid in self._interference_shown:
                    if did in self.cluster and pid in self.cluster:
                        self.metrics.decode_interference.labels(did, pid).set(coefs.get(did, {}).get(pid, 0.0))
            for key, f in cal.instance_factors().items():
                g = self._factor_gauge.get(key)
                if g is None:
                    if key[1] not in self.cluster:
                        continue
                    g = self._factor_gauge[key] = self.metrics.instance_cost_factor.labels(key[1], key[0])
                g.set(f)

    def _sync_first_token(self) -> None:
        """Copy the calibrator's first-token delays into the decode loads the TTFT check reads."""
        assert self.calibrator is not None
        for iid, s in self.calibrator.first_token_all().items():
            if iid in self.cluster:
                self.cluster.decode_load(iid).first_token_s = s
                self.metrics.first_token_delay.labels(iid).set(s)

    async def _resolve_engine_id(self, p: Instance, ctx: dict[str, Any]) -> None:
        """Fill ``dp_rank``/``remote_engine_id`` from the prefill's bootstrap server (cached)."""
        try:
            ids = await self.bootstrap.engine_ids(bootstrap_url(p.addr))
        except BootstrapError as e:
            self.metrics.upstream_errors.labels(p.instance_id, "bootstrap").inc()
            err = UpstreamError(502, f"prefill instance {p.url}: {e}", "upstream_error", p)
            # Nothing was sent yet: take the instance out (health checks bring it back) and let
            # the request try another prefill instance.
            self.set_healthy(p, False, str(e))
            err.retryable = True
            raise err from None
        ctx["dp_rank"], ctx["remote_engine_id"] = ids.pick()

    async def _models(self, request: web.Request) -> web.Response:
        # Unknown (not yet probed) instances are asked too: each call has its own timeout.
        insts = [i for r in ("decode", "prefill") for i in self.registry.all(r)
                 if i.health.state is not HealthState.DOWN]

        async def one(inst: Instance) -> list[dict[str, Any]]:
            try:
                timeout = aiohttp.ClientTimeout(total=self.cfg.health_timeout)
                async with self.relay.session().get(inst.url + "/v1/models", timeout=timeout) as r:
                    if r.status != 200:
                        return []
                    data = _dec.decode(await r.read())
                    return list(data.get("data", [])) if isinstance(data, dict) else []
            except (asyncio.TimeoutError, aiohttp.ClientError, msgspec.DecodeError):
                return []

        seen: dict[str, dict[str, Any]] = {}
        for lst in await asyncio.gather(*(one(i) for i in insts)):
            for m in lst:
                if isinstance(m, dict) and "id" in m:
                    seen.setdefault(str(m["id"]), m)
        self._count("/v1/models", 200)
        return web.json_response({"object": "list", "data": list(seen.values())})

    async def _healthcheck(self, request: web.Request) -> web.Response:
        return web.json_response({
            "status": "ok",
            "prefill_instances": len(self.registry.healthy("prefill")),
            "decode_instances": len(self.registry.healthy("decode")),
        })

    def _unavailable_reason(self, role: str) -> str:
        insts = self.registry.all(role)
        if not insts:
            return f"no {role} instance registered"
        states = "; ".join(f"{i.url} {i.health.describe()}" for i in insts)
        return f"no healthy {role} instance ({len(insts)} registered: {states})"

    async def _health(self, request: web.Request) -> web.Response:
        """200 when the proxy can serve (a healthy prefill and decode instance), else 503 with
        the reason and every instance's state, so an operator sees *why* at one glance."""
        p, d = len(self.registry.healthy("prefill")), len(self.registry.healthy("decode"))
        ok = p > 0 and d > 0
        reasons = [self._unavailable_reason(r) for r, n in (("prefill", p), ("decode", d)) if n == 0]
        body: dict[str, Any] = {
            "status": "ok" if ok else "unavailable", "can_serve": ok, "prefill_instances": p,
            "decode_instances": d, "reasons": reasons,
            "instances": [{"id": i.instance_id, "role": i.role, "state": i.health.state.value,
                           "last_error": i.last_error} for i in self.registry.all()]}
        return web.json_response(body, status=200 if ok else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        self.refresh_load_gauges()
        return web.Response(body=self.metrics.render(), content_type="text/plain",
                            headers={"X-Content-Type-Options": "nosniff"})

    def refresh_load_gauges(self) -> None:
        """Load gauges are read from the scheduler's state at scrape time (no hot-path cost)."""
        m = self.metrics
        m.prefill_queued_tokens.clear()
        m.decode_running.clear()
        for inst in self.registry.all():
            if inst.role == "prefill":
                m.prefill_queued_tokens.labels(inst.instance_id).set(
                    self.cluster.prefill_load(inst.instance_id).queued_tokens)
            else:
                m.decode_running.labels(inst.instance_id).set(self.cluster.decode_load(inst.instance_id).running)


def install_uvloop() -> bool:
    """Use uvloop when installed (faster loop, fewer µs per request)."""
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


async def start_server(cfg: ProxyConfig | ProxyServer, host: str,
                       port: int) -> tuple[ProxyServer, web.AppRunner, int]:
    """Start in the running loop (tests, embedding); returns the bound port (``port=0`` picks one)."""
    server = cfg if isinstance(cfg, ProxyServer) else ProxyServer(cfg)
    cfg = server.cfg
    ssl_context = server_context(cfg.tls_cert, cfg.tls_key)  # ValueError naming the flag
    app = server.make_app()
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True, ssl_context=ssl_context)
    await site.start()
    bound = port
    for s in runner.addresses:
        bound = s[1]
        break
    scheme = "https" if ssl_context is not None else "http"
    log.info("proxy listening", extra={"url": f"{scheme}://{host}:{bound}", "admin_auth": bool(cfg.admin_key),
                                       "tls": ssl_context is not None})
    warn = auth.exposure_warning("the proxy's admin API", host, cfg.admin_key,
                                 "add, remove and redirect the instances requests go to")
    if warn:
        log.warning(warn, extra={"host": host, "port": bound})
    return server, runner, bound
