"""The Conductor's store tier as the Mooncake Store really holds it (not a model of it).

Our vLLM store connector saves every full KV block under a prefix-chained key
(``mooncake_core.pd.keys``: SHA-256 over the previous digest and the block's token
ids, seeded with model, block size, layout and cache salt). The proxy computes the very same
chain from the prompt (engine tokenizer, engine block size) with :class:`StoreBlockHasher`,
whose block hashes *are* those digests (as ints), so one hash serves the per-instance prefix
index and the store lookup.

Three ways to learn what the store holds, kept because their costs differ (the first two measured
by ``bench/scheduling/bench_store_view.py``):

* :class:`StoreEventView` (default) follows the master's key events (``WatchKeysReq``: put,
  remove, evict, expire; a snapshot after a gap) from a background thread polling every
  ``poll_s``. A lookup is a set probe (~0.1 us per block); staleness is bounded by ``poll_s``
  plus one RPC.
* :class:`StoreQueryView` asks ``batch_exist_key`` for a prompt's blocks and caches the answers
  for ``ttl_s``. Nothing runs in the background, but a cold lookup costs one master round trip
  on the request path, and the view can be ``ttl_s`` stale.
* :class:`StoreZmqView` subscribes to the master's vLLM-format KV events over ZeroMQ
  (``mooncake_master --enable_kv_events``, ``mooncake_core.store.kv_events_zmq``) -- the feed other
  routers (llm-d, Dynamo) read -- and asks the replay socket for batches it missed.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol, Sequence

from mooncake_core.pd.keys import KEY_PREFIX, chain_step, chained_digests, namespace
from mooncake_core.errors import MooncakeError
from mooncake_core.store.key_events import KIND_CODES
from mooncake_core.utils.log import get_logger

from .scheduling.hashing import BlockHasher

__all__ = ["StoreBlockHasher", "StoreKeySet", "StoreEventView", "StoreQueryView", "StoreZmqView", "StoreView",
           "make_store_view", "VIEW_KINDS"]

log = get_logger("mooncake.proxy.store_view")

#: bits of a block digest that the store key keeps (40 hex digits)
_KEY_BITS = 160
_DROP = 256 - _KEY_BITS
_KEY_START = len(KEY_PREFIX) + 1
_PUT = KIND_CODES["put"]
VIEW_KINDS = ("events", "query", "zmq")


def key_id(block_hash: int) -> int:
    """The part of a :class:`StoreBlockHasher` hash that the store key carries."""
    return block_hash >> _DROP


def store_key(block_hash: int) -> str:
    """The store key our vLLM connector writes for this block hash."""
    return f"{KEY_PREFIX}/{key_id(block_hash):040x}"


def parse_key(key: str) -> int | None:
    """``key_id`` of a connector block key, None for any other key."""
    if not key.startswith(KEY_PREFIX) or len(key) != _KEY_START + 40:
        return None
    try:
        return int(key[_KEY_START:], 16)
    except ValueError:
        return None


class StoreBlockHasher:
    """A ``BlockHasher`` whose token-block hashes are the store connector's chain digests.

    ``model_tag`` is what the connector seeds with: ``f"{model}|{dtype}"`` of the engine's
    model config (e.g. ``"/models/tiny|torch.float32"``); ``block_size`` the engine's
    ``--block-size``. Text without a tokenizer cannot give the engine's keys: it is hashed by
    a plain :class:`BlockHasher` (instance prefix index only; never a store hit).
    """

    __slots__ = ("block_size", "seed", "_ns", "_text")

    def __init__(self, model_tag: str, block_size: int, layout: str = "v1", salt: str | None = None) -> None:
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int (the engine's --block-size), got {block_size!r}")
        if not model_tag:
            raise ValueError("model_tag must name the engine's model and dtype, e.g. 'Qwen/Qwen3-0.6B|torch.bfloat16'")
        self.block_size = block_size
        self.seed = model_tag
        self._ns = namespace(model_tag, block_size, layout, salt)
        self._text = BlockHasher(block_size=block_size, seed=model_tag)

    def hash_tokens(self, token_ids: Sequence[int]) -> list[int]:
        return [int.from_bytes(d, "big") for d in chained_digests(self._ns, list(token_ids), self.block_size)]

    def continue_chain(self, parent_hash: int | None, block_tokens: Sequence[int]) -> int:
        if len(block_tokens) != self.block_size:
            raise ValueError(f"block_tokens must hold exactly block_size={self.block_size} tokens, "
                             f"got {len(block_tokens)}")
        prev = self._ns if parent_hash is None else parent_hash.to_bytes(32, "big")
        return int.from_bytes(chain_step(prev, list(block_tokens)), "big")

    def hash_text(self, text: str) -> list[int]:
        return self._text.hash_text(text)

    approx_tokens = staticmethod(BlockHasher.approx_tokens)

    def __repr__(self) -> str:
        return f"StoreBlockHasher(model_tag={self.seed!r}, block_size={self.block_size})"


class StoreView(Protocol):
    """What ``ClusterState`` asks of a real store tier."""

    def prefix_len(self, block_hashes: Sequence[int]) -> int: ...

    def __len__(self) -> int: ...


class StoreKeySet:
    """The set of connector block keys the store holds, maintained from key events (pure)."""

    __slots__ = ("keys", "cursor", "epoch", "resyncs", "events")

    def __init__(self) -> None:
        self.keys: set[int] = set()
        self.cursor = 0
        self.epoch = 0
        self.resyncs = 0
        self.events = 0

    def apply(self, reply: Any) -> int:
        """Fold one ``KeyEventsReply`` in; returns how many events/keys it carried."""
        if reply.gap:
            fresh = {k for k in map(parse_key, reply.snapshot) if k is not None}
            self.keys = fresh  # one assignment: readers see the old or the new set, never half
            self.resyncs += 1
            n = len(reply.snapshot)
        else:
            keys = self.keys
            for _, kind, key in reply.events:
                k = parse_key(key)
                if k is None:
                    continue
                if kind == _PUT:
                    keys.add(k)
                else:
                    keys.discard(k)
            n = len(reply.events)
            self.events += n
        self.cursor = reply.cursor
        self.epoch = reply.epoch
        return n

    def apply_kv_events(self, events: Sequence[Any]) -> int:
        """Fold one vLLM-format KV event batch of the master's publisher in (``kv_events_zmq``
        types: a block hash is the 20-byte digest the key carries); returns the events applied."""
        from mooncake_core.store.kv_events_zmq import AllBlocksCleared, BlockStored

        keys = self.keys
        for ev in events:
            if isinstance(ev, AllBlocksCleared):
                keys = self.keys = set()
                self.resyncs += 1
                continue
            ids = [int.from_bytes(h, "big") for h in ev.block_hashes if isinstance(h, bytes) and len(h) == 20]
            if isinstance(ev, BlockStored):
                keys.update(ids)
            else:
                keys.difference_update(ids)
        self.events += len(events)
        return len(events)

    def prefix_len(self, block_hashes: Sequence[int]) -> int:
        keys = self.keys
        n = 0
        for h in block_hashes:
            if (h >> _DROP) not in keys:
                break
            n += 1
        return n

    def __len__(self) -> int:
        return len(self.keys)


class _KeySetView:
    """A view answering from the ``StoreKeySet`` its thread keeps (``self.state``)."""

    state: StoreKeySet

    def prefix_len(self, block_hashes: Sequence[int]) -> int:
        return self.state.prefix_len(block_hashes)

    def __len__(self) -> int:
        return len(self.state)


class StoreEventView(_KeySetView):
    """Follows the master's key events from a daemon thread (see module docstring)."""

    def __init__(self, master_addr: str, *, poll_s: float = 0.02, timeout_s: float = 2.0,
                 client: Any = None) -> None:
        from mooncake_core.store.master_client import MasterClient

        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0 seconds, got {poll_s!r}")
        self.master_addr = master_addr
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self.state = StoreKeySet()
        self.client = client or MasterClient(master_addr, timeout=timeout_s)
        self.errors = 0
        self.last_sync = 0.0  # monotonic time of the last successful pull
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> int:
        """One pull (and the follow-ups while a full batch came back). Raises MooncakeError."""
        total = 0
        while True:
            reply = self.client.watch_keys(self.state.cursor, KEY_PREFIX + "/", 0, self.state.epoch,
                                           timeout=self.timeout_s)
            n = self.state.apply(reply)
            total += n
            if reply.gap or n < (1 << 14):
                break
        self.last_sync = time.monotonic()
        return total

    def start(self) -> "StoreEventView":
        try:
            self.poll_once()  # the first snapshot before serving: no cold start with an empty view
        except MooncakeError as e:
            log.warning("store master not reachable yet; the store view starts empty",
                        extra={"master": self.master_addr, "error": str(e)})
        self._thread = threading.Thread(target=self._run, name="mc-proxy-store-view", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        backoff = self.poll_s
        while not self._stop.wait(backoff):
            try:
                self.poll_once()
                backoff = self.poll_s
            except MooncakeError as e:
                self.errors += 1
                if self.errors == 1 or self.errors % 100 == 0:
                    log.warning("store key events: pull failed", extra={"master": self.master_addr,
                                                                        "error": str(e), "errors": self.errors})
                backoff = min(2.0, backoff * 2)
            except Exception:  # noqa: BLE001 - the view must outlive a bug in one reply
                self.errors += 1
                log.exception("store key events: unexpected failure")
                backoff = min(2.0, backoff * 2)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.client.close()



class StoreQueryView:
    """Asks ``batch_exist_key`` for a prompt's blocks; answers cached ``ttl_s`` seconds.

    ``max_blocks`` bounds one query (a longer prompt's tail counts as a miss)."""

    def __init__(self, master_addr: str, *, ttl_s: float = 0.5, timeout_s: float = 0.5,
                 max_blocks: int = 4096, max_cached: int = 1 << 18, client: Any = None,
                 clock: Any = time.monotonic) -> None:
        from mooncake_core.store.master_client import MasterClient

        self.master_addr = master_addr
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.max_blocks = max_blocks
        self.max_cached = max_cached
        self.client = client or MasterClient(master_addr, timeout=timeout_s)
        self.clock = clock
        self._cache: dict[int, tuple[bool, float]] = {}
        self.queries = 0
        self.errors = 0

    def start(self) -> "StoreQueryView":
        return self

    def stop(self) -> None:
        self.client.close()

    def prefix_len(self, block_hashes: Sequence[int]) -> int:
        now = self.clock()
        cache = self._cache
        hashes = list(block_hashes[: self.max_blocks])
        n = 0
        for h in hashes:  # answer from the cache as far as it is fresh
            c = cache.get(h)
            if c is None or c[1] < now:
                break
            if not c[0]:
                return n
            n += 1
        if n == len(hashes):
            return n
        todo = hashes[n:]
        try:
            exists = self.client.batch_exist_key([store_key(h) for h in todo])
        except MooncakeError as e:
            self.errors += 1
            if self.errors == 1 or self.errors % 100 == 0:
                log.warning("store query failed: counting no store hits", extra={"master": self.master_addr,
                                                                                "error": str(e)})
            return n
        self.queries += 1
        if len(cache) + len(todo) > self.max_cached:
            cache.clear()
        until = now + self.ttl_s
        hit = True
        for h, present in zip(todo, exists):
            cache[h] = (bool(present), until)
            if hit and present:
                n += 1
            else:
                hit = False
        return n

    def __len__(self) -> int:
        return sum(1 for present, _ in self._cache.values() if present)


class StoreZmqView(_KeySetView):
    """Follows the master's ZMQ KV events from a daemon thread, as an llm-d / Dynamo indexer does.

    ``endpoint`` is the master's ``--kv_events_bind_endpoint`` (as reachable from here),
    ``replay_endpoint`` its ``--kv_events_replay_endpoint`` ("" = none). A batch whose sequence
    number is not the next one means batches were lost (ahead) or the master restarted (behind:
    its numbers start over); the view then asks the replay socket for the missing ones before
    applying the batch; a view joining late asks for everything from the master's first batch
    (``AllBlocksCleared`` plus the keys it started with). So a view that got every batch of the
    current publisher holds exactly what the store holds -- as long as the master's replay buffer
    (``--kv_events_buffer_steps`` batches) still has them; a proxy started long after the master
    should use ``--store-view events`` (which takes a snapshot)."""

    def __init__(self, endpoint: str, replay_endpoint: str = "", *, timeout_s: float = 2.0) -> None:
        import zmq  # the kv-events extra

        from mooncake_core.store.kv_events_zmq import KVEventBatch

        if not endpoint:
            raise ValueError("--store-view zmq needs --store-kv-events=tcp://MASTER:PORT (the master's "
                             "--kv_events_bind_endpoint)")
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.timeout_s = timeout_s
        self.state = StoreKeySet()
        self.errors = 0
        self.replays = 0
        self._zmq = zmq
        self._dec = __import__("msgspec").msgpack.Decoder(type=KVEventBatch)
        self._ctx = zmq.Context()
        self._expected: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "StoreZmqView":
        self._thread = threading.Thread(target=self._run, name="mc-proxy-store-zmq", daemon=True)
        self._thread.start()
        return self

    def _apply(self, seq: int, payload: bytes) -> None:
        self.state.apply_kv_events(self._dec.decode(payload).events)
        self._expected = seq + 1

    def _replay(self, start: int, below: int) -> None:
        """Apply the batches ``start <= seq < below`` from the replay socket (what it still has)."""
        zmq = self._zmq
        s = self._ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        try:
            s.connect(self.replay_endpoint)
            s.send_multipart((b"", start.to_bytes(8, "big")))
            while s.poll(int(self.timeout_s * 1000)):
                frames = s.recv_multipart()
                seq = int.from_bytes(frames[2], "big", signed=True) if len(frames) == 4 else -1
                if seq < 0:
                    return
                if seq < below:
                    self._apply(seq, frames[3])
            raise TimeoutError(f"no answer from the KV-event replay socket {self.replay_endpoint} "
                               f"within {self.timeout_s:.1f} s")
        finally:
            s.close()

    def _run(self) -> None:
        zmq = self._zmq
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(self.endpoint)
        try:
            while not self._stop.is_set():
                if not sub.poll(100):
                    continue
                frames = sub.recv_multipart()
                try:
                    if len(frames) != 3:
                        raise ValueError(f"KV event message of {len(frames)} frames (want topic, seq, payload)")
                    seq = int.from_bytes(frames[1], "big", signed=True)
                    first = self._expected is None
                    if seq != (0 if first else self._expected) and self.replay_endpoint:
                        # joined late (from the master's first batch: its snapshot), lost batches, or
                        # the master restarted (its numbers start over)
                        self.replays += 1
                        self._replay(0 if first or seq < (self._expected or 0) else self._expected or 0, seq)
                    self._apply(seq, frames[2])
                except Exception as e:  # noqa: BLE001 - the view must outlive one bad batch
                    self.errors += 1
                    if self.errors == 1 or self.errors % 100 == 0:
                        log.warning("store KV events: a batch could not be applied",
                                    extra={"endpoint": self.endpoint, "error": str(e), "errors": self.errors})
        finally:
            sub.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._ctx.term()



def make_store_view(kind: str, master_addr: str, **kw: Any) -> StoreEventView | StoreQueryView | StoreZmqView:
    """``kind``: "events" (default), "query" or "zmq" (``kw``: ``endpoint``, ``replay_endpoint``);
    ``kw`` go to the view's constructor."""
    if kind == "events":
        return StoreEventView(master_addr, **kw)
    if kind == "query":
        return StoreQueryView(master_addr, **kw)
    if kind == "zmq":
        return StoreZmqView(**kw)
    raise ValueError(f"store view must be one of {VIEW_KINDS}, got {kind!r}")
