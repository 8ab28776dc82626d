"""Keep the scheduler's prefix index in sync with vLLM's KV cache events.

vLLM (``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'``)
publishes over a ZMQ PUB socket multipart messages ``[topic, seq (8-byte big-endian), payload]``
where the payload is a msgpack ``KVEventBatch`` — ``{ts, events, data_parallel_rank}`` (older
versions: the same fields as an array) — of tagged events ``BlockStored`` (block_hashes,
parent_block_hash, token_ids, block_size, ...), ``BlockRemoved`` (block_hashes) and
``AllBlocksCleared``. Without these the proxy only knows what it routed and never sees
evictions, so a cache-aware scheduler keeps sending requests to an instance that has already
dropped their prefix.

vLLM's block hashes are its own (sha256 of its block keys); the scheduler keys blocks with
``BlockHasher``. :class:`KvEventApplier` translates: for each stored block it continues our
hash chain from the parent's key over the block's ``token_ids``, remembers vLLM-hash → our key,
and applies ``record_blocks`` / ``remove_blocks`` / ``clear_blocks`` to ``ClusterState``. Keys
match the proxy's own prompt hashing when the proxy hashes real token ids (``--tokenizer`` or
token-id prompts) with ``--block-size`` equal to the engine's block size; events with another
block size are counted and skipped (a warning says why).

The applier is pure (no sockets); :class:`KvEventsSubscriber` does the ZMQ I/O.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import msgspec

from mooncake_core.utils.extras import require
from mooncake_core.utils.log import get_logger

from .registry import Registry

log = get_logger("mooncake_proxy.kv_events")


def continue_chain(hasher: Any, parent_key: int | None, block_tokens: Sequence[int]) -> int:
    """Our key of one full block whose prefix ends in ``parent_key`` (None = first block).

    Delegates to ``BlockHasher.continue_chain`` so the proxy and the scheduler share one
    hashing scheme.
    """
    return hasher.continue_chain(parent_key, list(block_tokens))


def _field(ev: Any, name: str, index: int) -> Any:
    if isinstance(ev, dict):
        return ev.get(name)
    return ev[index] if len(ev) > index else None


@dataclass
class ApplyStats:
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    skipped: int = 0


class KvEventApplier:
    """Applies decoded vLLM event batches of one instance to ``ClusterState`` (pure)."""

    def __init__(self, cluster: Any, hasher: Any, instance_id: str) -> None:
        self.cluster = cluster
        self.hasher = hasher
        self.instance_id = instance_id
        self.block_size = int(hasher.block_size)
        self._ours: dict[Hashable, int] = {}  # vLLM block hash -> our key
        self.stats = ApplyStats()
        self._warned = False

    @staticmethod
    def _key(h: Any) -> Hashable:
        return bytes(h) if isinstance(h, (bytearray, memoryview)) else (tuple(h) if isinstance(h, list) else h)

    def apply_payload(self, payload: bytes) -> ApplyStats:
        """Decode one msgpack ``KVEventBatch`` and apply it; ValueError if it is not one."""
        try:
            batch = msgspec.msgpack.decode(payload)
        except msgspec.DecodeError as e:
            raise ValueError(f"KV event payload from {self.instance_id} is not msgpack: {e}") from None
        if isinstance(batch, dict):
            events = batch.get("events")
        elif isinstance(batch, list) and len(batch) >= 2:
            events = batch[1]
        else:
            events = None
        if not isinstance(events, list):
            raise ValueError(f"KV event payload from {self.instance_id}: expected a KVEventBatch "
                             f"{{ts, events, data_parallel_rank}}, got {type(batch).__name__}")
        for ev in events:
            self.apply_event(ev)
        return self.stats

    def apply_event(self, ev: Any) -> None:
        tag = ev.get("type") if isinstance(ev, dict) else (ev[0] if isinstance(ev, list) and ev else None)
        off = 0 if isinstance(ev, dict) else 1  # array form: tag first, then the fields in order
        if tag == "BlockStored":
            hashes = _field(ev, "block_hashes", off) or []
            parent = _field(ev, "parent_block_hash", off + 1)
            tokens = _field(ev, "token_ids", off + 2) or []
            bsize = _field(ev, "block_size", off + 3)
            extra = _field(ev, "extra_keys", off + 7)
            if _field(ev, "lora_id", off + 4) is not None or _field(ev, "lora_name", off + 6) is not None:
                extra = [("lora",)] * len(hashes)  # an adapter's KV: never a base-model prompt's
            self._stored([self._key(h) for h in hashes], None if parent is None else self._key(parent),
                         tokens, bsize, extra if isinstance(extra, list) else None)
        elif tag == "BlockRemoved":
            hashes = _field(ev, "block_hashes", off) or []
            ours = [o for h in hashes if (o := self._ours.pop(self._key(h), None)) is not None]
            if ours:
                self.cluster.remove_blocks(self.instance_id, ours)
            self.stats.removed += len(hashes)
        elif tag == "AllBlocksCleared":
            self._ours.clear()
            self.cluster.clear_blocks(self.instance_id)
            self.stats.cleared += 1
        else:
            self.stats.skipped += 1

    def _stored(self, hashes: list[Hashable], parent: Hashable | None, tokens: list[int], bsize: Any,
                extra_keys: list[Any] | None = None) -> None:
        """Map stored blocks to our keys. A block with extra keys (a cache salt, multimodal
        inputs, a LoRA adapter) is not keyed by its tokens alone, so no plain prompt of ours
        can match it: it and the rest of its chain are skipped (children find no parent)."""
        if bsize != self.block_size:
            if not self._warned:
                log.warning("KV events block_size differs from --block-size; stored blocks ignored",
                            extra={"instance": self.instance_id, "event_block_size": bsize,
                                   "proxy_block_size": self.block_size})
                self._warned = True
            self.stats.skipped += len(hashes)
            return
        if parent is None:
            prev: int | None = None
        else:
            prev = self._ours.get(parent)
            if prev is None:  # parent unknown (evicted, or published before we subscribed)
                self.stats.skipped += len(hashes)
                return
        ours = []
        bs = self.block_size
        for i, h in enumerate(hashes):
            block = tokens[i * bs:(i + 1) * bs]
            if len(block) < bs or (extra_keys is not None and i < len(extra_keys) and extra_keys[i] is not None):
                self.stats.skipped += len(hashes) - i
                break
            prev = continue_chain(self.hasher, prev, block)
            self._ours[h] = prev
            ours.append(prev)
        if ours:
            self.cluster.record_blocks(self.instance_id, ours)
        self.stats.stored += len(ours)


@dataclass
class EventSource:
    instance_url: str
    endpoint: str
    topic: str = ""
    role: str = "prefill"


def parse_config(value: str) -> list[EventSource]:
    """``--kv-events-config``: a JSON file path or inline JSON.

    ``{"http://p1:8100": "tcp://p1:5557"}`` or
    ``{"http://p1:8100": {"endpoint": "tcp://p1:5557", "topic": "", "role": "prefill"}}``.
    """
    text = value
    if not value.lstrip().startswith("{") and os.path.exists(value):
        with open(value) as f:
            text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--kv-events-config: not a JSON file or inline JSON object: {e}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError("--kv-events-config: expected an object {instance_url: endpoint | {endpoint, topic, role}}")
    out = []
    for url, spec in data.items():
        if isinstance(spec, str):
            spec = {"endpoint": spec}
        if not isinstance(spec, dict) or not isinstance(spec.get("endpoint"), str):
            raise ValueError(f"--kv-events-config: entry for {url!r} needs an 'endpoint' like 'tcp://host:5557'")
        out.append(EventSource(url, spec["endpoint"], str(spec.get("topic", "")), str(spec.get("role", "prefill"))))
    return out


class KvEventsSubscriber:
    """One ZMQ SUB socket per configured publisher, feeding a :class:`KvEventApplier` each.

    Given its collaborators, not the server: the instance registry (ids, whether an instance is
    still registered), the cluster state and block hasher the appliers update, and the
    ``mooncake_proxy_kv_events`` counter (labels instance, type)."""

    def __init__(self, sources: list[EventSource], *, registry: Registry, cluster: Any, hasher: Any,
                 events: Any) -> None:
        self.sources = sources
        self.registry = registry
        self.cluster = cluster
        self.hasher = hasher
        self.events = events
        self._tasks: list[asyncio.Task[None]] = []
        self._ctx: Any = None
        self.appliers: dict[str, KvEventApplier] = {}

    @classmethod
    def from_config(cls, value: str, *, registry: Registry, cluster: Any, hasher: Any,
                    events: Any) -> "KvEventsSubscriber":
        return cls(parse_config(value), registry=registry, cluster=cluster, hasher=hasher, events=events)

    def start(self) -> None:
        zmq_asyncio = require("zmq.asyncio", "kv-events", "the proxy's KV-event subscriber (--kv-events)")
        self._ctx = zmq_asyncio.Context()
        for src in self.sources:
            iid = self.registry.make_id(src.role, src.instance_url)
            self.appliers[iid] = KvEventApplier(self.cluster, self.hasher, iid)
            self._tasks.append(asyncio.create_task(self._run(src, iid), name=f"kv-events-{iid}"))

    async def _run(self, src: EventSource, iid: str) -> None:
        import zmq

        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, src.topic.encode())
        sock.connect(src.endpoint)
        log.info("subscribed to KV events", extra={"instance": iid, "endpoint": src.endpoint})
        applier = self.appliers[iid]
        last_seq: int | None = None
        try:
            while True:
                frames = await sock.recv_multipart()
                if len(frames) != 3:
                    log.warning("KV event message with %d frames (expected topic, seq, payload)", len(frames),
                                extra={"instance": iid})
                    continue
                seq = int.from_bytes(frames[1], "big", signed=True)
                if last_seq is not None and seq != last_seq + 1:
                    log.warning("KV events gap: prefix index may be stale",
                                extra={"instance": iid, "expected": last_seq + 1, "got": seq})
                last_seq = seq
                if self.registry.get(iid) is None:
                    continue  # instance not (or no longer) registered
                try:
                    before = (applier.stats.stored, applier.stats.removed, applier.stats.cleared)
                    applier.apply_payload(frames[2])
                    m = self.events
                    for typ, n0, n1 in zip(("stored", "removed", "cleared"), before,
                                           (applier.stats.stored, applier.stats.removed, applier.stats.cleared)):
                        if n1 > n0:
                            m.labels(iid, typ).inc(n1 - n0)
                except ValueError as e:
                    log.warning("bad KV event batch: %s", e, extra={"instance": iid})
        finally:
            sock.close(0)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
            except Exception as e:  # a subscriber that died earlier: say so, then keep stopping
                log.warning("kv event task ended with an error", extra={"error": repr(e)})
        self._tasks.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
