"""``MooncakeCoreConnector``: vLLM KV connector (V1 API, vLLM 0.32) for disaggregated prefill/decode.

Targets ``vllm/distributed/kv_transfer/kv_connector/v1/base.py`` of vLLM 0.32.0
(``KVConnectorBase_V1``, constructor ``(vllm_config, role, kv_cache_config)``).

How a request flows (pull model, like vLLM's NixlConnector, on our Transfer Engine):

1. The proxy sends the prompt to the **prefill** instance with ``max_tokens=1`` and
   ``kv_transfer_params={"do_remote_decode": true}``. When it finishes, the prefill's
   scheduler-side ``request_finished`` keeps the request's KV blocks alive (returns True) and
   returns ``kv_transfer_params``: the prefill worker's Transfer Engine segment, the block ids,
   a fresh ``mooncake_transfer_id`` and a lease expiry (``params.RemotePrefill``).
2. The proxy sends the original request plus those params to the **decode** instance. Its
   scheduler-side ``get_num_new_matched_tokens`` reports the prompt tokens it lacks as loadable
   asynchronously; ``update_state_after_alloc`` records which fresh local blocks receive them;
   ``build_connector_meta`` hands that to the worker.
3. The decode worker's ``start_load_kv`` submits one asynchronous READ batch per request
   through the Transfer Engine (same-host peers: cross-memory attach; otherwise tcp), block
   granular, contiguous runs merged. ``get_transfer_results`` polls the batches; a finished
   request is reported in ``finished_recving`` and the prefill is notified (TE notification
   named by the transfer id). A failed one is also reported in ``failed_recving`` and its
   blocks in ``get_block_ids_with_load_errors`` so vLLM's ``kv_load_failure_policy``
   (``fail`` -> the client gets an error; ``recompute`` -> decode recomputes) applies.
4. The prefill worker's ``get_transfer_results`` drains notifications and reports the request
   in ``finished_sending`` (vLLM frees its blocks) -- or does so when the lease expires, so a
   vanished decode never leaks blocks. A decode refuses to read after the lease expiry.

Concurrent hand-off (``mooncake_proxy --handoff mooncake-core``): the proxy sends both requests
at once with a transfer id it chose; the prefill's params carry that id, the decode's carry it
and the prefill's segment (``params.concurrent_*_params``). The decode allocates its blocks at
once and its worker sends the prefill a ``want`` notification (its own segment); the prefill
worker answers with ``ready`` (the ``RemotePrefill`` params) as soon as the request finished --
whichever of the two comes second triggers it (``leases.Rendezvous``) -- and the decode reads
on receipt, in the same step. So the decode's HTTP/API-server path overlaps the prefill's compute
and the prefill's answer no longer travels proxy -> decode before the read starts. A decode
that gets no ``ready`` within ``want_retry_s`` asks again (the prefill answers every ``want``
once it finished, so a lost ``ready`` costs one retry interval); one that gets none within
``prefill_wait_s`` fails the load (``kv_load_failure_policy``).
Reads up to ``sync_load_max_bytes`` run inside the step (no thread hand-off, reported by the
same step); a request aborted while loading keeps its blocks until no read can write them.

Scheduler-side methods (run in the scheduler of each instance): ``get_num_new_matched_tokens``,
``update_state_after_alloc``, ``build_connector_meta``, ``request_finished``,
``set_xfer_handshake_metadata``. Worker-side methods (run in each worker): ``register_kv_caches``,
``get_handshake_metadata``, ``start_load_kv``, ``wait_for_layer_load``, ``save_kv_layer``,
``wait_for_save``, ``get_finished`` / ``get_transfer_results``, ``get_block_ids_with_load_errors``,
``shutdown``. They talk only through ``MooncakeConnectorMetadata`` (scheduler -> worker each step)
and the handshake metadata (worker -> scheduler once at start).

Configuration (``--kv-transfer-config`` ``kv_connector_extra_config``): ``local_hostname``
(default env ``MOONCAKE_LOCAL_HOSTNAME`` or 127.0.0.1: the address peers use to reach this
worker), ``metadata_server`` (default ``P2PHANDSHAKE``: no metadata service needed),
``protocol`` (tcp), ``kv_lease_s`` (default 30: how long a prefill holds blocks for a decode),
``sync_load_max_bytes`` (default 4 MiB: a request's KV up to this size is read inside the step
that starts it and reported received by that same step; 0 makes every read asynchronous),
``prefill_wait_s`` (default 120: concurrent hand-off, how long a decode waits for ``ready``),
``want_retry_s`` (default 5: concurrent hand-off, how long before a decode asks again),
``idle_wait_ms`` (default 50: how long a worker may sleep, woken by the Transfer Engine, in a step
without scheduled tokens while transfers are outstanding; 0 = busy polling; ``idle.py``).
Tensor parallelism (``tensor_parallel_size`` N on either side): every worker registers its own
KV slice (its KV heads) with its own Transfer Engine segment and reports it in the handshake
(``MooncakeHandshake``, keyed by TP rank); the prefill's params list every rank's segment
(``mooncake_segments``, rank order). Decode rank r reads from the prefill rank(s) holding its
heads (``tp.rank_plan``): the same rank when both TPs match; with prefill TP = k x decode TP
(e.g. 2 -> 1) the k prefill ranks' blocks fill the k head slices of each local block; with
decode TP = k x prefill TP (e.g. 1 -> 2) decode rank r reads its head slice of prefill rank
r // k's blocks, and that prefill rank frees them once all k decode ranks confirmed (the count
travels in the confirmation, ``mooncake_core.pd.notify``). vLLM frees a prefill's blocks once every
prefill rank reported them sent and runs a decode request once every decode rank reported it
received (``KVOutputAggregator``). TPs that are not multiples of each other, or a head slice of
a layout that is not head-outer, are refused with a log line naming both TPs (the decode
computes the prompt). (The tests' negative control -- received KV overwritten with noise --
is a subclass in ``tests/vllm/corrupting_connector.py``; this connector has no test switch.)
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorHandshakeMetadata,
                                                                KVConnectorMetadata, KVConnectorRole,
                                                                KVConnectorTransferResults)
from vllm.logger import init_logger
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from mooncake_core import envs
from mooncake_connectors.vllm import stats as S
from mooncake_connectors.vllm.connector_stats import P2P_PROM, StatsHook
from mooncake_connectors.vllm.idle import IDLE_WAIT_MS, idle_wait_s
from mooncake_connectors.vllm.layout import (Slab, coalesce, heads_outer, pair_blocks, plan,
                                             remote_slabs_from_regions, slabs_of)
from mooncake_connectors.vllm.leases import Rendezvous, SendTracker
from mooncake_core.pd import notify
from mooncake_core.pd.notify import Confirmation, NotifyError, Ready, Want
from mooncake_core.pd.params import (ParamsError, PendingPrefill, RemotePrefill, chosen_transfer_id, is_pending,
                                     new_transfer_id, parse_pending, tokens_digest, wants_remote_decode,
                                     wants_remote_prefill)
from mooncake_connectors.vllm.p2p_messages import MooncakeConnectorMetadata, MooncakeHandshake, RecvReq, SendReq
from mooncake_core.pd.peer_prefix import PEER_KEY, has_peer_prefix, parse_peer_prefix
from mooncake_connectors.vllm.tp import (KVShard, RankPlan, TPMismatch, notify_targets, rank_hostname, rank_plan,
                                         readers)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

# Under the "vllm" logger so records go to vLLM's handlers (same format and level as the server's own).
logger = init_logger("vllm.mooncake_core.p2p_connector")

#: A decode does not start a read this close to the prefill's lease expiry (the blocks may be
#: freed and reused mid-read); it recomputes or fails per policy instead.
LEASE_MARGIN_S = 2.0


#: Default ``sync_load_max_bytes``: a request's KV up to this size is read synchronously inside
#: the decode's step (about a millisecond over cross-memory attach; it delays that step's other
#: requests by as much), larger ones asynchronously while the engine keeps stepping.
SYNC_LOAD_MAX_BYTES = 4 << 20
#: Default ``prefill_wait_s``: how long a decode of the concurrent hand-off waits for the prefill's
#: ``ready`` before giving up on the transfer (then ``kv_load_failure_policy`` applies).
PREFILL_WAIT_S = 120.0
#: Default ``want_retry_s``: a decode of the concurrent hand-off that has no ``ready`` after this
#: long asks again. A ``ready`` can be lost: it is the prefill's first contact with the decode's
#: segment, which may fail on a loaded box, and nothing else would ever resend it.
WANT_RETRY_S = 5.0


def _extra(vllm_config: "VllmConfig", key: str, default: Any) -> Any:
    return vllm_config.kv_transfer_config.get_from_extra_config(key, default)


def _tp_rank() -> int:
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return get_tensor_model_parallel_rank()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


# =====================================================================================  connector
class MooncakeCoreConnector(StatsHook, KVConnectorBase_V1):
    """vLLM KV connector V1 moving KV blocks between instances over the Mooncake Transfer Engine."""

    PROM = P2P_PROM  # series of vLLM's KV connector stats hook (connector_stats.py)

    _cache_hit_source = CacheHitSource.P2P

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig | None" = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.engine_id: str = vllm_config.kv_transfer_config.engine_id or "mooncake"
        if role == KVConnectorRole.SCHEDULER:
            self._sched: _Scheduler | None = _Scheduler(vllm_config, self.engine_id)
            self._worker: _Worker | None = None
        else:
            self._sched = None
            self._worker = _Worker(vllm_config, self.engine_id, kv_cache_config)

    # ---------------------------------------------------------------- scheduler side
    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        assert self._sched is not None
        return self._sched.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        assert self._sched is not None
        self._sched.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        assert self._sched is not None
        return self._sched.build_connector_meta(getattr(scheduler_output, "total_num_scheduled_tokens", 1) == 0)

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self._sched is not None
        return self._sched.request_finished(request, block_ids)

    def set_xfer_handshake_metadata(self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        if self._sched is not None:
            self._sched.set_handshake(metadata)

    def update_connector_output(self, connector_output: Any) -> None:
        super().update_connector_output(connector_output)
        if self._sched is not None:
            self._sched.update_connector_output(connector_output)

    def get_loaded_kv_cache_group_ids(self, request: "Request") -> tuple[int, ...]:
        # We transfer the request's own blocks, so every group is restored.
        return tuple(range(len(self._kv_cache_config.kv_cache_groups)))

    # ---------------------------------------------------------------- worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        assert self._worker is not None
        self._worker.register_kv_caches(kv_caches)

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        return self._worker.handshake() if self._worker is not None else None

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.start_load(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are whole-request and asynchronous (the request waits in WAITING_FOR_REMOTE_KVS)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: "AttentionMetadata",
                      **kwargs: Any) -> None:
        return  # pull model: the KV stays in the prefill's paged cache until the decode reads it

    def wait_for_save(self):
        return

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        r = self.get_transfer_results(finished_req_ids)
        return r.finished_sending or None, r.finished_recving or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        assert self._worker is not None
        return self._worker.poll()

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_load_errors() if self._worker is not None else set()

    def shutdown(self):
        if self._worker is not None:
            self._worker.shutdown()

    def stats_recorder(self) -> S.StatsRecorder | None:
        # vLLM 0.32's Scheduler.update_from_output asks the scheduler-side connector too
        # (vllm/v1/core/sched/scheduler.py: "Scheduler-side KV connector stats") and aggregates
        return self._worker.stats if self._worker is not None else self._sched.stats if self._sched else None


# =====================================================================================  scheduler
class _Scheduler:
    """Scheduler-side state of one instance (both roles: an instance may prefill and decode)."""

    def __init__(self, vllm_config: "VllmConfig", engine_id: str):
        self.engine_id = engine_id
        self.block_size = vllm_config.cache_config.block_size
        self.lease_s = float(_extra(vllm_config, "kv_lease_s", 30.0))
        self.tp_size = vllm_config.parallel_config.tensor_parallel_size
        self.hs: MooncakeHandshake | None = None  # rank 0's
        self.segments: tuple[str, ...] = ()  # every rank's, in rank order
        self._recv: list[RecvReq] = []
        self._send: dict[str, SendReq] = {}
        self._releases: list[tuple[tuple[str, ...], int, str]] = []
        self._cancels: list[str] = []
        self._loading: dict[str, float] = {}  # decode requests handed to the worker, not yet received: since
        self._peer: dict[str, RemotePrefill | None] = {}  # peer prefix hints checked, until allocation
        self.stats = S.StatsRecorder()  # what the scheduler decided (requests, blocks, waits): vLLM's stats hook

    def set_handshake(self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        ranks = []
        for r in range(self.tp_size):
            hs = metadata.get(r)
            if not isinstance(hs, MooncakeHandshake):
                raise ValueError(f"MooncakeCoreConnector: expected worker handshake metadata for TP rank {r} of "
                                 f"{self.tp_size}, got {metadata!r}")
            ranks.append(hs)
        if len({(h.block_bytes, h.num_slabs, h.kv_heads, h.heads_outer) for h in ranks}) != 1:
            raise ValueError(f"MooncakeCoreConnector: TP ranks report different KV layouts: {ranks!r}")
        if len({h.segment for h in ranks}) != len(ranks):
            raise ValueError(f"MooncakeCoreConnector: TP ranks share a Transfer Engine segment name: {ranks!r}")
        self.hs = ranks[0]
        self.segments = tuple(h.segment for h in ranks)
        logger.info("MooncakeCoreConnector scheduler: worker segments=%s block_bytes=%d slabs=%d kv_heads/rank=%d",
                    ",".join(self.segments), self.hs.block_bytes, self.hs.num_slabs, self.hs.kv_heads)

    def _parse(self, request: "Request") -> RemotePrefill | None:
        try:
            rp = RemotePrefill.from_params(request.kv_transfer_params)
        except ParamsError as e:
            logger.error("MooncakeCoreConnector: request %s: %s; computing the prompt locally instead",
                         request.request_id, e)
            return None
        return self._fits(request, rp)

    def _peer_prefix(self, request: "Request") -> RemotePrefill | None:
        """The request's checked peer prefix hint (``peer_prefix.py``), parsed once per request."""
        rid = request.request_id
        if rid not in self._peer:
            try:
                rp = parse_peer_prefix(request.kv_transfer_params, request.prompt_token_ids, self.block_size)
            except ParamsError as e:
                logger.warning("MooncakeCoreConnector: request %s: %s; computing the prefix here", rid, e)
                self._release_hint(request)
                self._peer[rid] = None
            else:
                self._peer[rid] = self._fits(request, rp)
                if self._peer[rid] is None:
                    self._release_hint(request)
        return self._peer[rid]

    def _release_hint(self, request: "Request") -> None:
        """Tell the peer of an unused peer prefix hint to free its blocks now (best effort: a
        hint too malformed to name its peer is left to the peer's lease)."""
        params = request.kv_transfer_params
        try:
            self._releases.append(_release_of(RemotePrefill.from_params(params.get(PEER_KEY))))
        except (ParamsError, AttributeError):
            pass

    def _fits(self, request: "Request", rp: RemotePrefill) -> RemotePrefill | None:
        if rp.block_size != self.block_size:
            logger.error("MooncakeCoreConnector: request %s: prefill block size %d != decode block size %d; "
                         "computing locally", request.request_id, rp.block_size, self.block_size)
            return None
        if self.hs is not None:
            try:
                for r in range(self.tp_size):
                    rank_plan(r, self.hs.shard(), remote_shard(rp))
            except TPMismatch as e:
                logger.error("MooncakeCoreConnector: request %s: prefill KV layout (TP %d, %d bytes/block/rank, %d "
                             "slabs) does not fit this decode's (TP %d, %d bytes/block/rank, %d slabs): %s; "
                             "computing locally", request.request_id, rp.tp_size, rp.block_bytes, rp.num_slabs,
                             self.tp_size, self.hs.block_bytes, self.hs.num_slabs, e)
                return None
        return rp

    def _parse_pending(self, request: "Request") -> PendingPrefill | None:
        try:
            return parse_pending(request.kv_transfer_params)
        except ParamsError as e:
            logger.error("MooncakeCoreConnector: request %s: %s; computing the prompt locally instead",
                         request.request_id, e)
            return None

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        params = request.kv_transfer_params
        if not wants_remote_prefill(params):
            if not has_peer_prefix(params):
                return 0, False
            rp = self._peer_prefix(request)  # a prefill loading a prefix a peer instance holds
            if rp is None:
                return 0, False
            return self._loadable(request, rp, num_computed_tokens)
        if is_pending(params):  # concurrent hand-off: the prefill computes the whole prompt
            if self._parse_pending(request) is None:
                return 0, False
            n = len(request.prompt_token_ids or ()) - num_computed_tokens
            return (n, True) if n > 0 else (0, False)
        rp = self._parse(request)
        if rp is None:
            return 0, False
        return self._loadable(request, rp, num_computed_tokens)

    def _loadable(self, request: "Request", rp: RemotePrefill, num_computed_tokens: int) -> tuple[int, bool]:
        if time.time() > rp.lease_expiry_unix - LEASE_MARGIN_S:
            logger.warning("MooncakeCoreConnector: request %s: the prefill's lease on transfer %s has expired; "
                           "computing locally", request.request_id, rp.transfer_id)
            return 0, False
        n = min(len(request.prompt_token_ids or ()), rp.num_tokens) - num_computed_tokens
        return (n, True) if n > 0 else (0, False)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        params = request.kv_transfer_params
        peer = not wants_remote_prefill(params)
        if peer and not has_peer_prefix(params):
            return
        if peer:
            pending, rp = None, self._peer_prefix(request)
            self._peer.pop(request.request_id, None)
        else:
            pending = self._parse_pending(request) if is_pending(params) else None
            rp = None if is_pending(params) else self._parse(request)
        who = pending or rp
        if who is not None:
            if num_external_tokens > 0:
                hashed = sum(1 for b in blocks.blocks[0] if b.block_hash is not None)
                ids = blocks.get_unhashed_block_ids()
                self._recv.append(RecvReq(request.request_id, rp, ids, hashed,
                                          pending, hashed * self.block_size + num_external_tokens))
                self._loading[request.request_id] = time.monotonic()
                self.stats.add(S.REMOTE_REQUESTS)
                self.stats.add(S.REMOTE_BLOCKS, len(ids))
                if peer and rp is not None:
                    logger.info("peer prefix request=%s transfer=%s from=%s blocks=%d", request.request_id,
                                rp.transfer_id, ",".join(rp.segments), len(ids))
            else:  # full local prefix hit (or lease gone): tell the prefill to free its blocks
                self._releases.append(_release_of(who))
                self.stats.add(S.REMOTE_LOCAL_HITS)
        if peer:
            params.pop(PEER_KEY, None)  # read at most once (a preempted request recomputes)
        else:
            params["do_remote_prefill"] = False  # exactly one transfer per request

    def build_connector_meta(self, idle: bool = False) -> MooncakeConnectorMetadata:
        meta = MooncakeConnectorMetadata(reqs_to_recv=self._recv, reqs_to_send=self._send,
                                         releases=self._releases, cancels=self._cancels, idle=idle)
        self._recv, self._send, self._releases, self._cancels = [], {}, [], []
        return meta

    def update_connector_output(self, output: Any) -> None:
        now = time.monotonic()
        for rid in output.finished_recving or ():
            t0 = self._loading.pop(rid, None)
            if t0 is not None:
                self.stats.observe(S.REMOTE_WAIT_SECONDS, now - t0)

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        from vllm.v1.request import RequestStatus

        params = request.kv_transfer_params
        if request.request_id in self._loading:
            # Aborted while its KV loads: keep the blocks (a read may be writing them) until the
            # worker reports the request received; it drops a read not yet started.
            del self._loading[request.request_id]
            self._cancels.append(request.request_id)
            return True, None
        if wants_remote_prefill(params):
            # Decode request finished (aborted) before its blocks were allocated: release the prefill.
            try:
                who = parse_pending(params) if is_pending(params) else RemotePrefill.from_params(params)
                self._releases.append(_release_of(who))
            except ParamsError:
                pass
            params["do_remote_prefill"] = False
            return False, None
        if has_peer_prefix(params):  # finished (aborted) before its blocks were allocated: free the peer's
            # (a hint checked and found unusable -- None -- was released then)
            if self._peer.pop(request.request_id, True) is not None:
                self._release_hint(request)
            params.pop(PEER_KEY, None)
        if not wants_remote_decode(params):
            return False, None
        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED):
            return False, None  # aborted prefill: nothing to hand off
        if not block_ids:
            return False, None
        if self.hs is None:
            logger.error("MooncakeCoreConnector: no worker handshake yet; cannot hand off request %s",
                         request.request_id)
            return False, None
        try:
            chosen = chosen_transfer_id(params)
        except ParamsError as e:
            logger.error("MooncakeCoreConnector: request %s: %s; not handing off", request.request_id, e)
            return False, None
        tid = chosen or new_transfer_id(self.engine_id, request.request_id)
        expiry = time.time() + self.lease_s
        rp = RemotePrefill(transfer_id=tid, segment=self.hs.segment, engine_id=self.engine_id,
                           request_id=request.request_id, block_ids=list(block_ids),
                           num_tokens=request.num_computed_tokens, block_size=self.block_size,
                           block_bytes=self.hs.block_bytes, num_slabs=self.hs.num_slabs, lease_expiry_unix=expiry,
                           segments=self.segments, kv_heads=self.hs.kv_heads, heads_outer=self.hs.heads_outer,
                           tokens_digest=tokens_digest((request.prompt_token_ids or ())[:request.num_computed_tokens]))
        out = rp.to_params()
        # concurrent hand-off: the worker sends these to the decode that asks for ``tid``
        self._send[request.request_id] = SendReq(tid, expiry, rp if chosen else None)
        self.stats.add(S.HANDOFF_REQUESTS)
        self.stats.add(S.HANDOFF_BLOCKS, len(block_ids))
        return True, out


