"""ClusterState: what the scheduler knows about the cluster — pure, mutable, no I/O, no clock.

Two kinds of knowledge, kept by the caller (live proxy or simulator):

* **Prefix index** — which chained block keys each prefill instance holds (an LRU model of its
  KV cache, fed by what the proxy routed there and, when available, by the engine's KV-cache
  events so evictions are seen), plus an optional global store tier (Mooncake Store).
* **Load** — per prefill instance the FIFO of requests queued/running with their uncached
  token counts; per decode instance the running requests and their KV footprint, plus the
  requests still in prefill that are headed there (for prediction-based admission).

Time is always passed in as ``now`` (seconds on the caller's clock), so the simulator can run
it on virtual time and tests on handmade states.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable, KeysView, Protocol, Sequence

from .datatypes import Decision, InstanceInfo, RequestInfo, Role, ROLES
from .handoff_queue import HandoffQueue
from .lru import LruBlockCache
from .ttft_error import TtftErrorQuantile

__all__ = ["ClusterState", "PrefillEntry", "DecodeEntry", "PrefillLoad", "DecodeLoad", "STORE"]

#: ``best_remote_prefix`` source name for the global store tier.
STORE = "store"


@dataclass(slots=True)
class PrefillEntry:
    """One request queued or running on a prefill instance."""

    request_id: str
    new_tokens: int        # tokens to compute (prompt minus reused prefix)
    cached_tokens: int     # reused prefix tokens (attention still reads them)
    enqueued_at: float
    decode_id: str | None = None  # where it goes next, if known (prediction-based admission)
    max_output_tokens: int = 0
    prompt_tokens: int = 0
    remote_blocks: int = 0  # blocks fetched from another instance / the store before computing
    pending: tuple[int, ...] = ()  # blocks this prefill will produce (not yet readable remotely)
    est_s: float = -1.0    # scheduler's cached prefill-time estimate (-1 = not computed yet)


@dataclass(slots=True)
class DecodeEntry:
    """One request running on a decode instance."""

    request_id: str
    prompt_tokens: int
    max_output_tokens: int
    started_at: float


@dataclass(slots=True)
class PrefillLoad:
    """FIFO of a prefill instance. ``head_since`` is when the head entry started running, so
    its remaining time can be estimated as (its prefill time − (now − head_since))."""

    entries: OrderedDict[str, PrefillEntry] = field(default_factory=OrderedDict)
    head_since: float = 0.0
    queued_tokens: int = 0
    est_sum: float = 0.0   # Σ est_s of entries whose estimate is known (O(1) queue time)
    n_unknown: int = 0     # entries still without an estimate
    #: every instance's busy seconds (prefills' busy_times, decodes' decode_busy_times) when the head
    #: started, with ``ClusterState.track_head_busy``: how busy its hardware mates were since
    head_busy: dict[str, float] | None = None

    def set_estimate(self, entry: PrefillEntry, est_s: float) -> None:
        """Attach a duration estimate to an entry that had none (the scheduler does this
        lazily for entries added without ``est_s``)."""
        if entry.est_s < 0 and est_s >= 0:
            entry.est_s = est_s
            self.est_sum += est_s
            self.n_unknown -= 1


@dataclass(slots=True)
class DecodeLoad:
    """Running set of a decode instance. ``kv_tokens`` estimates the KV held: Σ (prompt +
    half the expected output) — the average footprint over each request's life.
    ``first_token_s``: the delay from a prefill's end to this instance's first token (KV pull,
    queueing, first step) as the caller measures it (the live proxy's ``--calibrate``; 0 in the
    simulator, whose TTFT ends with the prefill); the TTFT SLO check adds it. ``handoff``: the
    hand-off stage as a queue (the live proxy's ``--calibrate``); when set, it replaces the flat
    ``first_token_s`` (:meth:`ClusterState.first_token_in`)."""

    entries: dict[str, DecodeEntry] = field(default_factory=dict)
    kv_tokens: int = 0
    incoming: dict[str, PrefillEntry] = field(default_factory=dict)
    first_token_s: float = 0.0
    handoff: HandoffQueue | None = None

    @property
    def running(self) -> int:
        return len(self.entries)


class StoreView(Protocol):
    """What the store tier needs from a view of the real store (``mooncake_proxy/store_view.py``)."""

    def prefix_len(self, block_hashes: Sequence[int]) -> int: ...

    def __len__(self) -> int: ...


def kv_footprint(prompt_tokens: int, max_output_tokens: int) -> int:
    """Average KV tokens a request holds while decoding: its prompt plus half its output."""
    return prompt_tokens + max_output_tokens // 2


def _busy_up_to(total: dict[str, float], since: dict[str, float], now: float) -> dict[str, float]:
    """instance -> its busy seconds up to ``now``: those of its past busy periods (``total``) plus,
    while busy, the current one's (begun at ``since``)."""
    out = dict(total)
    for iid, t in since.items():
        out[iid] = out.get(iid, 0.0) + max(0.0, now - t)
    return out


class ClusterState:
    """Instances, prefix index and load of one P/D cluster (see module docstring).

    ``block_size``: tokens per prefix block (matches the :class:`BlockHasher` in use).
    ``store_capacity_blocks``: None = no global store tier; 0 = unlimited; N = LRU of N blocks.
    """

    def __init__(self, block_size: int = 512, store_capacity_blocks: int | None = None) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0 tokens, got {block_size}")
        self.block_size = block_size
        self._infos: dict[str, InstanceInfo] = {}
        self._caches: dict[str, LruBlockCache] = {}
        self._holders: dict[int, set[str]] = {}
        self._prefill: dict[str, PrefillLoad] = {}
        # Blocks routed to an instance whose prefill has not finished: usable by requests
        # queued behind it there (FIFO), but not yet fetchable by anyone else.
        self._pending: dict[str, dict[int, int]] = {}
        self._decode: dict[str, DecodeLoad] = {}
        self._store: LruBlockCache | None = None
        self._store_view: StoreView | None = None
        #: the TTFT check's per-pair safety margin (ttft_error.py; the live proxy's --calibrate)
        self.ttft_errors: TtftErrorQuantile | None = None
        #: whether an engine can load a prefix another *instance* holds (the simulator: yes). The live
        #: proxy sets False: our connectors load prefixes from the store (the hint), and the P2P
        #: connector only moves a request's own KV to its decode -- a plan counting on a peer's copy
        #: would be estimated as a fetch and then recomputed (seen on the live bench: 0 % store hits
        #: for the conductor, whose peer "fetches" tied with the store's and won)
        self.peer_fetch: bool = True
        #: whether a peer's copy is read only after the peer itself answers a request for it (the live
        #: proxy's --peer-prefix: the holder's vLLM scheduler must run an export request, behind its own
        #: queue, before the chosen prefill is sent the request). The simulator reads a peer's memory
        #: directly, as the paper's RDMA does: False.
        self.peer_export_waits: bool = False
        # prefill instances with a request queued or running, and its integral over time (the
        # contention a request ran under: busy_area, contention.py)
        self._busy_area = 0.0
        self._busy_t = 0.0
        #: snapshot the busy times at each head's start (PrefillLoad.head_busy): the scheduler's
        #: processor sharing of declared hardware groups reads how much of the head is done from it
        self.track_head_busy = False
        # per prefill instance: seconds busy before its current busy period, and (while busy) when
        # that began -- so the busy instances are the keys of _busy_since
        self._busy_total: dict[str, float] = {}
        self._busy_since: dict[str, float] = {}
        # the same per decode instance, busy while it has a stream running (decode_busy_times)
        self._dbusy_total: dict[str, float] = {}
        self._dbusy_since: dict[str, float] = {}
        if store_capacity_blocks is not None:
            self._store = LruBlockCache(store_capacity_blocks)

    # ------------------------------------------------------------------ instances
    def add_instance(self, info: InstanceInfo) -> None:
        """Add an instance, or update an existing one's info (capacity/health) keeping its
        cache and load. Changing an existing instance's role is refused."""
        old = self._infos.get(info.instance_id)
        if old is not None:
            if old.role != info.role:
                raise ValueError(
                    f"instance {info.instance_id!r} already registered as {old.role}; "
                    f"remove it before re-adding it as {info.role}")
            self._infos[info.instance_id] = info
            if info.role == "prefill":
                self._unindex(info.instance_id, self._caches[info.instance_id].set_capacity(info.cache_capacity_blocks))
            return
        self._infos[info.instance_id] = info
        if info.role == "prefill":
            self._caches[info.instance_id] = LruBlockCache(info.cache_capacity_blocks)
            self._prefill[info.instance_id] = PrefillLoad()
            self._pending[info.instance_id] = {}
        else:
            self._decode[info.instance_id] = DecodeLoad()

    def remove_instance(self, instance_id: str) -> InstanceInfo:
        """Forget an instance, its cached blocks and its load. Returns its info."""
        info = self._require(instance_id)
        del self._infos[instance_id]
        cache = self._caches.pop(instance_id, None)
        if cache is not None:
            self._unindex(instance_id, cache.clear())
        pload = self._prefill.pop(instance_id, None)
        self._pending.pop(instance_id, None)
        self._decode.pop(instance_id, None)
        if self.ttft_errors is not None:
            self.ttft_errors.forget(instance_id)
        for dl in self._decode.values():
            if dl.handoff is not None:
                dl.handoff.forget(instance_id)
        self._advance_busy(self._busy_t)
        self._busy_total.pop(instance_id, None)
        self._busy_since.pop(instance_id, None)
        self._dbusy_total.pop(instance_id, None)
        self._dbusy_since.pop(instance_id, None)
        if pload is not None:
            # Its queued requests will never reach their decode instance: stop counting them
            # as incoming load there.
            for rid, e in pload.entries.items():
                if e.decode_id is not None and e.decode_id in self._decode:
                    self._decode[e.decode_id].incoming.pop(rid, None)
        return info

    def set_healthy(self, instance_id: str, healthy: bool) -> None:
        """Mark up/down. Unhealthy instances are never chosen; their cache and load are kept
        (a flapping instance comes back with what it had)."""
        self._require(instance_id).healthy = bool(healthy)

    def instances(self, role: Role | None = None) -> list[InstanceInfo]:
        """All instances of ``role`` ("prefill"/"decode"; None = all), healthy or not,
        in registration order."""
        if role is not None and role not in ROLES:
            raise ValueError(f"role must be one of {ROLES} or None, got {role!r}")
        return [i for i in self._infos.values() if role is None or i.role == role]

    def healthy_instances(self, role: Role) -> list[InstanceInfo]:
        return [i for i in self._infos.values() if i.role == role and i.healthy]

    def get_instance(self, instance_id: str) -> InstanceInfo:
        return self._require(instance_id)

    def __contains__(self, instance_id: object) -> bool:
        return instance_id in self._infos

    def _require(self, instance_id: str, role: Role | None = None) -> InstanceInfo:
        info = self._infos.get(instance_id)
        if info is None:
            raise KeyError(f"unknown instance {instance_id!r}; known: {sorted(self._infos) or 'none'}")
        if role is not None and info.role != role:
            raise ValueError(f"instance {instance_id!r} is a {info.role} instance, expected {role}")
        return info

    # ------------------------------------------------------------------ prefix index
    def _unindex(self, instance_id: str, keys: Iterable[int]) -> None:
        holders = self._holders
        for k in keys:
            s = holders.get(k)
            if s is not None:
                s.discard(instance_id)
                if not s:
                    del holders[k]

    def record_blocks(self, instance_id: str, block_hashes: Sequence[int]) -> list[int]:
        """The prefill instance now holds ``block_hashes`` (LRU touch in order); blocks beyond
        its capacity are evicted, least recently used first. Returns the evicted keys."""
        self._require(instance_id, "prefill")
        cache = self._caches[instance_id]
        holders = self._holders
        for k in block_hashes:
            s = holders.get(k)
            if s is None:
                holders[k] = {instance_id}
            else:
                s.add(instance_id)
        evicted = cache.insert(block_hashes)
        if evicted:
            self._unindex(instance_id, evicted)
        return evicted

    def remove_blocks(self, instance_id: str, block_hashes: Iterable[int]) -> int:
        """The instance dropped these blocks (e.g. a vLLM ``BlockRemoved`` event). Returns how
        many were known. Unknown instances are ignored (events may outlive an instance)."""
        cache = self._caches.get(instance_id)
        if cache is None:
            return 0
        removed = cache.remove(block_hashes)
        self._unindex(instance_id, removed)
        return len(removed)

    def clear_blocks(self, instance_id: str) -> int:
        """The instance dropped its whole cache (vLLM ``AllBlocksCleared``, or a restart)."""
        cache = self._caches.get(instance_id)
        if cache is None:
            return 0
        keys = cache.clear()
        self._unindex(instance_id, keys)
        return len(keys)

    def cached_block_count(self, instance_id: str) -> int:
        cache = self._caches.get(instance_id)
        return len(cache) if cache is not None else 0

    def prefix_hit_blocks(self, instance_id: str, block_hashes: Sequence[int]) -> int:
        """Leading blocks of ``block_hashes`` the instance holds (0 for decode/unknown)."""
        cache = self._caches.get(instance_id)
        return cache.prefix_len(block_hashes) if cache is not None else 0

    def prefix_hits_all(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Leading-block hits of every prefill instance holding at least the first block, in
        one pass over the index (cost ∝ prefix length, not instance count)."""
        out: dict[str, int] = {}
        if not block_hashes:
            return out
        holders = self._holders
        alive = holders.get(block_hashes[0])
        if not alive:
            return out
        alive = set(alive)
        i = 1
        n = len(block_hashes)
        while i < n and alive:
            nxt = holders.get(block_hashes[i])
            if nxt is None:
                break
            if not alive <= nxt:
                for inst in alive - nxt:
                    out[inst] = i
                alive &= nxt
            i += 1
        for inst in alive:
            out[inst] = i
        return out

    def best_remote_prefix(self, block_hashes: Sequence[int],
                           exclude: Iterable[str] | str = ()) -> tuple[str | None, int]:
        """Longest leading run of ``block_hashes`` held by ONE healthy instance not in
        ``exclude``, or by the store tier. Returns ``(instance_id | "store" | None, nblocks)``.
        Blocks an instance is still computing (routed, prefill not done) do not count.
        Instances win ties over the store (their copy is already in a peer's memory)."""
        excl = {exclude} if isinstance(exclude, str) else set(exclude)
        best: tuple[str | None, int] = (None, 0)
        for inst, n in self.prefix_hits_all(block_hashes).items():
            if inst in excl or not self._infos[inst].healthy:
                continue
            n = self.ready_prefix(inst, block_hashes, n)
            if n > best[1] or (n == best[1] and best[0] is not None and inst < best[0]):
                best = (inst, n)
        s = self.store_hit_blocks(block_hashes)
        if s > best[1]:
            best = (STORE, s)
        return best

    def ready_prefix(self, instance_id: str, block_hashes: Sequence[int], n: int) -> int:
        """Of the first ``n`` blocks (held by the instance), how many leading ones are already
        computed — i.e. readable by another instance — rather than pending in its queue."""
        pend = self._pending.get(instance_id)
        if not pend:
            return n
        for i in range(n):
            if block_hashes[i] in pend:
                return i
        return n

    # store tier
    @property
    def store_enabled(self) -> bool:
        return self._store is not None or self._store_view is not None

    @property
    def store_capacity_blocks(self) -> int | None:
        if self._store_view is not None:
            return 0
        return self._store.capacity if self._store is not None else None

    def set_store_view(self, view: StoreView | None) -> None:
        """Answer the store tier from what the store really holds (``view``) instead of the
        LRU model below; the model's records are then ignored (the store publishes its own
        puts and evictions). None goes back to the model."""
        self._store_view = view

    def enable_store(self, capacity_blocks: int = 0) -> None:
        """Turn on (or resize) the global store tier; 0 = unlimited."""
        if self._store is None:
            self._store = LruBlockCache(capacity_blocks)
        else:
            self._store.set_capacity(capacity_blocks)

    def store_record(self, block_hashes: Sequence[int]) -> list[int]:
        """The store now holds these blocks (LRU touch). No-op when the tier is disabled or
        answered by a real view (the store reports its puts itself)."""
        if self._store_view is not None or self._store is None:
            return []
        return self._store.insert(block_hashes)

    def store_remove(self, block_hashes: Iterable[int]) -> int:
        if self._store_view is not None or self._store is None:
            return 0
        return len(self._store.remove(block_hashes))

    def store_hit_blocks(self, block_hashes: Sequence[int]) -> int:
        if self._store_view is not None:
            return self._store_view.prefix_len(block_hashes)
        return self._store.prefix_len(block_hashes) if self._store is not None else 0

    def store_block_count(self) -> int:
        if self._store_view is not None:
            return len(self._store_view)
        return len(self._store) if self._store is not None else 0

    # ------------------------------------------------------------------ load
    def prefill_ids(self) -> KeysView[str]:
        """Every prefill instance's id, healthy or not (a live view: do not change the cluster
        while iterating it)."""
        return self._prefill.keys()

    def busy_prefills(self) -> int:
        """Prefill instances with a request queued or running now."""
        return len(self._busy_since)

    def busy_area(self, now: float) -> float:
        """The integral of :meth:`busy_prefills` over time up to ``now`` (its origin is arbitrary):
        the difference of two readings over the time between them is the mean number of busy
        prefill instances meanwhile -- the contention a request ran under (contention.py)."""
        return self._busy_area + len(self._busy_since) * max(0.0, now - self._busy_t)

    def is_prefill_busy(self, instance_id: str) -> bool:
        """Whether the prefill instance has a request queued or running."""
        return instance_id in self._busy_since

    def busy_times(self, now: float) -> dict[str, float]:
        """prefill instance -> seconds it has had a request queued or running, up to ``now`` (its
        origin is arbitrary): the difference of two readings over the time between them is the
        share of that time each prefill was busy -- what slowed a decode stream meanwhile
        (``contention.Interference``)."""
        return _busy_up_to(self._busy_total, self._busy_since, now)

    def decode_busy_times(self, now: float) -> dict[str, float]:
        """decode instance -> seconds it has had a stream running, up to ``now`` (origin arbitrary):
        as :meth:`busy_times` for the prefills -- a decode's steps slow the prefills that share its
        hardware (contention.py, the prefill-on-prefill fit takes the decodes as columns too)."""
        return _busy_up_to(self._dbusy_total, self._dbusy_since, now)

    def is_decode_busy(self, instance_id: str) -> bool:
        """Whether the decode instance has a stream running."""
        return instance_id in self._dbusy_since

    def _snapshot_head(self, load: PrefillLoad, now: float) -> None:
        if self.track_head_busy:
            load.head_busy = {**self.busy_times(now), **self.decode_busy_times(now)}

    def _advance_busy(self, now: float) -> None:
        """Integrate the busy count up to ``now``; call before the busy set changes."""
        if now > self._busy_t:
            self._busy_area += len(self._busy_since) * (now - self._busy_t)
            self._busy_t = now

    def prefill_load(self, instance_id: str) -> PrefillLoad:
        self._require(instance_id, "prefill")
        return self._prefill[instance_id]

    def decode_load(self, instance_id: str) -> DecodeLoad:
        self._require(instance_id, "decode")
        return self._decode[instance_id]

    def first_token_in(self, decode_id: str, now: float, prefill_s: float, prefill_id: str | None = None) -> float:
        """Predicted seconds from ``now`` to the first token on decode ``decode_id`` of a request
        whose prefill (queue included) takes ``prefill_s``: the flat ``first_token_s`` on top, or,
        with a hand-off queue, that queue's estimate counting the requests still in prefill headed
        there as ahead of it (they were admitted first), with ``prefill_id``'s own hand-off time."""
        load = self.decode_load(decode_id)
        if load.handoff is None:
            return prefill_s + load.first_token_s
        return load.handoff.first_token_in(now, prefill_s, len(load.incoming), prefill_id)

    def ttft_margin(self, prefill_id: str, decode_id: str, now: float, *, fade: bool = True,
                    queued: bool = False) -> float:
        """Seconds the TTFT check adds to the pair's prediction: the quantile of its recent errors
        (``ttft_errors``; 0 when none is installed, as in the simulator, or nothing was learned).
        ``fade=False``: without the fade of old errors; ``queued``: the request would wait behind
        others, so at least what such requests missed by lately (TtftErrorQuantile.margin)."""
        errs = self.ttft_errors
        return errs.margin(prefill_id, decode_id, now, fade=fade, queued=queued) if errs is not None else 0.0

    def on_prefill_start(self, instance_id: str, req: RequestInfo, now: float, *,
                         cached_blocks: int | None = None, decode_id: str | None = None,
                         remote_blocks: int = 0, est_s: float | None = None) -> None:
        """The request was sent to prefill instance ``instance_id`` (queued or running).

        ``cached_blocks``: prefix blocks it will reuse (Decision.cached_blocks); default: what
        the instance holds locally now. ``decode_id``: its decode instance if already chosen —
        lets prediction-based admission count it as incoming load there. ``remote_blocks``:
        blocks it fetches first (Decision.remote_blocks), part of its predicted duration.
        ``est_s``: its predicted duration (fetch + prefill) if known — keeps queue-time
        estimates O(1); otherwise the scheduler computes it from the cost model when needed.
        """
        self._require(instance_id, "prefill")
        load = self._prefill[instance_id]
        if req.request_id in load.entries:
            return  # idempotent: a retry of the same call must not double-count
        if cached_blocks is None:
            cached_blocks = self.prefix_hit_blocks(instance_id, req.block_hashes)
        cached = min(req.prompt_tokens, cached_blocks * self.block_size)
        new = max(req.prompt_tokens - cached, 1 if req.prompt_tokens else 0)
        held = self.prefix_hit_blocks(instance_id, req.block_hashes)
        pending = tuple(req.block_hashes[max(held, cached_blocks):])
        pend = self._pending[instance_id]
        for k in pending:
            pend[k] = pend.get(k, 0) + 1
        entry = PrefillEntry(req.request_id, new, cached, now, decode_id, req.max_output_tokens, req.prompt_tokens,
                             remote_blocks, pending)
        if est_s is not None and est_s >= 0:
            entry.est_s = float(est_s)
            load.est_sum += entry.est_s
        else:
            load.n_unknown += 1
        if not load.entries:
            load.head_since = now
            self._advance_busy(now)
            self._busy_since[instance_id] = now
            self._snapshot_head(load, now)
        load.entries[req.request_id] = entry
        load.queued_tokens += new
        if decode_id is not None and decode_id in self._decode:
            self._decode[decode_id].incoming[req.request_id] = entry

    def on_prefill_done(self, instance_id: str, req: RequestInfo, now: float) -> bool:
        """Prefill finished (or failed). Returns False if the instance/request is unknown
        (e.g. removed meanwhile) — harmless, so callers can call it from cleanup paths."""
        load = self._prefill.get(instance_id)
        if load is None:
            return False
        entry = load.entries.get(req.request_id)
        if entry is None:
            return False
        was_head = next(iter(load.entries)) == req.request_id
        del load.entries[req.request_id]
        load.queued_tokens -= entry.new_tokens
        if entry.est_s >= 0:
            load.est_sum -= entry.est_s
        else:
            load.n_unknown -= 1
        if not load.entries:
            load.est_sum = 0.0  # no float drift accumulates across busy periods
            load.n_unknown = 0
            self._advance_busy(now)
            since = self._busy_since.pop(instance_id, now)
            self._busy_total[instance_id] = self._busy_total.get(instance_id, 0.0) + max(0.0, now - since)
        pend = self._pending[instance_id]
        for k in entry.pending:
            c = pend.get(k, 0) - 1
            if c > 0:
                pend[k] = c
            else:
                pend.pop(k, None)
        if was_head:
            load.head_since = now
            if load.entries:
                self._snapshot_head(load, now)
        if entry.decode_id is not None and entry.decode_id in self._decode:
            self._decode[entry.decode_id].incoming.pop(req.request_id, None)
        return True

    def on_decode_start(self, instance_id: str, req: RequestInfo, now: float) -> None:
        """The request started decoding on ``instance_id``."""
        self._require(instance_id, "decode")
        load = self._decode[instance_id]
        load.incoming.pop(req.request_id, None)
        if req.request_id in load.entries:
            return
        load.entries[req.request_id] = DecodeEntry(req.request_id, req.prompt_tokens, req.max_output_tokens, now)
        load.kv_tokens += kv_footprint(req.prompt_tokens, req.max_output_tokens)
        self._dbusy_since.setdefault(instance_id, now)

    def on_decode_done(self, instance_id: str, req: RequestInfo, now: float) -> bool:
        """Decode finished, failed or was cancelled. False if unknown (harmless)."""
        load = self._decode.get(instance_id)
        if load is None:
            return False
        load.incoming.pop(req.request_id, None)
        e = load.entries.pop(req.request_id, None)
        if e is None:
            return False
        load.kv_tokens -= kv_footprint(e.prompt_tokens, e.max_output_tokens)
        if not load.entries and (since := self._dbusy_since.pop(instance_id, None)) is not None:
            self._dbusy_total[instance_id] = self._dbusy_total.get(instance_id, 0.0) + max(0.0, now - since)
        return True

    def on_scheduled(self, decision: Decision, req: RequestInfo, now: float, *, record: bool = True) -> None:
        """Convenience for callers acting on a Decision: ``on_prefill_start`` with the
        decision's reuse and decode target, and (``record=True``) ``record_blocks`` of the
        whole prompt on the prefill instance — it will hold them once the prefill runs, and
        later requests routed there queue behind this one — plus the hot-prefix copy into
        the store when the decision asks for it."""
        self.on_prefill_start(decision.prefill_id, req, now,
                              cached_blocks=decision.cached_blocks, decode_id=decision.decode_id,
                              remote_blocks=decision.remote_blocks,
                              est_s=max(0.0, decision.est_ttft_s - decision.est_queue_s))
        if record:
            self.record_blocks(decision.prefill_id, req.block_hashes)
        if decision.replicate_blocks:
            self.store_record(req.block_hashes[: decision.replicate_blocks])
