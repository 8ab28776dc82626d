"""Prefix block hashing: the keys of the prefix index.

A prompt is cut into fixed-size blocks and every block's key hashes *its own content and the
previous block's key*, so two prompts share block ``i``'s key exactly when they share the whole
prefix up to and including block ``i``. That chaining is what lets the index answer "how many
leading blocks of this prompt does instance X hold?" by walking keys until the first miss —
the same scheme vLLM's prefix cache and Mooncake's traces (``hash_ids``) use.

Only FULL blocks get a key: a partial tail block cannot be reused by an engine that caches
whole blocks, so counting it would overstate hits.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from typing import Sequence

__all__ = ["BlockHasher", "BYTES_PER_TOKEN_APPROX"]

#: Bytes of UTF-8 text assumed per token when the proxy has no tokenizer (English BPE ≈ 4).
BYTES_PER_TOKEN_APPROX = 4


class BlockHasher:
    """Chained per-block hashes of token ids (or of raw text when no tokenizer exists).

    ``block_size`` is in tokens (512 as in the paper's traces; vLLM uses 16 by default — use
    the engine's value when matching its KV-cache events). ``seed`` namespaces the hashes
    (e.g. by model name) so that identical prompts for different models never collide.
    Hashes are unsigned 64-bit ints (blake2b-64), stable across processes and Python runs —
    unlike ``hash()``, which is salted per process.
    """

    __slots__ = ("block_size", "seed", "_root")

    def __init__(self, block_size: int = 512, seed: str = "") -> None:
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int (tokens per block), got {block_size!r}")
        self.block_size = block_size
        self.seed = seed
        # The root "previous hash" depends on seed and block size: blocks of different sizes
        # are different cache objects and must not share keys.
        self._root = hashlib.blake2b(f"mooncake-prefix|{block_size}|{seed}".encode(), digest_size=8).digest()

    def _chain(self, chunks: Sequence[bytes]) -> list[int]:
        out: list[int] = []
        prev = self._root
        for chunk in chunks:
            prev = hashlib.blake2b(prev + chunk, digest_size=8).digest()
            out.append(struct.unpack("<Q", prev)[0])
        return out

    def hash_tokens(self, token_ids: Sequence[int]) -> list[int]:
        """One chained hash per FULL block of ``token_ids``; ``len == len(token_ids) // block_size``."""
        bs = self.block_size
        n = len(token_ids) // bs
        if n == 0:
            return []
        try:
            raw = array("q", token_ids[: n * bs]).tobytes()
        except (TypeError, OverflowError) as e:
            raise ValueError(f"token_ids must be a sequence of 64-bit ints: {e}") from None
        step = bs * 8
        return self._chain([raw[i * step:(i + 1) * step] for i in range(n)])

    def continue_chain(self, parent_hash: int | None, block_tokens: Sequence[int]) -> int:
        """Key of ONE full block given its parent's key (None = first block of the prompt).

        ``continue_chain(h[i-1], tokens[i*bs:(i+1)*bs]) == hash_tokens(tokens)[i]`` — lets a
        consumer of engine KV-cache events (which report a block's tokens and its parent)
        extend keys block by block without re-hashing the whole prefix.
        """
        if len(block_tokens) != self.block_size:
            raise ValueError(f"block_tokens must hold exactly block_size={self.block_size} tokens, "
                             f"got {len(block_tokens)}")
        prev = self._root if parent_hash is None else struct.pack("<Q", parent_hash)
        try:
            raw = array("q", block_tokens).tobytes()
        except (TypeError, OverflowError) as e:
            raise ValueError(f"block_tokens must be 64-bit ints: {e}") from None
        h: int = struct.unpack("<Q", hashlib.blake2b(prev + raw, digest_size=8).digest())[0]
        return h

    def hash_text(self, text: str) -> list[int]:
        """Chained hashes of raw text for a proxy without a tokenizer.

        The UTF-8 bytes are cut into chunks of ``block_size * 4`` bytes (≈ ``block_size``
        tokens at ~4 bytes/token) and only full chunks are hashed, like full token blocks.
        ``len(result) == len(text.encode()) // (block_size * 4)``. Pair it with
        :meth:`approx_tokens` for ``RequestInfo.prompt_tokens``.
        Equal leading text therefore gives equal leading keys; the block boundaries differ
        from the engine's real token blocks, which only matters when mixing the two sources.
        """
        data = text.encode("utf-8")
        step = self.block_size * BYTES_PER_TOKEN_APPROX
        n = len(data) // step
        return self._chain([data[i * step:(i + 1) * step] for i in range(n)])

    @staticmethod
    def approx_tokens(text: str) -> int:
        """Approximate token count of ``text``: ceil(UTF-8 bytes / 4); 0 for empty text."""
        n = len(text.encode("utf-8"))
        return (n + BYTES_PER_TOKEN_APPROX - 1) // BYTES_PER_TOKEN_APPROX

    def __repr__(self) -> str:
        return f"BlockHasher(block_size={self.block_size}, seed={self.seed!r})"