def remote_shard(rp: RemotePrefill) -> KVShard:
    """The prefill's per-rank KV layout its params describe (whether its blocks are head-outer
    matters only to a decode with more TP ranks, which reads head slices of them)."""
    return KVShard(rp.tp_size, rp.block_bytes, rp.num_slabs, rp.kv_heads, rp.heads_outer)


def _release_of(who: RemotePrefill | PendingPrefill) -> tuple[tuple[str, ...], int, str]:
    if isinstance(who, RemotePrefill):
        return who.segments, who.tp_size, who.transfer_id
    return (who.segment,), 0, who.transfer_id  # concurrent hand-off: only the prefill's rank 0 is known


# =====================================================================================  worker
@dataclass
class _Pull:
    """One request's reads: one Transfer Engine batch per prefill rank read from (0: done in step)."""

    req: RecvReq
    batch_ids: list[int]
    nbytes: int
    nblocks: int
    started: float
    notify: list[str]  # prefill segments to confirm to
    readers: int = 1  # decode ranks confirming to each of them (tp.RankPlan.readers)
    codes: dict[int, int] = field(default_factory=dict)  # batch id -> final status

    def status(self, check: Any) -> int:
        """0 while any batch runs, then 1 if all completed, else the first failure's code."""
        for bid in self.batch_ids:
            if bid not in self.codes:
                code = check(bid)
                if code == 0:
                    return 0
                self.codes[bid] = code
        return next((c for c in self.codes.values() if c != 1), 1)


