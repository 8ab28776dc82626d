"""The store's blocks as vLLM-format KV cache events over ZeroMQ, for routers other than ours.

Why: llm-d's precise prefix-cache scorer, Dynamo's KV router and the like index which prefixes
a cache holds from vLLM's KV events (``vllm/distributed/kv_events.py``): ``BlockStored`` /
``BlockRemoved`` / ``AllBlocksCleared``, batched and published on a ZMQ PUB socket. Our master
already logs every change of a key's existence (``key_events.KeyEventLog``, which our own proxy
pulls over RPC); this publisher follows that log in-process and republishes it in vLLM's wire
format, so such an indexer subscribes to the store like to one more vLLM instance (medium
``STORAGE``). The original master has the same feature (``--enable_kv_events``).

Wire format (vLLM 0.32's ``ZmqEventPublisher``, which the subscribers already speak):

* PUB multipart ``[topic, seq (8 bytes, big-endian), payload]``; ``seq`` counts batches from 0
  for each publisher process (a subscriber seeing it go back knows the publisher restarted);
* ``payload`` is msgpack of ``KVEventBatch`` = ``[ts, [events...], data_parallel_rank]``, each
  event a map tagged ``"type"``; ``BlockStored`` carries ``block_hashes`` (one per key), no
  parent and no token ids (the store does not know them), ``block_size`` from the flag;
* replay: a ROUTER socket answers a request ``[b"", start_seq (8 bytes)]`` with every buffered
  batch whose seq >= start_seq (``[b"", topic, seq, payload]``) and then ``[b"", b"", -1, b""]``.

A key's block hash is its chain digest when the key is one our vLLM store connector writes
(``mooncake_core.pd.keys``: ``mc-vllm-kv/<40 hex>`` -> those 20 bytes, the same ids our proxy's
store view uses); for any other key the hash list is empty and the event carries the key as
``object_key`` (as the original does for keys it cannot parse). Extra fields (``object_key``,
``backend_id``, ``reason``: put / remove / evict / expire) are ignored by vLLM's decoder.

The first batch of every publisher is ``AllBlocksCleared`` followed by the blocks the store
holds at that moment (a snapshot), and so is the batch after the publisher fell behind the
master's event ring or the master's term changed: a subscriber that applies batches in order
always ends with the store's true contents.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Union

import msgspec

from mooncake_core.pd.keys import KEY_PREFIX
from mooncake_core.store.key_events import KIND_NAMES, KeyEventLog, watch_reply
from mooncake_core.store.protocol import KeyEventsReply
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.store.kv_events")

MEDIUM = "STORAGE"  # vLLM's MEDIUM_STORAGE
END_SEQ = (-1).to_bytes(8, "big", signed=True)
_KEY_START = len(KEY_PREFIX) + 1


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True):
    """vLLM's ``BlockStored`` (its required fields, in its order) plus our extras."""

    block_hashes: list[Union[bytes, int]]
    parent_block_hash: Union[bytes, int, None]
    token_ids: list[int]
    block_size: int
    lora_id: Union[int, None]
    medium: Union[str, None]
    lora_name: Union[str, None]
    object_key: Union[str, None] = None
    backend_id: Union[str, None] = None
    reason: Union[str, None] = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[Union[bytes, int]]
    medium: Union[str, None]
    object_key: Union[str, None] = None
    backend_id: Union[str, None] = None
    reason: Union[str, None] = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True):
    backend_id: Union[str, None] = None


Event = Union[BlockStored, BlockRemoved, AllBlocksCleared]


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Event]
    data_parallel_rank: Union[int, None] = None


def block_hash_of(key: str) -> bytes | None:
    """The chain digest a connector block key carries (20 bytes), None for any other key."""
    if not key.startswith(KEY_PREFIX) or len(key) != _KEY_START + 40:
        return None
    try:
        return bytes.fromhex(key[_KEY_START:])
    except ValueError:
        return None


@dataclass(frozen=True)
class EventFormat:
    """What every event carries besides the key (the publisher's flags)."""

    block_size: int = 0
    backend_id: str = ""
    emit_object_key: bool = True

    def event(self, kind: str, key: str) -> Event | None:
        """One store key event as a vLLM event; None for a key neither a block nor to be named."""
        h = block_hash_of(key)
        if h is None and not self.emit_object_key:
            return None
        hashes: list[bytes | int] = [h] if h is not None else []
        obj = key if self.emit_object_key else None
        who = self.backend_id or None
        if kind == "put":
            return BlockStored(hashes, None, [], self.block_size, None, MEDIUM, None, obj, who, kind)
        return BlockRemoved(hashes, MEDIUM, obj, who, kind)

    def events(self, items: Iterable[tuple[str, str]]) -> list[Event]:
        """``(kind, key)`` pairs in order as vLLM events (skipping keys ``event`` drops)."""
        return [e for e in (self.event(k, key) for k, key in items) if e is not None]

    def resync(self, snapshot: Iterable[str]) -> list[Event]:
        """Forget everything, then the store's current keys (first batch / after a gap)."""
        return [AllBlocksCleared(self.backend_id or None), *self.events(("put", k) for k in snapshot)]


