"""The prefix hints the proxy adds to a prefill request (why: the Conductor's plan names where a
prefix comes from; these say so to the engine). ``with_store_hint``: the Mooncake Store holds it
(``mooncake_core/pd/store_hint.py``); ``with_peer_prefix``: another prefill holds it and exports it
first (``mooncake_core/pd/peer_prefix.py``, docs/kvcache-scheduling.md)."""

from __future__ import annotations

import asyncio
from typing import Any

from mooncake_core.pd.peer_prefix import PEER_KEY, export_prefix, export_request
from mooncake_core.pd.store_hint import HINT_KEY, make_hint
from mooncake_core.utils.log import get_logger

from .metrics import ProxyMetrics
from .registry import Registry
from .relay import Relay, UpstreamError

log = get_logger("mooncake_proxy.prefix_hints")


def with_store_hint(payload: dict[str, Any], decision: Any, block_size: int) -> dict[str, Any]:
    """The prefill payload with the store prefix hint (``mooncake_core/pd/store_hint.py``): the
    scheduler counted on the prefill loading ``cached_blocks`` leading blocks, the ones it lacks
    from the store. Hand-offs without ``kv_transfer_params`` (SGLang) are left as they are."""
    params = payload.get("kv_transfer_params")
    if not isinstance(params, dict):
        return payload
    return {**payload, "kv_transfer_params": {**params, HINT_KEY: make_hint(decision.cached_blocks, block_size)}}


class PeerPrefixExporter:
    """``--peer-prefix``: asks the instance holding a planned prefix to export it (narrow: the
    registry to find it, the relay to ask it, the metrics to count the outcome)."""

    def __init__(self, registry: Registry, relay: Relay, metrics: ProxyMetrics, block_size: int,
                 timeout_s: float) -> None:
        self._registry = registry
        self._relay = relay
        self._metrics = metrics
        self.block_size = block_size
        self.timeout_s = timeout_s

    async def with_peer_prefix(self, payload: dict[str, Any], body: dict[str, Any], decision: Any, token_ids: Any,
                               headers: dict[str, str], rid: str) -> dict[str, Any]:
        """The prefill payload with the peer prefix hint: the Conductor planned to read
        ``decision.cached_blocks`` leading blocks from the instance ``decision.remote_source``. That
        instance exports them (a one-token hand-off request of the prefix's token ids, bounded by
        --peer-prefix-timeout) and its answer goes to the prefill. Any failure leaves the payload as
        it was: the prefill then computes the prefix."""
        params = payload.get("kv_transfer_params")
        src = self._registry.get(decision.remote_source)
        prefix = export_prefix(token_ids, decision.cached_blocks, self.block_size) if token_ids else []
        if not isinstance(params, dict) or src is None or not prefix:
            self._metrics.peer_prefix.labels("skipped").inc()
            return payload
        try:
            answer = await asyncio.wait_for(self._relay.post_json(
                src, "/v1/completions", export_request(str(body.get("model", "")), prefix), headers,
                "peer prefix export"), self.timeout_s)
            kv = answer.get("kv_transfer_params")
            if not isinstance(kv, dict) or not kv.get("do_remote_prefill"):
                raise ValueError(f"no hand-off kv_transfer_params in the answer (got {kv!r:.120}); is "
                                 "MooncakeCoreConnector (kv_both) configured there?")
        except (UpstreamError, asyncio.TimeoutError, ValueError) as e:
            self._metrics.peer_prefix.labels("failed").inc()
            log.warning("peer prefix export failed; the prefill computes the prefix", extra={
                "request_id": rid, "instance": src.url, "blocks": decision.cached_blocks,
                "error": str(e) or f"timed out after {self.timeout_s} s"})
            return payload
        self._metrics.peer_prefix.labels("exported").inc()
        return {**payload, "kv_transfer_params": {**params, PEER_KEY: kv}}