class _Worker:
    """Worker-side state: the Transfer Engine, registered KV slabs, in-flight pulls and held sends."""

    def __init__(self, vllm_config: "VllmConfig", engine_id: str, kv_cache_config: "KVCacheConfig | None"):
        from mooncake_core.engine import TransferEngine, TransferNotify

        self._notify_cls = TransferNotify
        self.engine_id = engine_id
        self.num_blocks = kv_cache_config.num_blocks if kv_cache_config is not None else None
        self.te = TransferEngine()
        self.tp_size = vllm_config.parallel_config.tensor_parallel_size
        self.tp_rank = _tp_rank() if self.tp_size > 1 else 0
        self.kv_heads = vllm_config.model_config.get_num_kv_heads(vllm_config.parallel_config)
        self._heads_outer = True
        host = _extra(vllm_config, "local_hostname", envs.MOONCAKE_LOCAL_HOSTNAME or "127.0.0.1")
        meta = _extra(vllm_config, "metadata_server", "P2PHANDSHAKE")
        host = rank_hostname(host, self.tp_rank, str(meta).strip().upper() == "P2PHANDSHAKE", _free_port)
        proto = _extra(vllm_config, "protocol", "tcp")
        rc = self.te.initialize(host, meta, proto, _extra(vllm_config, "device_name", ""))
        if rc != 0:
            raise RuntimeError(f"MooncakeCoreConnector: Transfer Engine initialize({host!r}, {meta!r}, {proto!r}) "
                               f"failed: {self.te.last_error}")
        self.segment = self.te.get_local_segment_name()
        self.slabs: list[Slab] = []
        self._remote: dict[str, list[Slab]] = {}
        self._pulls: list[_Pull] = []
        self._read_now: list[_Pull] = []  # finished synchronously this step (small reads)
        self.sync_load_max_bytes = int(_extra(vllm_config, "sync_load_max_bytes", SYNC_LOAD_MAX_BYTES))
        self._failed_now: list[RecvReq] = []
        self._load_errors: set[int] = set()
        self._sends = SendTracker()
        self._send_done: set[str] = set()
        self._held_since: dict[str, float] = {}
        # concurrent hand-off
        self.block_size = vllm_config.cache_config.block_size
        self.lease_s = float(_extra(vllm_config, "kv_lease_s", 30.0))
        self.prefill_wait_s = float(_extra(vllm_config, "prefill_wait_s", PREFILL_WAIT_S))
        self.want_retry_s = float(_extra(vllm_config, "want_retry_s", WANT_RETRY_S))
        self.idle_wait_ms = float(_extra(vllm_config, "idle_wait_ms", IDLE_WAIT_MS))
        self._idle_step = False  # this step schedules no tokens (MooncakeConnectorMetadata.idle)
        self._events_seen = 0  # te.notify_events() when the last poll drained the notifications
        self._rdv: Rendezvous[RemotePrefill] = Rendezvous()  # prefill: wants <-> finished requests
        # decode: transfer id -> (req, deadline, when to ask again)
        self._waiting: dict[str, tuple[RecvReq, float, float]] = {}
        self._cancelled: set[str] = set()                  # decode: aborted while an async read runs
        self._cancelled_now: list[str] = []                # decode: aborted before their read: report
        self._lock = threading.Lock()
        self._notifier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mooncake-kv-notify")
        self.stats = S.StatsRecorder()  # bytes, latency, failures: vLLM's stats hook collects them
        logger.info("MooncakeCoreConnector worker: Transfer Engine segment %s (metadata %s, TP rank %d of %d)",
                    self.segment, meta, self.tp_rank, self.tp_size)

    # ---------------------------------------------------------------- setup
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        slabs: list[Slab] = []
        where: dict[int, str] = {}  # slab base -> location: GPU KV caches (kv_buffer_device "cuda") are cuda:N
        for name, t in kv_caches.items():
            nb = self.num_blocks or t.shape[0]
            layer = slabs_of(t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.element_size(), nb)
            loc = f"cuda:{t.device.index or 0}" if t.device.type == "cuda" else "cpu:0"
            where.update((s.base, loc) for s in layer)
            self._heads_outer &= heads_outer(tuple(t.shape), nb, self.kv_heads)
            for s in layer:
                if s.stride != s.block_bytes:
                    raise ValueError(f"layer {name}: KV blocks are not packed (stride {s.stride} != block "
                                     f"{s.block_bytes} bytes); unsupported layout")
            slabs.extend(layer)
        if len({s.block_bytes for s in slabs}) != 1:
            raise ValueError("MooncakeCoreConnector: layers have different block sizes in bytes; unsupported")
        for s in slabs:
            if self.te.register_memory(s.base, s.nbytes, where[s.base]) != 0:
                raise RuntimeError(f"MooncakeCoreConnector: register_memory({s.base:#x}, {s.nbytes}) failed: "
                                   f"{self.te.last_error}")
        self.slabs = slabs
        logger.info("MooncakeCoreConnector worker: registered %d KV slabs of %d blocks x %d bytes (%s)",
                    len(slabs), slabs[0].num_blocks, slabs[0].block_bytes, self.segment)

    def handshake(self) -> MooncakeHandshake:
        if not self.slabs:
            raise RuntimeError("MooncakeCoreConnector: handshake requested before register_kv_caches")
        return MooncakeHandshake(segment=self.segment, block_bytes=self.slabs[0].block_bytes,
                                 num_slabs=len(self.slabs), tp_rank=self.tp_rank, tp_size=self.tp_size,
                                 kv_heads=self.kv_heads, heads_outer=self._heads_outer)

    # ---------------------------------------------------------------- decode: pulls
    def _remote_slabs(self, rp: RemotePrefill, segment: str) -> list[Slab]:
        # keyed by engine id too: a prefill restarted on the same port has a new layout
        key = f"{segment}|{rp.engine_id}"
        cached = self._remote.get(key)
        if cached is None:
            regions = [(a, n) for a, n, _loc in self.te.get_segment_buffers(segment)]
            cached = remote_slabs_from_regions(regions, rp.block_bytes, rp.num_slabs, segment)
            self._remote[key] = cached
            logger.info("MooncakeCoreConnector worker: peer %s reached over %s", segment,
                        self.te.transport_for(segment))
        return cached

    def shard(self) -> KVShard:
        return KVShard(self.tp_size, self.slabs[0].block_bytes, len(self.slabs), self.kv_heads, self._heads_outer)

    def _targets(self, segments: tuple[str, ...], remote_tp: int) -> list[str]:
        """The prefill segments this rank tells that it will not read a transfer."""
        return notify_targets(self.tp_rank, self.tp_size, segments, remote_tp)

    def _confirm(self, segment: str, transfer_id: str, kind: str, n_readers: int, inline: bool = False) -> bool:
        """Tell a prefill rank this decode rank is done with ``transfer_id`` (read, failed, or not
        reading); with several decode ranks reading it (``n_readers``) the message says which."""
        msg = notify.confirmation(kind, self.tp_rank % n_readers, n_readers)
        return self._notify(segment, transfer_id, msg, inline)

    def start_load(self, meta: MooncakeConnectorMetadata) -> None:
        self._idle_step = meta.idle
        for rid in meta.cancels:
            self._cancel(rid)
        for segs, remote_tp, tid in meta.releases:
            for seg in self._targets(segs, remote_tp):
                self._confirm(seg, tid, "release", readers(self.tp_size, remote_tp))
        for rid, sr in meta.reqs_to_send.items():
            self._held_since[rid] = time.monotonic()
            if self._sends.hold(rid, sr.transfer_id, sr.expiry, time.time()):
                self._send_done.add(rid)  # (under TP a decode rank may have confirmed before this rank held)
            if sr.ready is not None:
                for pair in self._rdv.offer(sr.transfer_id, sr.ready, sr.expiry):
                    self._send_ready(pair)
        for r in meta.reqs_to_recv:
            if r.pending is not None:
                self._ask(r)
            else:
                self._submit(r)

    # ---------------------------------------------------------------- concurrent hand-off
    def _ask(self, r: RecvReq) -> None:
        """Decode: tell the prefill (still computing, usually) to send ``ready`` to us when done."""
        assert r.pending is not None
        pp = r.pending
        if self._notify(pp.segment, pp.transfer_id, notify.encode(Want(self.segment)), inline=True):
            mono = time.monotonic()
            self._waiting[pp.transfer_id] = (r, mono + self.prefill_wait_s, mono + self.want_retry_s)
        else:
            self._fail(r, "unreachable")  # prefill unreachable: recompute or fail per policy, now

    def _tell_pending(self, pp: PendingPrefill, msg: str) -> None:
        """Decode, concurrent hand-off before ``ready``: only the prefill's rank 0 is known."""
        for seg in self._targets((pp.segment,), 0):
            self._notify(seg, pp.transfer_id, msg)

    def _send_ready(self, pair: tuple[str, RemotePrefill] | None, inline: bool = True) -> None:
        """Prefill: the finished request's params to the decode that asked (one quick round trip)."""
        if pair is not None:
            seg, rp = pair
            self._notify(seg, rp.transfer_id, notify.encode(Ready(rp)), inline=inline)

    def _on_ready(self, tid: str, ready: Ready | NotifyError) -> None:
        """Decode: the prefill finished: check what it sent (or its error) and start the read now."""
        entry = self._waiting.pop(tid, None)
        if entry is None:
            return  # cancelled or timed out meanwhile (the prefill's lease frees its blocks)
        r = entry[0]
        try:
            if isinstance(ready, NotifyError):
                raise ready
            rp = ready.remote
            need_blocks = -(-r.need_tokens // max(1, rp.block_size))
            if rp.transfer_id != tid or rp.segment != r.pending.segment:  # type: ignore[union-attr]
                raise ParamsError(f"ready for transfer {rp.transfer_id} from {rp.segment} does not match")
            if rp.block_size != self.block_size:
                raise ParamsError(f"prefill block size {rp.block_size} differs from this decode's {self.block_size}")
            rank_plan(self.tp_rank, self.shard(), remote_shard(rp))  # TPMismatch names the layout difference
            if rp.num_tokens < r.need_tokens or len(rp.block_ids) < need_blocks:
                raise ParamsError(f"prefill computed {rp.num_tokens} tokens in {len(rp.block_ids)} blocks, the "
                                  f"decode needs {r.need_tokens}")
        except ValueError as e:  # ParamsError, TPMismatch, NotifyError
            logger.error("MooncakeCoreConnector: request %s: bad ready notification for transfer %s: %s",
                         r.request_id, tid, e)
            self._fail(r, "bad_ready")
            if r.pending is not None:
                self._tell_pending(r.pending, "failed")
            return
        self._submit(RecvReq(r.request_id, rp, r.local_block_ids, r.local_hit_blocks))

    def _cancel(self, rid: str) -> None:
        """Decode: the request was aborted while loading; report it once no read can write its blocks."""
        for tid, (r, _deadline, _again) in list(self._waiting.items()):
            if r.request_id == rid:
                del self._waiting[tid]
                self._cancelled_now.append(rid)
                if r.pending is not None:
                    self._tell_pending(r.pending, "release")
                return
        if any(p.req.request_id == rid for p in self._pulls):
            self._cancelled.add(rid)  # reported when the read ends
        # else: already reported received; the scheduler freed the blocks itself

    def _drain_notifies(self, now: float) -> None:
        for n in self.te.get_notifies():
            try:
                msg: Ready | Want | Confirmation | NotifyError = notify.decode(n.msg)
            except NotifyError as e:  # a bad ready fails the decode waiting for it; anything else is noise
                msg = e
            if isinstance(msg, NotifyError) and msg.kind != "ready":
                logger.warning("MooncakeCoreConnector: ignoring notification %r for transfer %s: %s", n.msg[:40],
                               n.name, msg)
            elif isinstance(msg, (Ready, NotifyError)):
                self._on_ready(n.name, msg)
            elif isinstance(msg, Want):
                # a repeat (the first ready was lost: the decode may be unreachable) goes in the
                # background, so a peer that does not answer cannot stall this engine's steps
                again = self._rdv.answered(n.name, msg.segment)
                self._send_ready(self._rdv.want(n.name, msg.segment, now + self.lease_s), inline=not again)
            else:
                # the rendezvous keeps its offer until the lease ends: a sibling decode rank may ask later
                rid = self._sends.confirm(n.name, now, msg.sender, msg.readers)
                if rid is not None:
                    self._send_done.add(rid)
                    t = self._held_since.get(rid)
                    if t is not None:
                        self.stats.observe(S.HOLD_SECONDS, time.monotonic() - t)
                    logger.info("MooncakeCoreConnector: kv released request=%s transfer=%s (%s) held_ms=%.1f", rid,
                                n.name, n.msg, (time.monotonic() - t) * 1e3 if t is not None else -1.0)

    def _submit(self, r: RecvReq) -> None:
        rp = r.remote
        assert rp is not None
        rplan: RankPlan | None = None
        try:
            if time.time() > rp.lease_expiry_unix - LEASE_MARGIN_S:
                raise RuntimeError(f"prefill lease on transfer {rp.transfer_id} expired before the read started")
            rplan = rank_plan(self.tp_rank, self.shard(), remote_shard(rp))
            pairs = pair_blocks(r.local_block_ids, rp.block_ids, r.local_hit_blocks)
            runs = coalesce(pairs)
            reads = []  # (segment, local addrs, remote addrs, lengths) per prefill rank read from
            for src in rplan.reads:
                seg = rp.segments[src.rank]
                reads.append((seg, *plan(self.slabs, self._remote_slabs(rp, seg), runs, src.part, src.parts,
                                         src.remote_part, src.remote_parts)))
            nbytes = sum(sum(ln) for _s, _la, _ra, ln in reads)
            notify = [rp.segments[k] for k in rplan.notify]
            if nbytes <= self.sync_load_max_bytes:
                # Small: read now, in this step. The request is then reported received by this same
                # step's get_finished, and the scheduler runs it in the next step. An asynchronous
                # read would finish on a Transfer Engine thread that must win the GIL from this
                # busy loop and be noticed by a later step's poll: milliseconds for ~0.3 ms of copying.
                started = time.monotonic()
                for seg, la, ra, ln in reads:
                    if self.te.batch_transfer_sync_read(seg, la, ra, ln) != 0:
                        self._remote.pop(f"{seg}|{rp.engine_id}", None)
                        raise RuntimeError(f"read from {seg} failed: {self.te.last_error}")
                self._read_now.append(_Pull(r, [], nbytes, len(pairs), started, notify, rplan.readers))
                return
            pull = _Pull(r, [], nbytes, len(pairs), time.monotonic(), notify, rplan.readers)
            for seg, la, ra, ln in reads:
                bid = self.te.batch_transfer_async_read(seg, la, ra, ln)
                if bid <= 0:
                    self._remote.pop(f"{seg}|{rp.engine_id}", None)
                    if pull.batch_ids:  # reads already running may still write the blocks: report at their end
                        pull.codes[-1] = -1
                        break
                    raise RuntimeError(f"Transfer Engine refused the read from {seg}: {self.te.last_error}")
                pull.batch_ids.append(bid)
            self._pulls.append(pull)
        except Exception as e:
            logger.error("MooncakeCoreConnector: KV pull for request %s (transfer %s from %s) failed to start: %s",
                         r.request_id, rp.transfer_id, ",".join(rp.segments), e)
            self._fail(r, "start")
            targets = ([rp.segments[k] for k in rplan.notify] if rplan is not None
                       else self._targets(rp.segments, rp.tp_size))
            for seg in targets:  # best effort: lets a live prefill free early
                self._confirm(seg, rp.transfer_id, "failed", readers(self.tp_size, rp.tp_size))

    def _fail(self, r: RecvReq, reason: str) -> None:
        """Decode: ``r``'s KV will not arrive (the next poll reports it failed); ``reason`` is one of
        ``stats.P2P_FAILURES``."""
        self.stats.add(S.failure(reason))
        self._failed_now.append(r)

    def _notify(self, segment: str, transfer_id: str, msg: str, inline: bool = False) -> bool:
        """Tell the prefill it may free the blocks of ``transfer_id``.

        ``inline`` (after a successful read: the peer just answered, so this is one quick round
        trip) sends from the calling thread. A background thread would have to win the GIL from
        the busy model loop several times per round trip, delaying the confirmation by up to
        hundreds of ms -- and the prefill's engine spins while it holds blocks, stealing CPU from
        everything else on the host. Failure paths (peer maybe dead) stay in the background."""
        from mooncake_core.engine import TransferOpcode

        def send() -> bool:
            rc = self.te.batch_transfer_sync(segment, [], [], [], TransferOpcode.READ,
                                             self._notify_cls(transfer_id, msg))
            if rc != 0:
                logger.warning("MooncakeCoreConnector: could not send %r about transfer %s to %s (%s)",
                               msg.split(" ", 1)[0], transfer_id, segment, self.te.last_error)
            return rc == 0

        if inline:
            return send()
        self._notifier.submit(send)
        return True

    # ---------------------------------------------------------------- polling (both roles)
    def poll(self) -> KVConnectorTransferResults:
        res = KVConnectorTransferResults()
        results = bool(self._read_now or self._failed_now or self._cancelled_now or self._send_done)
        pending = bool(self._pulls or self._waiting or self._sends.held())
        wait = idle_wait_s(self._idle_step, results, pending, self.idle_wait_ms)
        self._idle_step = False  # once per step (a step without metadata must not sleep)
        if wait:
            self.te.wait_notifies(self._events_seen, wait)
        self._events_seen = self.te.notify_events()  # taken before draining: no event is missed
        now = time.time()
        self._drain_notifies(now)  # first: a ``ready`` starts its read in this very poll
        mono = time.monotonic()
        for tid, (r, deadline, again) in list(self._waiting.items()):
            if mono > deadline:
                del self._waiting[tid]
                logger.error("MooncakeCoreConnector: request %s: no ready from prefill %s for transfer %s within "
                             "prefill_wait_s=%.0f", r.request_id, r.pending.segment if r.pending else "?", tid,
                             self.prefill_wait_s)
                self._fail(r, "no_ready")
            elif mono > again and r.pending is not None:
                # no ready yet: the prefill still computes, or its ready was lost -- ask again
                # (background: the prefill may be the one that is unreachable now)
                self._waiting[tid] = (r, deadline, mono + self.want_retry_s)
                logger.info("MooncakeCoreConnector: request %s: no ready from prefill %s for transfer %s yet; "
                            "asking again", r.request_id, r.pending.segment, tid)
                self._notify(r.pending.segment, tid, notify.encode(Want(self.segment)))
        res.finished_recving.update(self._cancelled_now)
        self._cancelled_now = []
        still: list[_Pull] = []
        done = [(p, 1) for p in self._read_now]
        self._read_now = []
        for p in self._pulls:
            code = p.status(self.te.transfer_check_status)
            if code == 0:
                still.append(p)
            else:
                done.append((p, code))
        for p, code in done:
            rp = p.req.remote
            assert rp is not None
            if p.req.request_id in self._cancelled:  # aborted meanwhile: only free its blocks
                self._cancelled.discard(p.req.request_id)
                res.finished_recving.add(p.req.request_id)
                for seg in p.notify:
                    self._confirm(seg, rp.transfer_id, "release", p.readers)
                continue
            ok = code == 1 and time.time() < rp.lease_expiry_unix
            if ok:
                pulled_ms = (time.monotonic() - p.started) * 1e3
                t_n = time.monotonic()
                for seg in p.notify:
                    self._confirm(seg, rp.transfer_id, "done", p.readers, inline=True)
                self.stats.add(S.PULLED_BYTES, p.nbytes)
                self.stats.add(S.PULLED_BLOCKS, p.nblocks)
                self.stats.observe(S.PULL_SECONDS, pulled_ms / 1e3)
                logger.info("MooncakeCoreConnector: kv pulled request=%s transfer=%s blocks=%d bytes=%d ms=%.1f "
                            "notify_ms=%.1f", p.req.request_id, rp.transfer_id, p.nblocks, p.nbytes, pulled_ms,
                            (time.monotonic() - t_n) * 1e3)
                res.finished_recving.add(p.req.request_id)
            else:
                why = "lease expired during the read" if code == 1 else f"transfer status {code}"
                logger.error("MooncakeCoreConnector: KV pull for request %s (transfer %s from %s) failed: %s",
                             p.req.request_id, rp.transfer_id, ",".join(p.notify), why)
                for seg in p.notify:
                    self._remote.pop(f"{seg}|{rp.engine_id}", None)
                    self._confirm(seg, rp.transfer_id, "failed", p.readers)
                self._fail(p.req, "read" if code != 1 else "lease")
        self._pulls = still
        for r in self._failed_now:
            res.finished_recving.add(r.request_id)
            res.failed_recving.add(r.request_id)
            self._load_errors.update(r.local_block_ids)
        self._failed_now = []
        # prefill: lease expiries
        self._rdv.expire(now)
        expired = self._sends.expire(now)
        if expired:
            logger.warning("MooncakeCoreConnector: lease expired without a decode confirmation, freeing blocks "
                           "of %d request(s): %s", len(expired), sorted(expired)[:8])
        self.stats.add(S.LEASES_EXPIRED, len(expired))
        self._send_done.update(expired)
        for rid in self._send_done:
            self._held_since.pop(rid, None)
        res.finished_sending, self._send_done = self._send_done, set()
        return res

    def take_load_errors(self) -> set[int]:
        out, self._load_errors = self._load_errors, set()
        return out

    def shutdown(self) -> None:
        self._notifier.shutdown(wait=False)
        try:
            self.te.close()
        except Exception:
            pass
