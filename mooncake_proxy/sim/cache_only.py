"""Prefix-cache hit ratio of one global LRU — the trace's intrinsic reuse at a given capacity.

Definition (the one the paper's numbers use): for each request in arrival order,
``hit tokens = min(input_length, 512 × number of leading hash_ids already cached)``; then all
its blocks are inserted/touched (in order). ``hit_ratio = Σ hit tokens / Σ input_length``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from mooncake_proxy.scheduling.lru import LruBlockCache

from .trace import TRACE_BLOCK_SIZE, TraceRecord

__all__ = ["HitStats", "prefix_hit_ratio", "hit_ratio_curve"]


@dataclass(frozen=True, slots=True)
class HitStats:
    cache_blocks: int
    requests: int
    hit_tokens: int
    total_tokens: int

    @property
    def hit_ratio(self) -> float:
        return self.hit_tokens / self.total_tokens if self.total_tokens else 0.0

    def to_dict(self) -> dict:
        return {"cache_blocks": self.cache_blocks, "requests": self.requests, "hit_tokens": self.hit_tokens,
                "total_tokens": self.total_tokens, "hit_ratio": self.hit_ratio}


def prefix_hit_ratio(records: Iterable[TraceRecord], cache_blocks: int = 0,
                     block_size: int = TRACE_BLOCK_SIZE) -> HitStats:
    """Hit statistics of a single LRU of ``cache_blocks`` blocks (0 = unlimited)."""
    cache = LruBlockCache(cache_blocks)
    hit = total = n = 0
    for r in records:
        h = cache.prefix_len(r.hash_ids)
        hit += min(r.input_length, h * block_size)
        total += r.input_length
        cache.insert(r.hash_ids)
        n += 1
    return HitStats(cache_blocks, n, hit, total)


def hit_ratio_curve(records: Sequence[TraceRecord], capacities: Sequence[int],
                    block_size: int = TRACE_BLOCK_SIZE) -> list[HitStats]:
    return [prefix_hit_ratio(records, c, block_size) for c in capacities]
