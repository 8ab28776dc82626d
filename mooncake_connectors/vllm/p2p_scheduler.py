"""The scheduler side of ``MooncakeCoreConnector``: which requests load KV from a peer, which hand off.

Runs in the scheduler process of each instance (both roles: an instance may prefill and decode).
It decides from a request's ``kv_transfer_params`` (``mooncake_core.pd.params``) whether the
request's prompt KV comes from a prefill (decode), from a peer holding its prefix (peer prefix
hint, ``mooncake_core.pd.peer_prefix``), or must be held for a decode once it finishes
(prefill), and tells the workers so in the step's ``MooncakeConnectorMetadata``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorHandshakeMetadata
from vllm.logger import init_logger

from mooncake_connectors.vllm import stats as S
from mooncake_connectors.vllm.kv_groups import sent_blocks, token_group
from mooncake_connectors.vllm.p2p_config import P2PConfig
from mooncake_connectors.vllm.p2p_messages import (MooncakeConnectorMetadata, MooncakeHandshake, RecvReq, SendReq,
                                                   remote_shard)
from mooncake_connectors.vllm.peer_clock import MAX_CLOCK_SKEW_S
from mooncake_connectors.vllm.tp import TPMismatch, rank_plan
from mooncake_core.pd.params import (ParamsError, PendingPrefill, RemotePrefill, chosen_transfer_id, is_pending,
                                     new_transfer_id, parse_pending, tokens_digest, wants_remote_decode,
                                     wants_remote_prefill)
from mooncake_core.pd.peer_prefix import PEER_KEY, has_peer_prefix, parse_peer_prefix

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.request import Request

logger = init_logger("vllm.mooncake_core.p2p_connector")


class P2PScheduler:
    """Scheduler-side state of one instance (both roles: an instance may prefill and decode)."""

    def __init__(self, config: P2PConfig):
        self.config = config
        self.engine_id = config.engine_id
        self.block_size = config.block_size
        self.lease_s = config.lease_s
        self.tp_size = config.tp_size
        self.hs: MooncakeHandshake | None = None  # rank 0's
        self.segments: tuple[str, ...] = ()  # every rank's, in rank order
        self._recv: list[RecvReq] = []
        self._send: dict[str, SendReq] = {}
        self._releases: list[tuple[tuple[str, ...], int, str]] = []
        self._refused: set[str] = set()  # hand-offs refused and released (request ids), until they end
        self._cancels: list[str] = []
        self._loading: dict[str, float] = {}  # decode requests handed to the worker, not yet received: since
        self._peer: dict[str, RemotePrefill | None] = {}  # peer prefix hints checked, until allocation
        self.stats = S.StatsRecorder()  # what the scheduler decided (requests, blocks, waits): vLLM's stats hook
        #: this host's wall clock: the lease expiry a prefill states is on it (tests inject a skewed one)
        self.clock: Callable[[], float] = time.time

    def set_handshake(self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        ranks = []
        for r in range(self.tp_size):
            hs = metadata.get(r)
            if not isinstance(hs, MooncakeHandshake):
                raise ValueError(f"MooncakeCoreConnector: expected worker handshake metadata for TP rank {r} of "
                                 f"{self.tp_size}, got {metadata!r}")
            ranks.append(hs)
        if len({(h.block_bytes, h.num_slabs, h.kv_heads, h.heads_outer, h.kv_layout) for h in ranks}) != 1:
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
        fit = self._fits(request, rp)
        if fit is None and request.request_id not in self._refused:
            # refused (block size, TP, layout): the prefill frees its blocks now, not at its lease's
            # end; once per request, though vLLM asks again at every scheduling attempt
            self._refused.add(request.request_id)
            self._releases.append(release_of(rp))
        return fit

    def _peer_prefix(self, request: "Request") -> RemotePrefill | None:
        """The request's checked peer prefix hint (``peer_prefix.py``), parsed once per request."""
        rid = request.request_id
        if rid not in self._peer and self.config.hybrid:
            logger.warning("MooncakeCoreConnector: request %s: a peer prefix hint is not used for a hybrid model "
                           "(the peer's Mamba state and sliding window are at its own prompt's end, not at this "
                           "prompt's prefix); computing the prefix here", rid)
            self._release_hint(request)
            self._peer[rid] = None
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
            self._releases.append(release_of(RemotePrefill.from_params(params.get(PEER_KEY))))
        except (ParamsError, AttributeError):
            pass

    def _fits(self, request: "Request", rp: RemotePrefill) -> RemotePrefill | None:
        if rp.block_size != self.block_size:
            logger.error("MooncakeCoreConnector: request %s: prefill block size %d != decode block size %d; "
                         "computing locally", request.request_id, rp.block_size, self.block_size)
            return None
        # before the layout: a rank's layout differs with the TP size, the TP size is the reason
        if self.config.hybrid and rp.tp_size != self.tp_size:
            logger.error("MooncakeCoreConnector: request %s: prefill TP %d, decode TP %d: a hybrid model's KV moves "
                         "between equal TP sizes only (a Mamba state is split by heads per rank and cannot be "
                         "re-split); computing locally", request.request_id, rp.tp_size, self.tp_size)
            return None
        if self.hs is not None and rp.kv_layout != self.hs.kv_layout:
            logger.error("MooncakeCoreConnector: request %s: the prefill's KV cache groups (%s) differ from this "
                         "decode's (%s): the same model, dtype and block size on both sides? computing locally",
                         request.request_id, rp.kv_layout or "one group", self.hs.kv_layout or "one group")
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
            n = self._loadable_prompt(request) - num_computed_tokens
            return (n, True) if n > 0 else (0, False)
        rp = self._parse(request)
        if rp is None:
            return 0, False
        return self._loadable(request, rp, num_computed_tokens)

    def _loadable(self, request: "Request", rp: RemotePrefill, num_computed_tokens: int) -> tuple[int, bool]:
        # The expiry is on the prefill's clock, which may differ from ours: only params stale beyond
        # any plausible skew are refused here; the worker judges the lease with the offset measured.
        if self.clock() > rp.lease_expiry_unix + MAX_CLOCK_SKEW_S:
            logger.warning("MooncakeCoreConnector: request %s: the prefill's lease on transfer %s ended long ago; "
                           "computing locally", request.request_id, rp.transfer_id)
            return 0, False
        n = min(self._loadable_prompt(request), rp.num_tokens) - num_computed_tokens
        return (n, True) if n > 0 else (0, False)

    def _loadable_prompt(self, request: "Request") -> int:
        """Prompt tokens a decode may load: all, or all but the last for a model with a recurrent
        state (the decode computes the last token from the state after the others, as vLLM's own
        Mooncake connector does: a state cannot be rolled back to recompute a token)."""
        n = len(request.prompt_token_ids or ())
        return n - 1 if self.config.has_state and n > 1 else n

    def on_new_request(self, request: "Request") -> None:
        """Prefill of a model with a recurrent state: compute the prompt minus its last token, so
        the state handed over is the one the decode continues from (``_loadable_prompt``)."""
        params = request.kv_transfer_params
        if (not self.config.has_state or not wants_remote_decode(params) or params.get("_mooncake_truncated")
                or request.num_prompt_tokens <= 1 or request.prompt_token_ids is None):
            return
        request.prompt_token_ids.pop()
        request._all_token_ids.pop()
        request.num_prompt_tokens -= 1
        request.max_tokens = 1
        params["_mooncake_truncated"] = True

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
                groups: list[list[int]] | None = None
                if self.config.hybrid:
                    every = blocks.get_unhashed_block_ids_all_groups()
                    groups = [list(every[i]) for i in self.config.transfer_group_ids]
                    ids = [b for g in groups for b in g]
                    tg = self.config.transfer_group_ids[token_group(self.config.groups)]
                    hashed = sum(1 for b in blocks.blocks[tg] if b.block_hash is not None)
                else:
                    hashed = sum(1 for b in blocks.blocks[0] if b.block_hash is not None)
                    ids = blocks.get_unhashed_block_ids()
                self._recv.append(RecvReq(request.request_id, rp, ids, hashed,
                                          pending, hashed * self.block_size + num_external_tokens, groups))
                self._loading[request.request_id] = time.monotonic()
                self.stats.add(S.REMOTE_REQUESTS)
                self.stats.add(S.REMOTE_BLOCKS, len(ids))
                if peer and rp is not None:
                    logger.info("peer prefix request=%s transfer=%s from=%s blocks=%d", request.request_id,
                                rp.transfer_id, ",".join(rp.segments), len(ids))
            else:  # full local prefix hit (or lease gone): tell the prefill to free its blocks
                self._releases.append(release_of(who))
                self.stats.add(S.REMOTE_LOCAL_HITS)
        if peer:
            params.pop(PEER_KEY, None)  # read at most once (a preempted request recomputes)
        else:
            params["do_remote_prefill"] = False  # exactly one transfer per request
            self._refused.discard(request.request_id)

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

    def request_finished(self, request: "Request",
                         block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        """``block_ids``: every KV cache group's (vLLM's ``request_finished_all_groups``)."""
        from vllm.v1.request import RequestStatus

        params = request.kv_transfer_params
        if request.request_id in self._loading:
            # Aborted while its KV loads: keep the blocks (a read may be writing them) until the
            # worker reports the request received; it drops a read not yet started.
            del self._loading[request.request_id]
            self._cancels.append(request.request_id)
            return True, None
        if wants_remote_prefill(params):
            # Decode request finished (aborted) before its blocks were allocated: release the prefill
            # (unless its refusal already did).
            try:
                who = parse_pending(params) if is_pending(params) else RemotePrefill.from_params(params)
                if request.request_id not in self._refused:
                    self._releases.append(release_of(who))
            except ParamsError:
                pass
            self._refused.discard(request.request_id)
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
        if self.config.hybrid:
            groups = [sent_blocks(spec, list(block_ids[i]))
                      for spec, i in zip(self.config.groups, self.config.transfer_group_ids)]
            flat = groups[token_group(self.config.groups)]
        else:
            groups, flat = [], list(block_ids[0]) if block_ids else []
        if not flat and not any(groups):
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
        expiry = self.clock() + self.lease_s
        rp = RemotePrefill(transfer_id=tid, segment=self.hs.segment, engine_id=self.engine_id,
                           request_id=request.request_id, block_ids=flat,
                           num_tokens=request.num_computed_tokens, block_size=self.block_size,
                           block_bytes=self.hs.block_bytes, num_slabs=self.hs.num_slabs, lease_expiry_unix=expiry,
                           segments=self.segments, kv_heads=self.hs.kv_heads, heads_outer=self.hs.heads_outer,
                           tokens_digest=tokens_digest((request.prompt_token_ids or ())[:request.num_computed_tokens]),
                           group_block_ids=tuple(tuple(g) for g in groups), kv_layout=self.hs.kv_layout)
        out = rp.to_params()
        # concurrent hand-off: the worker sends these to the decode that asks for ``tid``
        self._send[request.request_id] = SendReq(tid, expiry, rp if chosen else None)
        self.stats.add(S.HANDOFF_REQUESTS)
        self.stats.add(S.HANDOFF_BLOCKS, sum(map(len, groups)) if groups else len(flat))
        return True, out


def release_of(who: RemotePrefill | PendingPrefill) -> tuple[tuple[str, ...], int, str]:
    """The ``releases`` entry telling a prefill this decode will not read its blocks."""
    if isinstance(who, RemotePrefill):
        return who.segments, who.tp_size, who.transfer_id
    return (who.segment,), 0, who.transfer_id  # concurrent hand-off: only the prefill's rank 0 is known
