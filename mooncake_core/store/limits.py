"""Per-request limits of the store master (pure): keys per batch, bytes per value.

Why: one request must not make the master allocate or scan without bound -- a batch of
millions of keys holds the single request thread (and every other client) for seconds, and a
put of an absurd size is better refused by name than answered "no space" (-200) as if the
cluster were merely full. The checks run before the state is touched; a refusal is -600 with
a message naming the limit and the flag that sets it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mooncake_core.errors import MooncakeError
from mooncake_core.store.packing import U64, unpack

#: default of --max_batch_keys: far above what a connector batches (one request's KV blocks)
DEFAULT_MAX_BATCH_KEYS = 1 << 20


@dataclass(frozen=True)
class RequestLimits:
    max_batch_keys: int = DEFAULT_MAX_BATCH_KEYS
    #: 0: no limit (a put larger than the free space still gets -200)
    max_value_size: int = 0

    def __post_init__(self) -> None:
        if self.max_batch_keys < 1:
            raise ValueError(f"max_batch_keys must be >= 1, got {self.max_batch_keys}")
        if self.max_value_size < 0:
            raise ValueError(f"max_value_size must be >= 0 (0 = no limit), got {self.max_value_size}")

    def check(self, req: Any) -> str | None:
        """None when ``req`` is within the limits, else why not."""
        keys = getattr(req, "keys", None)
        if keys is not None and len(keys) > self.max_batch_keys:
            return (f"batch of {len(keys)} keys exceeds the master's limit of {self.max_batch_keys} "
                    f"(--max_batch_keys); split the batch")
        limit = self.max_value_size
        if limit:
            size = getattr(req, "size", None)
            packed = getattr(req, "sizes", None)
            sizes: list[int] = [size] if isinstance(size, int) else []
            if isinstance(packed, bytes):
                try:
                    sizes = unpack(U64, packed, None, "sizes")
                except MooncakeError:
                    sizes = []  # malformed: the handler refuses it by name
            for i, n in enumerate(sizes):
                if n > limit:
                    key = keys[i] if keys is not None and i < len(keys) else getattr(req, "key", "?")
                    return (f"value of {n} bytes for key {key!r} exceeds the master's limit of {limit} bytes "
                            f"(--max_value_size)")
        return None
