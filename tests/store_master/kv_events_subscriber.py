"""A vLLM-style KV-event subscriber, run with the vLLM venv's python by test_kv_events_zmq.py.

It decodes every batch with vLLM's own msgspec types (``vllm.distributed.kv_events.KVEventBatch``),
as an llm-d / Dynamo indexer does, and prints one JSON line per event:
``{"seq", "type", "hashes" (hex), "reason"}`` (``reason`` -- put / remove / evict / expire -- is
our extra field, which vLLM's decoder ignores: read from the raw msgpack map).

    python kv_events_subscriber.py replay ENDPOINT START_SEQ      # ask the ROUTER, print, exit
    python kv_events_subscriber.py sub ENDPOINT REPLAY_ENDPOINT STOP_PREFIX SECONDS

``sub`` follows the PUB socket until an event of a key starting with STOP_PREFIX, as an indexer does: a batch whose seq is
not the next one means batches were missed (ahead) or the publisher restarted (behind: its seq
starts over at 0); the missed ones are asked for on the replay socket and applied first.
"""

import json
import sys
import time

import msgspec
import zmq
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

DEC = msgspec.msgpack.Decoder(type=KVEventBatch)


def emit(seq: int, payload: bytes) -> list:
    batch = DEC.decode(payload)
    raw = msgspec.msgpack.decode(payload)[1]
    keys = []
    for ev, r in zip(batch.events, raw):
        if isinstance(ev, AllBlocksCleared):
            kind, hashes = "AllBlocksCleared", []
        else:
            assert isinstance(ev, (BlockStored, BlockRemoved)) and ev.medium == "STORAGE", ev
            kind, hashes = type(ev).__name__, [h.hex() for h in ev.block_hashes]
        print(json.dumps({"seq": seq, "type": kind, "hashes": hashes, "reason": r.get("reason"),
                          "key": r.get("object_key")}), flush=True)
        keys.append(r.get("object_key"))
    return keys


def replay(ctx: zmq.Context, endpoint: str, start: int, below: int | None = None) -> list:
    """Ask the publisher's ROUTER for the batches from ``start`` (below ``below``); emit them."""
    s = ctx.socket(zmq.DEALER)
    s.connect(endpoint)
    s.send_multipart((b"", start.to_bytes(8, "big")))
    keys = []
    try:
        while True:
            if not s.poll(10_000):
                raise TimeoutError("no answer from the replay socket")
            _, _topic, seq, payload = s.recv_multipart()
            n = int.from_bytes(seq, "big", signed=True)
            if n == -1:
                return keys
            if below is None or n < below:
                keys += emit(n, payload)
    finally:
        s.close(0)


def main() -> int:
    mode, endpoint = sys.argv[1], sys.argv[2]
    ctx = zmq.Context()
    if mode == "replay":
        replay(ctx, endpoint, int(sys.argv[3]))
        return 0
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(endpoint)
    print(json.dumps({"ready": True}), flush=True)
    rep, stop, deadline = sys.argv[3], sys.argv[4], time.monotonic() + float(sys.argv[5])
    expected = None
    while True:
        if not s.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            print("timeout", file=sys.stderr)
            return 1
        _topic, seq, payload = s.recv_multipart()
        n = int.from_bytes(seq, "big", signed=True)
        keys = []
        if expected is not None and n != expected:
            start = expected if n > expected else 0
            print(json.dumps({"replay_from": start, "restart": n < expected}), flush=True)
            keys = replay(ctx, rep, start, n)
        keys += emit(n, payload)
        expected = n + 1
        if any(k and k.startswith(stop) for k in keys):
            return 0


if __name__ == "__main__":
    sys.exit(main())
