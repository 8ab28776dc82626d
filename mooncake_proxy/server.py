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
from dataclasses import replace
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from mooncake_core import auth
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.tls import server_context

from . import scheduling
from .admin import AdminApi
from .admission_log import admitted_fields
from .bootstrap import BootstrapDirectory, BootstrapError
from .calibration_loop import CalibrationLoop
from .config import ProxyConfig
from .dashboard import ProxyDashboard
from .errors import error_response
from .handoff import HandoffProtocol, make_handoff
from .handoff.mooncake import bootstrap_url
from .health import HealthChecker
from .health_state import HealthState, ProbePolicy
from .metrics import ProxyMetrics
from .pipeline import PairPipeline, PipelineSettings
from .prefix_hints import PeerPrefixExporter, with_store_hint
from .prompt import BadRequest, PromptHasher
from .registry import Instance, Registry, normalize_url
from .relay import Relay, RelayTimeouts, UpstreamError

log = get_logger("mooncake_proxy.server")

_dec = msgspec.json.Decoder()

COMPLETION_ROUTES = ("/v1/completions", "/v1/chat/completions", "/generate")
__all__ = ["COMPLETION_ROUTES", "ProxyConfig", "ProxyServer", "UpstreamError", "install_uvloop", "start_server",
           "with_store_hint"]


