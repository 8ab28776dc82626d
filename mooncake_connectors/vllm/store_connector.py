"""``MooncakeCoreStoreConnector``: vLLM KV connector (V1 API, vLLM 0.32) backed by the Mooncake Store.

Cross-instance prefix reuse: every instance saves the full KV blocks of the prompts it served
into the Mooncake Store under prefix-chained keys (``keys.chained_block_keys``); any instance
serving the same model then loads the longest stored prefix instead of recomputing it.
Usable alone (``kv_role: kv_both``) or next to ``MooncakeCoreConnector`` through vLLM's
``MultiConnector``. With ``kv_role: kv_consumer`` it only loads and never saves -- what a decode
instance behind a P2P hand-off wants: the prefill saved those blocks already, and the decode's
copies of them cost its cores a store put per request (824 blocks, 1.6 GB, in one live bench run,
on the core the decode shares with two prefills).

Scheduler side: ``get_num_new_matched_tokens`` asks the store master which leading blocks
exist (one ``batch_is_exist``); ``update_state_after_alloc`` records which local blocks receive
them; ``request_finished`` schedules the request's full prompt blocks for saving and keeps
them allocated until the worker reports them saved. Worker side: ``register_kv_caches``
registers the KV tensors with the store client (zero copy); ``start_load_kv`` reads the hit
blocks synchronously before the forward (``batch_get_into_multi_buffers``: one object per
block = the block of every layer, scatter-gathered); saves run in a background thread
(``batch_put_from_multi_buffers``) and finish through ``get_finished``. A failed read reports
its blocks through ``get_block_ids_with_load_errors`` (``kv_load_failure_policy`` applies).
While the master does not answer, lookups find nothing and saves are dropped for a back-off
(``store_backoff.py``), so a dead master costs one RPC timeout, not one per request.

Store configuration, in ``kv_connector_extra_config`` (else the upstream env vars
``MOONCAKE_MASTER``, ``MOONCAKE_TE_META_DATA_SERVER``, ... / ``MOONCAKE_CONFIG_PATH``):
``master_server_address``, ``metadata_server``, ``global_segment_size`` (memory this worker
contributes to the pool, default 256MB), ``local_buffer_size``, ``local_hostname``, ``protocol``;
``store_lookup``: "always" (default) or "hint" -- look the store up only for requests that carry
the proxy's store prefix hint (``store_hint.py``).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                                KVConnectorRole, SupportsHMA)
from vllm.logger import init_logger
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from mooncake_core import envs
from mooncake_connectors.vllm import stats as S
from mooncake_connectors.vllm.connector_stats import STORE_PROM, StatsHook
from mooncake_core.pd.keys import chained_block_keys, leading_hits, namespace
from mooncake_connectors.vllm.layout import Slab, slabs_of
from mooncake_connectors.vllm.store_backoff import MasterBackoff
from mooncake_core.pd.store_hint import LOOKUP_MODES, hinted_blocks

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger("vllm.mooncake_core.store_connector")

#: Mooncake's ErrorCode::RPC_FAIL: a put found the master gone (it died between lookup and put)
RPC_FAIL = -900


def _store_from_config(vllm_config: "VllmConfig", segment: str | None):
    """A set-up ``MooncakeDistributedStore`` client (raises with the reason on failure)."""
    from mooncake_core.store import MooncakeDistributedStore

    x = vllm_config.kv_transfer_config.get_from_extra_config
    store = MooncakeDistributedStore()
    if x("master_server_address", None) is None:
        rc = store.setup()  # upstream env: MOONCAKE_CONFIG_PATH or MOONCAKE_MASTER, ...
    else:
        rc = store.setup(x("local_hostname", envs.MOONCAKE_LOCAL_HOSTNAME or "127.0.0.1"),
                         x("metadata_server", "P2PHANDSHAKE"),
                         segment if segment is not None else x("global_segment_size", "256MB"),
                         x("local_buffer_size", "16MB"), x("protocol", "tcp"), x("device_name", ""),
                         x("master_server_address", None))
    if rc != 0:
        raise RuntimeError(f"MooncakeCoreStoreConnector: Mooncake Store setup failed with code {rc} "
                           f"(master {x('master_server_address', envs.MOONCAKE_MASTER or None)!r})")
    return store


def _one_group(kv_cache_config: "KVCacheConfig | None") -> None:
    """Refuse a model whose KV cache is not one full-attention group (vLLM's hybrid manager keeps
    several groups, or a window / state group, apart), naming why.

    A stored prefix of a hybrid Mamba model would need the recurrent state at every block
    boundary it may be reused from; vLLM keeps those only in its Mamba cache mode ``align``
    (prefix caching), which vLLM CPU 0.32 cannot run, and hands the connector the state at the
    prompt's end otherwise. Sliding-window groups drop the blocks outside the window before a
    request finishes (vLLM's null block takes their place), so their prefix blocks are gone when
    the store would save them -- a single sliding-window group as much as one of several."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, UniformTypeKVCacheSpecs

    groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []

    def full(spec: Any) -> bool:
        if isinstance(spec, UniformTypeKVCacheSpecs):
            return all(full(s) for s in spec.kv_cache_specs.values())
        return type(spec) in (FullAttentionSpec, MLAAttentionSpec)

    if len(groups) <= 1 and all(full(g.kv_cache_spec) for g in groups):
        return
    kinds = ", ".join(type(g.kv_cache_spec).__name__ for g in groups)
    raise ValueError(f"MooncakeCoreStoreConnector: this model has {len(groups)} KV cache group"
                     f"{'' if len(groups) == 1 else 's'} ({kinds}) under "
                     "vLLM's hybrid KV cache manager; the store keeps prefixes of one full-attention group only. A "
                     "sliding-window model runs with --disable-hybrid-kv-cache-manager (every block kept); a hybrid "
                     "Mamba model (its state exists only at the prompt's end) is served disaggregated through "
                     "MooncakeCoreConnector instead")


@dataclass
class StoreMeta(KVConnectorMetadata):
    """Scheduler -> worker each step: blocks to load now, blocks to save (request id -> pairs)."""

    loads: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    saves: dict[str, list[tuple[str, int]]] = field(default_factory=dict)


class MooncakeCoreStoreConnector(StatsHook, KVConnectorBase_V1, SupportsHMA):
    """Saves/loads full KV blocks to/from the Mooncake Store under prefix-chained keys.

    ``SupportsHMA`` so that vLLM keeps its hybrid KV cache manager on (a hybrid Mamba model does
    not start without it) and tells a model's groups apart; the store holds one group's blocks:
    a model with several KV cache groups, or a window or state group, is refused at start with the
    reason (``_one_group``)."""

    PROM = STORE_PROM  # series of vLLM's KV connector stats hook (connector_stats.py)

    _cache_hit_source = CacheHitSource.EXTERNAL_UNSPECIFIED

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig | None" = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        if vllm_config.parallel_config.tensor_parallel_size != 1:
            raise ValueError("MooncakeCoreStoreConnector supports tensor_parallel_size 1 only")
        _one_group(kv_cache_config)
        self.block_size = vllm_config.cache_config.block_size
        mc = vllm_config.model_config
        self.model_tag = f"{mc.model}|{mc.dtype}"
        self.role_ = role
        self.stats = S.StatsRecorder()  # hits/misses (scheduler), bytes and latency (worker): vLLM stats hook
        self.backoff = MasterBackoff(5.0, 30.0)  # skip the store while its master does not answer
        if role == KVConnectorRole.SCHEDULER:
            # The scheduler only asks the master what exists: it contributes no memory.
            self.store = _store_from_config(vllm_config, segment="0")
            self.lookup = vllm_config.kv_transfer_config.get_from_extra_config("store_lookup", "always")
            self.saves = vllm_config.kv_transfer_config.is_kv_producer  # kv_consumer: load only
            if self.lookup not in LOOKUP_MODES:
                raise ValueError(f"MooncakeCoreStoreConnector: store_lookup must be one of {LOOKUP_MODES}, "
                                 f"got {self.lookup!r}")
            self._keys: dict[str, list[str]] = {}
            self._start: dict[str, int] = {}
            self._loads: dict[str, list[tuple[str, int]]] = {}
            self._saves: dict[str, list[tuple[str, int]]] = {}
        else:
            self.store = _store_from_config(vllm_config, segment=None)
            self.slabs: list[Slab] = []
            self._errors: set[int] = set()
            self._saving: dict[str, tuple[Future, int]] = {}  # request id -> (save, blocks asked)
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mooncake-kv-save")
            self._lock = threading.Lock()

    # ---------------------------------------------------------------- scheduler side
    def _keys_for(self, request: "Request") -> list[str]:
        ks = self._keys.get(request.request_id)
        if ks is None:
            seed = namespace(self.model_tag, self.block_size, "v1", getattr(request, "cache_salt", None))
            ks = chained_block_keys(seed, list(request.prompt_token_ids or ()), self.block_size)
            self._keys[request.request_id] = ks
        return ks

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        keys = self._keys_for(request)
        # at least one prompt token must be computed locally to produce logits
        usable = min(len(keys), (len(request.prompt_token_ids or ()) - 1) // self.block_size)
        start = num_computed_tokens // self.block_size
        hint = hinted_blocks(getattr(request, "kv_transfer_params", None), self.block_size)
        if self.lookup == "hint":
            if hint is None:
                return 0, False
            usable = min(usable, hint)
        if usable <= start or not self.backoff.allow():
            return 0, False
        exists = self.store.batch_is_exist(keys[start:usable])
        if not self._master_answered(exists, f"lookup of request {request.request_id}", keys[start]):
            return 0, False  # computed locally
        hits = leading_hits(exists)
        self.stats.add(S.LOOKUP_HIT_BLOCKS, hits)
        self.stats.add(S.LOOKUP_MISS_BLOCKS, usable - start - hits)
        if hint is not None:
            logger.info("MooncakeCoreStoreConnector: store hint request=%s hinted=%d found=%d", request.request_id,
                        hint, start + hits)
        self._start[request.request_id] = start
        n = (start + hits) * self.block_size - num_computed_tokens
        return (n, False) if n > 0 else (0, False)

    def _master_answered(self, exists: list[int], what: str, key: str) -> bool:
        """Feed a ``batch_is_exist`` answer to the back-off; False (logged) when the master failed."""
        if any(e < 0 for e in exists):
            wait = self.backoff.failed()
            logger.warning("MooncakeCoreStoreConnector: %s: the store master did not answer (code %d, key %s); "
                           "skipping the store for %.1f s", what, min(exists), key, wait)
            return False
        if self.backoff.ok():
            logger.info("MooncakeCoreStoreConnector: the store master answers again")
        return True

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        if num_external_tokens <= 0:
            return
        start = self._start.get(request.request_id, 0)
        ids = blocks.get_block_ids()[0]
        n = num_external_tokens // self.block_size
        keys = self._keys_for(request)
        self._loads[request.request_id] = [(keys[start + i], ids[start + i]) for i in range(n)]

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = StoreMeta(loads=self._loads, saves=self._saves)
        self._loads, self._saves = {}, {}
        return meta

    def request_finished_all_groups(self, request: "Request",
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, block_ids[0] if block_ids else [])  # one group (_one_group)

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        from vllm.v1.request import RequestStatus

        keys = self._keys_for(request)
        self._keys.pop(request.request_id, None)
        self._start.pop(request.request_id, None)
        if not self.saves or request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED,
                                                    RequestStatus.FINISHED_STOPPED):
            return False, None
        n = min(len(keys), len(block_ids), request.num_computed_tokens // self.block_size)
        if n == 0:
            return False, None
        self._saves[request.request_id] = [(keys[i], block_ids[i]) for i in range(n)]
        return True, None  # keep the blocks until the worker has saved them

    # ---------------------------------------------------------------- worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        nb = self._kv_cache_config.num_blocks
        slabs: list[Slab] = []
        for name, t in kv_caches.items():
            slabs.extend(slabs_of(t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.element_size(), nb))
        for s in slabs:
            rc = self.store.register_buffer(s.base, s.nbytes)
            if rc != 0:
                raise RuntimeError(f"MooncakeCoreStoreConnector: register_buffer({s.base:#x}, {s.nbytes}) -> {rc}")
        self.slabs = slabs
        logger.info("MooncakeCoreStoreConnector: registered %d KV slabs (%d bytes per block each)", len(slabs),
                    slabs[0].block_bytes)

    def _bufs(self, block_id: int) -> tuple[list[int], list[int]]:
        return [s.addr(block_id) for s in self.slabs], [s.block_bytes for s in self.slabs]

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, StoreMeta)
        for rid, pairs in meta.saves.items():
            self._saving[rid] = (self._pool.submit(self._save, rid, pairs), len(pairs))
        if not meta.loads:
            return
        keys: list[str] = []
        ptrs: list[list[int]] = []
        sizes: list[list[int]] = []
        blocks: list[int] = []
        for pairs in meta.loads.values():
            for k, b in pairs:
                p, s = self._bufs(b)
                keys.append(k)
                ptrs.append(p)
                sizes.append(s)
                blocks.append(b)
        want = sum(sizes[0]) if sizes else 0
        t0 = time.monotonic()
        res = self.store.batch_get_into_multi_buffers(keys, ptrs, sizes)
        self.stats.observe(S.LOAD_SECONDS, time.monotonic() - t0)
        bad = [b for b, r in zip(blocks, res) if r != want]
        if bad:
            logger.error("MooncakeCoreStoreConnector: %d of %d block loads failed (codes %s)", len(bad), len(keys),
                         sorted({r for r in res if r != want})[:5])
            self._errors.update(bad)
        self.stats.add(S.LOADED_BLOCKS, len(keys) - len(bad))
        self.stats.add(S.LOADED_BYTES, (len(keys) - len(bad)) * want)
        self.stats.add(S.failure("load"), len(bad))
        logger.info("MooncakeCoreStoreConnector: kv loaded blocks=%d failed=%d", len(keys) - len(bad), len(bad))

    def _save(self, rid: str, pairs: list[tuple[str, int]]) -> tuple[int, int, float]:
        """(blocks saved, blocks that failed, seconds); runs on the save thread, so the figures are
        recorded by ``get_finished`` on vLLM's thread."""
        t0 = time.monotonic()
        keys = [k for k, _ in pairs]
        if not self.backoff.allow():
            logger.warning("MooncakeCoreStoreConnector: save of request %s skipped: the store master is not "
                           "answering", rid)
            return 0, len(pairs), time.monotonic() - t0
        exists = self.store.batch_is_exist(keys)
        if not self._master_answered(exists, f"save of request {rid} skipped", keys[0]):
            # a put would only wait another RPC timeout; the blocks are released now
            return 0, len(pairs), time.monotonic() - t0
        todo = [(k, b) for (k, b), e in zip(pairs, exists) if e != 1]
        if not todo:
            return 0, 0, time.monotonic() - t0
        ptrs, sizes = zip(*(self._bufs(b) for _, b in todo))
        res = self.store.batch_put_from_multi_buffers([k for k, _ in todo], list(ptrs), list(sizes))
        ok = sum(1 for r in res if r == 0)
        if RPC_FAIL in res:
            self.backoff.failed()  # the master died mid-save: the next saves need not wait for it
        if ok != len(todo):
            first = next(i for i, r in enumerate(res) if r != 0)
            logger.warning("MooncakeCoreStoreConnector: saved %d of %d blocks of request %s (first failure: key %s "
                           "code %d; codes %s)", ok, len(todo), rid, todo[first][0], res[first], sorted(set(res))[:5])
        logger.info("MooncakeCoreStoreConnector: kv saved request=%s blocks=%d", rid, ok)
        return ok, len(todo) - ok, time.monotonic() - t0

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads complete in start_load_kv, before the forward

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any) -> None:
        return  # whole blocks are saved once the request finishes

    def wait_for_save(self):
        return  # saves run in the background; their blocks stay allocated until get_finished reports them

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        done = {rid for rid, (f, _n) in self._saving.items() if f.done()}
        block_bytes = sum(s.block_bytes for s in self.slabs)
        for rid in done:
            f, n = self._saving.pop(rid)
            try:
                ok, failed, seconds = f.result()
            except Exception as e:
                logger.error("MooncakeCoreStoreConnector: saving request %s failed: %s", rid, e)
                self.stats.add(S.failure("save"), n)
                continue
            self.stats.add(S.SAVED_BLOCKS, ok)
            self.stats.add(S.SAVED_BYTES, ok * block_bytes)
            self.stats.add(S.failure("save"), failed)
            self.stats.observe(S.SAVE_SECONDS, seconds)
        return (done or None), None

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._errors = self._errors, set()
        return out

    def stats_recorder(self) -> S.StatsRecorder:
        return self.stats

    def shutdown(self):
        if self.role_ == KVConnectorRole.WORKER:
            self._pool.shutdown(wait=True)
        try:
            self.store.close()
        except Exception:
            pass