def follow_reply(log: KeyEventLog, objects: Iterable[str], epoch: int, after: int | None,
                 their_epoch: int) -> KeyEventsReply:
    """The events after ``after`` (None: not synced yet) of term ``their_epoch``, or a snapshot when
    that is not possible (``key_events.watch_reply`` with one difference: a synced follower at
    cursor 0 -- the log of a fresh master was empty at its snapshot -- gets events, not another
    snapshot)."""
    if after is not None and their_epoch == epoch:
        events, cursor, gap = log.since(after)
        if not gap:
            return KeyEventsReply(events, cursor, False, epoch, [])
    return watch_reply(log, objects, epoch, 0)


class ReplayBuffer:
    """The last ``capacity`` published batches, for subscribers asking to replay from a seq (pure)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"kv_events_buffer_steps must be >= 1, got {capacity}")
        self._buf: deque[tuple[int, bytes]] = deque(maxlen=capacity)

    def add(self, seq: int, payload: bytes) -> None:
        self._buf.append((seq, payload))

    def since(self, start_seq: int) -> list[tuple[int, bytes]]:
        return [(s, p) for s, p in self._buf if s >= start_seq]


class KvEventPublisher:
    """Follows the master's key events and publishes them on ZMQ PUB (+ ROUTER replay).

    ``watch(after, epoch)`` is ``follow_reply`` over the master's state, taken under its lock by the
    caller's closure (``after`` None: a snapshot is needed): this publisher is one more subscriber
    of the event log, in-process. One thread does
    everything (ZMQ sockets are not thread-safe): every ``poll_s`` it pulls the new events,
    publishes them as one batch (``max_batch`` events at most) and answers replay requests."""

    def __init__(self, watch: Callable[[int | None, int], Any], endpoint: str, *, replay_endpoint: str = "",
                 fmt: EventFormat = EventFormat(), buffer_steps: int = 10_000, topic: str = "",
                 poll_s: float = 0.01, hwm: int = 100_000) -> None:
        import zmq  # the kv-events extra (pyzmq): only a master with --enable_kv_events needs it

        if not endpoint:
            raise ValueError("--enable_kv_events needs --kv_events_bind_endpoint=tcp://HOST:PORT")
        self._watch = watch
        self.fmt = fmt
        self.poll_s = poll_s
        self._topic = topic.encode()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay = None
        try:
            self._pub.bind(endpoint)
            if replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(replay_endpoint)
        except zmq.ZMQError as e:
            self.close()
            raise OSError(f"kv events: cannot bind {endpoint!r}"
                          + (f" / replay {replay_endpoint!r}" if replay_endpoint else "") + f": {e}") from e
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT) if self._replay else ""
        self._buffer = ReplayBuffer(buffer_steps)
        self._enc = msgspec.msgpack.Encoder()
        self._seq = 0
        self._cursor: int | None = None  # None until the first snapshot
        self._epoch = 0
        self.batches = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "KvEventPublisher":
        """The first batch (cleared + snapshot) now, before the master says it is ready; then follow."""
        self.step()
        self._thread = threading.Thread(target=self._run, name="mc-master-kv-events", daemon=True)
        self._thread.start()
        log.info("KV events: publishing store blocks", extra={"endpoint": self.endpoint,
                                                              "replay": self.replay_endpoint or None})
        return self

    def step(self) -> int:
        """Pull the new key events and publish them (one batch, or none); returns events published."""
        reply = self._watch(self._cursor, self._epoch)
        if reply.gap:
            events = self.fmt.resync(reply.snapshot)
        else:
            events = self.fmt.events((KIND_NAMES.get(kind, "remove"), key) for _seq, kind, key in reply.events)
        self._cursor, self._epoch = reply.cursor, reply.epoch
        if events:
            self._publish(events)
        return len(events)

    def _publish(self, events: list[Event]) -> None:
        payload = self._enc.encode(KVEventBatch(time.time(), events))
        seq = self._seq
        self._seq += 1
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.add(seq, payload)
        self.batches += 1

    def _serve_replay(self) -> None:
        import zmq

        assert self._replay is not None
        while self._replay.poll(0):
            frames = self._replay.recv_multipart(zmq.NOBLOCK)
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("KV events: ignoring a malformed replay request (want [identity, b'', "
                            "start seq as 8 bytes big-endian])", extra={"frames": len(frames)})
                continue
            ident = frames[0]
            for seq, payload in self._buffer.since(int.from_bytes(frames[2], "big", signed=True)):
                self._replay.send_multipart((ident, b"", self._topic, seq.to_bytes(8, "big"), payload))
            self._replay.send_multipart((ident, b"", b"", END_SEQ, b""))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
                if self._replay is not None:
                    self._serve_replay()
            except Exception:  # noqa: BLE001 - the master must outlive a bug here; logged
                log.exception("KV events: publishing failed")
                self._stop.wait(1.0)
            self._stop.wait(self.poll_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for s in (self._pub, self._replay):
            if s is not None:
                s.close(0)
        self._ctx.term()
