"""``MooncakeCoreConnector``: vLLM KV connector (V1 API, vLLM 0.32) for disaggregated prefill/decode.

Targets ``vllm/distributed/kv_transfer/kv_connector/v1/base.py`` of vLLM 0.32.0
(``KVConnectorBase_V1``, constructor ``(vllm_config, role, kv_cache_config)``).

How a request flows (pull model, like vLLM's NixlConnector, on our Transfer Engine):

1. The proxy sends the prompt to the **prefill** instance with ``max_tokens=1`` and
   ``kv_transfer_params={"do_remote_decode": true}``. When it finishes, the prefill's
   scheduler-side ``request_finished`` keeps the request's KV blocks alive (returns True) and
   returns ``kv_transfer_params``: the prefill worker's Transfer Engine segment, the block ids,
   a fresh ``mooncake_transfer_id`` and a lease expiry (``mooncake_core.pd.params.RemotePrefill``).
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
   vanished decode never leaks blocks. A decode refuses to read after the lease expiry, judged
   on its own clock with the prefill host's measured clock offset taken out (``peer_clock.py``).

Concurrent hand-off (``mooncake_proxy --handoff mooncake-core``): the proxy sends both requests
at once with a transfer id it chose; the prefill's params carry that id, the decode's carry it
and the prefill's segment (``mooncake_core.pd.params.concurrent_*_params``). The decode allocates its blocks at
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
``clock_refresh_s`` (default 30: how old a prefill host's measured clock offset may get before the
decode measures it again),
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

Hybrid models (``SupportsHMA``: vLLM's hybrid KV cache manager, e.g. Mamba2 + attention): every
KV cache group has block ids of its own, and the groups' layers overlay shared buffers. The
worker registers each buffer once and publishes the groups' layout in its handshake; the
prefill's ``request_finished_all_groups`` sends every group's block ids and that layout, the
decode refuses another layout or TP size and reads each group's blocks in that group's layers
(``kv_groups.py``: a window only its needed blocks, a Mamba state as the state). For a model
with a recurrent state the prefill computes the prompt minus its last token (``on_new_request``)
and the decode loads that many, as vLLM's own Mooncake connector does.

The parts, as vLLM's own Mooncake connectors are cut: this module is the connector vLLM loads,
delegating to its scheduler side (``p2p_scheduler.P2PScheduler``) or its worker side
(``p2p_worker.P2PWorker``: the decode's ``p2p_puller.Puller``, the prefill's
``p2p_sender.Sender`` and the ``p2p_notifier.Notifier`` both use); ``p2p_messages`` holds what
the two sides pass each other, ``p2p_config`` the settings above. What crosses instances --
``kv_transfer_params`` and the workers' notifications -- is the PD contract, ``mooncake_core.pd``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorHandshakeMetadata,
                                                                KVConnectorMetadata, KVConnectorRole,
                                                                KVConnectorTransferResults, SupportsHMA)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from mooncake_connectors.vllm import stats as S
from mooncake_connectors.vllm.connector_stats import P2P_PROM, StatsHook
from mooncake_connectors.vllm.p2p_config import P2PConfig
from mooncake_connectors.vllm.p2p_messages import MooncakeConnectorMetadata
from mooncake_connectors.vllm.p2p_scheduler import P2PScheduler
from mooncake_connectors.vllm.p2p_worker import P2PWorker

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

#: What subclasses (tests' and benches' observing connectors) read off the step's metadata.
__all__ = ["MooncakeConnectorMetadata", "MooncakeCoreConnector"]


def _tp_rank() -> int:
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return get_tensor_model_parallel_rank()


class MooncakeCoreConnector(StatsHook, KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector V1 moving KV blocks between instances over the Mooncake Transfer Engine.

    ``SupportsHMA``: with vLLM's hybrid KV cache manager (hybrid Mamba + attention or
    sliding-window models) every KV cache group has block ids of its own; they travel per group
    (``kv_groups.py``)."""

    PROM = P2P_PROM  # series of vLLM's KV connector stats hook (connector_stats.py)

    _cache_hit_source = CacheHitSource.P2P

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig | None" = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        config = P2PConfig.from_vllm(vllm_config, kv_cache_config)
        self.engine_id: str = config.engine_id
        if role == KVConnectorRole.SCHEDULER:
            self._sched: P2PScheduler | None = P2PScheduler(config)
            self._worker: P2PWorker | None = None
        else:
            self._sched = None
            self._worker = P2PWorker(config, tp_rank=_tp_rank() if config.tp_size > 1 else 0,
                                     kv_heads=vllm_config.model_config.get_num_kv_heads(vllm_config.parallel_config),
                                     num_blocks=kv_cache_config.num_blocks if kv_cache_config is not None else None)

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
        return self._sched.request_finished(request, (block_ids,))

    def request_finished_all_groups(self, request: "Request",
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        assert self._sched is not None
        return self._sched.request_finished(request, block_ids)

    def on_new_request(self, request: "Request") -> None:
        if self._sched is not None:
            self._sched.on_new_request(request)

    def set_xfer_handshake_metadata(self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        if self._sched is not None:
            self._sched.set_handshake(metadata)

    def update_connector_output(self, connector_output: Any) -> None:
        super().update_connector_output(connector_output)
        if self._sched is not None:
            self._sched.update_connector_output(connector_output)

    def get_loaded_kv_cache_group_ids(self, request: "Request") -> tuple[int, ...]:
        # We transfer the request's own blocks of every group that takes part in transfers.
        return tuple(self._kv_cache_config.transfer_group_ids)

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