def _hardware_groups(cfg: ProxyConfig) -> "scheduling.HardwareGroups":
    """--hardware-group: the instances (by URL) that share hardware, for the scheduler's and the
    calibrator's processor sharing (contention.HardwareGroups). ValueError naming the URL or
    the flag that is wrong."""
    if cfg.prefill_contention == "groups" and not cfg.hardware_groups:
        raise ValueError("--prefill-contention groups needs at least one --hardware-group (the instance URLs "
                         "that share one piece of hardware)")
    if cfg.hardware_groups and cfg.prefill_contention != "groups":
        raise ValueError(f"--hardware-group needs --prefill-contention groups (got {cfg.prefill_contention!r})")
    by_url = {normalize_url(u): Registry.make_id(role, u)
              for role, urls in (("prefill", cfg.prefill_urls), ("decode", cfg.decode_urls)) for u in urls}
    ids: list[list[str]] = []
    for group in cfg.hardware_groups:
        ids.append([])
        for url in group:
            iid = by_url.get(normalize_url(url))
            if iid is None:
                raise ValueError(f"--hardware-group: {url!r} is not a --prefill or --decode instance "
                                 f"(known: {sorted(by_url)})")
            ids[-1].append(iid)
    return scheduling.HardwareGroups(ids)


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
        slo, decode_tbt_limit = sched.split_rejection(slo, cfg.rejection)
        groups = _hardware_groups(cfg)
        self.cluster.track_head_busy = bool(groups)  # how far a head is along (Scheduler.head_done)
        self.metrics = ProxyMetrics()
        self.calibration = (CalibrationLoop(cost, self.cluster, self.metrics, groups, cfg.prefill_contention)
                            if cfg.calibrate else None)
        settings = sched.SchedulerSettings(
            prefill_batch_tokens=cfg.prefill_batch_tokens,
            queue_margin=cfg.ttft_queue_margin if cfg.calibrate else 0.0,
            recent_busy_tau=cfg.recent_busy_tau, hardware_groups=groups)
        self.scheduler = sched.make_scheduler(
            cfg.policy, self.cluster, cost, slo, seed=cfg.seed, settings=settings,
            latency=self.calibration.board if self.calibration is not None else None)
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
            zmq_kw = (dict(endpoint=cfg.store_kv_events or "", replay_endpoint=cfg.store_kv_events_replay)
                      if cfg.store_view == "zmq" else {})
            self.store_view = make_store_view(cfg.store_view, cfg.store_master, **zmq_kw)
            self.cluster.set_store_view(self.store_view)
        else:
            hasher = sched.BlockHasher(block_size=cfg.block_size)
        self.hasher = PromptHasher(hasher, tokenize, chat_tokenize)
        self.handoff: HandoffProtocol = make_handoff(cfg.handoff)
        self.registry = Registry()
        self.session: aiohttp.ClientSession | None = None
        self.health: HealthChecker | None = None
        self.probe_policy = ProbePolicy(interval=max(0.0, cfg.health_interval),
                                        timeouts_to_down=cfg.health_timeouts_to_down)
        self.bootstrap = BootstrapDirectory(lambda: self.session, cfg.health_timeout)
        self.relay = Relay(lambda: self.session, RelayTimeouts(cfg.request_timeout, cfg.connect_timeout),
                           self.metrics, lambda inst, why: self.set_healthy(inst, False, why),
                           lambda route, s: self.metrics.route_hist("ttft", route).observe(s))
        self.kv_events: Any = None
        if cfg.kv_events_config:  # parse now: a bad config fails before the port is bound
            from .kv_events import KvEventsSubscriber

            self.kv_events = KvEventsSubscriber.from_config(
                cfg.kv_events_config, registry=self.registry, cluster=self.cluster,
                hasher=self.hasher.hasher, events=self.metrics.kv_events)
        peer = (PeerPrefixExporter(self.registry, self.relay, self.metrics, cfg.block_size, cfg.peer_prefix_timeout)
                if cfg.peer_prefix else None)
        self.pipeline = PairPipeline(
            PipelineSettings(cfg.block_size, cfg.retry_after, cfg.prefill_first_token, decode_tbt_limit),
            self.cluster, self.scheduler, self.registry, self.handoff, self.relay, self.metrics, self.calibration,
            peer, self._resolve_engine_id)
        self._seq = 0
        bports = list(cfg.prefill_bootstrap_ports)
        for i, url in enumerate(cfg.prefill_urls):
            self.add_instance("prefill", url, bports[i] if i < len(bports) else None)
        for url in cfg.decode_urls:
            self.add_instance("decode", url)
        if groups:
            log.info("hardware groups declared", extra={"groups": groups.groups()})

    # ------------------------------------------------------------------ instances
    def add_instance(self, role: str, url: str, bootstrap_port: int | None = None) -> Instance:
        inst = self.registry.add(role, url, bootstrap_port)
        self.cluster.add_instance(self.sched_mod.InstanceInfo(
            instance_id=inst.instance_id, role=inst.role,
            cache_capacity_blocks=self.cfg.cache_blocks if role == "prefill" else self.cfg.decode_kv_blocks))
        if role == "decode" and self.calibration is not None:  # the hand-off as a queue (handoff_queue.py)
            self.cluster.decode_load(inst.instance_id).handoff = self.sched_mod.HandoffQueue()
        # Not schedulable until its first answered /health (probed at once, see health.py).
        self.cluster.set_healthy(inst.instance_id, False)
        self.metrics.instance_added(inst.instance_id, role)
        log.info("instance added", extra={"instance": inst.instance_id})
        if self.health is not None:
            self.health.wake()
        return inst

    def remove_instance(self, instance_id: str) -> Instance:
        inst = self.registry.remove(instance_id)
        self.cluster.remove_instance(instance_id)
        self.scheduler.hardware_groups.forget(instance_id)
        if self.calibration is not None:
            self.calibration.forget(instance_id)
        self._forget_bootstrap(inst)
        self.metrics.forget_instance(instance_id, inst.role)
        log.info("instance removed", extra={"instance": instance_id})
        return inst

    def drain_instance(self, instance_id: str) -> Instance:
        """Take ``instance_id`` out of scheduling for good (health probes do not bring it back);
        requests already on it finish. KeyError names the known ids. ``Instance.drain_status``
        says when it is safe to stop; ``remove_instance`` then forgets it."""
        inst = self.registry.get(instance_id)
        if inst is None:
            raise KeyError(f"no instance {instance_id!r}; known: {sorted(i.instance_id for i in self.registry.all())}")
        if not inst.draining:
            inst.start_drain(time.monotonic())
            self.cluster.set_healthy(instance_id, False)
            log.info("instance draining", extra={"instance": instance_id, "active": inst.active})
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
        self.cluster.set_healthy(inst.instance_id, ok and not inst.draining)
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
        ProxyDashboard(self.registry, self.cluster, self.metrics, self.refresh_load_gauges, self.cfg.policy,
                       self.cfg.handoff).register(app)
        AdminApi(self.registry, self.add_instance, self.remove_instance, self._probe_now,
                 self.cfg.admin_key, self.prefix_view, drain=self.drain_instance).register(app)
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

    # ------------------------------------------------------------------ routes
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "/v1/completions")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "/v1/chat/completions")

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "/generate")

    async def _handle(self, request: web.Request, route: str) -> web.StreamResponse:
        t0 = time.perf_counter()
        # bare hex: engines prefix it themselves (vLLM answers with id "cmpl-" + X-Request-Id)
        rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        try:
            resp = await self._handle_inner(request, route, rid, t0)
        except asyncio.CancelledError:
            # Client went away: aiohttp cancelled us; leaving the `async with` blocks closed the
            # upstream connections, which is what cancels the work on the engines.
            self.metrics.count_request(route, 499)
            log.info("client disconnected; upstream requests cancelled", extra={"request_id": rid})
            raise
        except ConnectionResetError:
            self.metrics.count_request(route, 499)  # client vanished while we were writing to it
            raise
        except Exception as e:  # a bug must not become an opaque 500 text or a hang
            log.exception("internal error", extra={"request_id": rid})
            resp = error_response(500, f"proxy internal error: {type(e).__name__}: {e}", "internal_error",
                                  request_id=rid)
        self.metrics.count_request(route, resp.status)
        self.metrics.route_hist("e2e", route).observe(time.perf_counter() - t0)
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
        if self.calibration is not None:
            self.calibration.tick(now)
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
        self.metrics.decided(self.cfg.policy, p_inst.instance_id, d_inst.instance_id)
        if decision.cached_blocks:
            self.metrics.cached_blocks.inc(decision.cached_blocks)
        if req.block_hashes:
            self.metrics.prompt_sent(p_inst.instance_id, len(req.block_hashes), decision.cached_blocks)
        if log.isEnabledFor(logging.DEBUG):  # predicted vs realized TTFT, request by request (the SLO bench)
            log.debug("admitted", extra={"request_id": rid, **admitted_fields(
                self.cluster, decision, req, p_inst.instance_id, d_inst.instance_id, now)})
        return await self.pipeline.run(request, route, rid, body, req, decision, p_inst, d_inst, t0, pinfo.token_ids)

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
        self.metrics.count_request("/v1/models", 200)
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
    try:
        await site.start()
    except OSError:
        await runner.cleanup()  # the app started (health checks, HTTP session): stop it again
        raise
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
