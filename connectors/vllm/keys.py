"""Store keys for KV blocks that chain the prefix (pure logic).

Why chained: the KV of block i depends on every token before it, so a key must identify the
whole prefix, not just the block's own tokens. ``key_i = H(key_{i-1} || tokens of block i)``
(SHA-256), seeded with the model, the KV layout and the request's cache salt -- two
instances serving the same model with the same layout produce the same keys for the same
prefix, and nothing else does. Only full blocks get keys (a partial block is never shared).
"""

from __future__ import annotations

import hashlib
import struct
from typing import Sequence

KEY_PREFIX = "mc-vllm-kv"


def namespace(model: str, block_size: int, layout: str, salt: str | None = None) -> bytes:
    """Seed of the chain: everything besides the tokens that changes what a block's KV means."""
    return hashlib.sha256(f"{model}\x00{block_size}\x00{layout}\x00{salt or ''}".encode()).digest()


def chained_block_keys(seed: bytes, tokens: Sequence[int], block_size: int, max_blocks: int | None = None) -> list[str]:
    """Keys of the full blocks of ``tokens`` (at most ``max_blocks``), prefix-chained."""
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    n = len(tokens) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    out: list[str] = []
    h = seed
    for i in range(n):
        blk = tokens[i * block_size:(i + 1) * block_size]
        h = hashlib.sha256(h + struct.pack(f"<{block_size}q", *blk)).digest()
        out.append(f"{KEY_PREFIX}/{h.hex()[:40]}")
    return out


def leading_hits(exists: Sequence[int]) -> int:
    """Number of leading keys present (``batch_is_exist`` answers: 1 yes, 0 no, -1 error = no)."""
    n = 0
    for e in exists:
        if e != 1:
            break
        n += 1
    return n
