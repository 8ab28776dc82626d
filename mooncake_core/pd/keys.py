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


def chain_step(prev: bytes, block: Sequence[int]) -> bytes:
    """Digest of one block given the previous block's digest (or the namespace seed)."""
    return hashlib.sha256(prev + struct.pack(f"<{len(block)}q", *block)).digest()


def key_of(digest: bytes) -> str:
    """The store key of a block digest (what the connector writes and the master publishes)."""
    return f"{KEY_PREFIX}/{digest.hex()[:40]}"


def chained_digests(seed: bytes, tokens: Sequence[int], block_size: int, max_blocks: int | None = None) -> list[bytes]:
    """Chain digests of the full blocks of ``tokens`` (at most ``max_blocks``)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    n = len(tokens) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    out: list[bytes] = []
    h = seed
    for i in range(n):
        h = chain_step(h, tokens[i * block_size:(i + 1) * block_size])
        out.append(h)
    return out


def chained_block_keys(seed: bytes, tokens: Sequence[int], block_size: int, max_blocks: int | None = None) -> list[str]:
    """Keys of the full blocks of ``tokens`` (at most ``max_blocks``), prefix-chained."""
    return [key_of(d) for d in chained_digests(seed, tokens, block_size, max_blocks)]


def leading_hits(exists: Sequence[int]) -> int:
    """Number of leading keys present (``batch_is_exist`` answers: 1 yes, 0 no, -1 error = no)."""
    n = 0
    for e in exists:
        if e != 1:
            break
        n += 1
    return n
