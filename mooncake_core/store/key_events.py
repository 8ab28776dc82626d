"""The master's key-event log: which keys appeared and disappeared, for subscribers (pure).

Why: a scheduler (the proxy's Conductor) wants to know which KV blocks the store holds
without asking the master about every candidate key of every request. The master appends one
event per change of a key's existence -- ``put`` (a put ended / an object was re-reported),
``remove`` (removed, overwritten or its segment unmounted), ``evict`` (dropped for space),
``expire`` (its owner stopped heart-beating) -- to a bounded ring, and subscribers pull what
follows their cursor (``WatchKeysReq``) over the master's ordinary RPC.

The master never waits on a subscriber: appending is O(1) into a ring of ``capacity``
events; a subscriber that falls more than ``capacity`` events behind (or arrives after a
restart: the cursor belongs to another ``epoch``) is told so (``gap``) and gets a snapshot of
the current keys under its prefix instead, after which it follows events again.
"""

from __future__ import annotations

from collections import deque
from itertools import islice, repeat
from typing import Iterable, Literal

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store.protocol import KeyEventsReply

KeyEventKind = Literal["put", "remove", "evict", "expire"]
KIND_CODES: dict[str, int] = {"put": 1, "remove": 2, "evict": 3, "expire": 4}
KIND_NAMES: dict[int, str] = {v: k for k, v in KIND_CODES.items()}

#: events the master keeps for subscribers (~100 bytes each with the key)
DEFAULT_CAPACITY = 1 << 17
#: most events one WatchKeys reply carries (a subscriber pulls again for the rest)
MAX_BATCH = 1 << 14


class KeyEventLog:
    """Bounded ring of ``(seq, kind_code, key)``; ``seq`` starts at 1 and increases by one.

    Stored as two deques (the keys, the kind codes) with the sequence numbers implied by
    position -- the newest is ``last_seq`` -- rather than one tuple per event: a full ring
    of 131,072 events then costs ~2 MB (16 bytes an event; the key strings are the master's
    own) instead of ~14 MB (a tuple and an int each), which at 300k objects was 45 of the
    master's 251 bytes per object."""

    __slots__ = ("capacity", "_keys", "_kinds", "_seq")

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"key event capacity must be an int >= 0 (0 = off), got {capacity!r}")
        self.capacity = capacity
        self._keys: deque[str] = deque(maxlen=capacity or 1)
        self._kinds: deque[int] = deque(maxlen=capacity or 1)
        self._seq = 0

    @property
    def last_seq(self) -> int:
        """Sequence number of the newest event (0 = none yet)."""
        return self._seq

    def publish(self, kind: KeyEventKind, key: str) -> None:
        if not self.capacity:
            return
        self._seq += 1
        self._keys.append(key)
        self._kinds.append(KIND_CODES[kind])

    def publish_many(self, kind: KeyEventKind, keys: Iterable[str]) -> None:
        """``publish`` of each key in order (a list at C speed: a batch's puts)."""
        if not self.capacity:
            return
        if not isinstance(keys, list):
            keys = list(keys)
        self._seq += len(keys)
        self._keys.extend(keys)
        self._kinds.extend(repeat(KIND_CODES[kind], len(keys)))

    def since(self, after: int, prefix: str = "",
              limit: int = MAX_BATCH) -> tuple[list[tuple[int, int, str]], int, bool]:
        """Events with ``seq > after`` whose key starts with ``prefix`` (at most ``limit``).

        Returns ``(events, cursor, gap)``: ``cursor`` is what to pass as ``after`` next time
        (covers skipped non-matching events too); ``gap`` is True when events after ``after``
        were already dropped from the ring (or ``after`` is from the future: another term) --
        the caller must then resynchronise from a snapshot.
        """
        if after > self._seq or not self.capacity:
            return [], self._seq, True
        first = self._seq - len(self._keys) + 1
        if after + 1 < first:
            return [], self._seq, True
        if after == self._seq:
            return [], after, False
        # the newest (seq - after) events, taken from the right end (a subscriber is usually
        # close behind), oldest first
        m = self._seq - after
        keys = list(islice(reversed(self._keys), m))
        kinds = list(islice(reversed(self._kinds), m))
        keys.reverse()
        kinds.reverse()
        out: list[tuple[int, int, str]] = []
        cursor = after
        limit = max(1, min(limit, MAX_BATCH))
        for seq, kind, key in zip(range(after + 1, self._seq + 1), kinds, keys):
            cursor = seq
            if key.startswith(prefix):
                out.append((seq, kind, key))
                if len(out) >= limit:
                    break
        return out, cursor, False


def watch_reply(log: KeyEventLog, objects: Iterable[str], epoch: int, after: int, prefix: str = "",
                limit: int = 0, their_epoch: int = 0) -> KeyEventsReply:
    """The master's answer to ``watch_keys``: the events after cursor ``after``; on a gap (the
    subscriber fell behind the ring, is new -- ``after`` 0 -- or its cursor is from another
    ``epoch``) a snapshot of the current complete keys under ``prefix`` instead: O(keys) once,
    then O(events) per call."""
    if after < 0:
        raise MooncakeError(ErrorCode.INVALID_PARAMS, f"watch_keys: after must be >= 0, got {after!r}")
    gap = after == 0 or (their_epoch != 0 and their_epoch != epoch)
    if not gap:
        events, cursor, gap = log.since(after, prefix, limit or 1 << 14)
        if not gap:
            return KeyEventsReply(events, cursor, False, epoch, [])
    snapshot = [k for k in objects if k.startswith(prefix)]
    return KeyEventsReply([], log.last_seq, True, epoch, snapshot)
