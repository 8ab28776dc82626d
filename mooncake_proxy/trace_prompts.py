"""Prompts for trace replay whose shared prefixes follow the trace's ``hash_ids``.

Mooncake's traces give, per request, ``input_length`` tokens and one ``hash_id`` per 512-token
block, where equal ids mean an identical prefix block. To make a real engine's prefix cache
behave as in production, every id maps deterministically to its own block of text (words drawn
by a PRNG seeded with the id), and a prompt is its blocks' texts concatenated: equal leading
ids → byte-identical leading text. ``block_tokens`` scales 512-token blocks down for small test
models; the last block is cut to the request's remaining length. Pure, no I/O.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Iterable, Iterator

# Short, common English words: each is about one token (plus its space) for BPE tokenizers.
_WORDS = ("the of and to in is was for on are with as by at be this from or an which one you all "
          "were her she there would their we him been has when who will more no if out so said what "
          "up its about into than them can only other new some could time these two may then do "
          "first any my now such like our over man me even most made after also did many before "
          "must through back years where much your way well down should because each just those "
          "people how too little state good very make world still own see men work long get here "
          "between both life being under never day same another know while last might us great "
          "old year off come since against go came right used take three").split()
TRACE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class TraceRequest:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def parse_trace_lines(lines: Iterable[str], source: str = "trace") -> Iterator[TraceRequest]:
    """Yield requests from JSONL; ValueError names the line and the field that is wrong."""
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            d = json.loads(line)
            yield TraceRequest(float(d["timestamp"]), int(d["input_length"]), int(d["output_length"]),
                               tuple(int(h) for h in d.get("hash_ids", [])))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{source}:{n}: expected a JSON object with timestamp, input_length, "
                             f"output_length, hash_ids: {type(e).__name__}: {e}") from None


class PromptBuilder:
    """Deterministic text per hash id; ``prompt(req)`` follows the request's prefix structure."""

    def __init__(self, block_tokens: int = TRACE_BLOCK_TOKENS, seed: int = 0, cache_blocks: int = 10_000) -> None:
        if block_tokens <= 0:
            raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
        self.block_tokens = block_tokens
        self.seed = seed
        self._cache: dict[int, str] = {}
        self._cache_max = cache_blocks

    def block_text(self, hash_id: int) -> str:
        t = self._cache.get(hash_id)
        if t is None:
            rng = random.Random(hash_id * 1_000_003 + self.seed)
            # A unique marker first so two ids never share text by chance.
            words = [f"b{hash_id}"] + rng.choices(_WORDS, k=self.block_tokens - 1)
            t = " ".join(words) + " "
            if len(self._cache) < self._cache_max:
                self._cache[hash_id] = t
        return t

    def scaled_input_tokens(self, req: TraceRequest) -> int:
        return max(1, round(req.input_length * self.block_tokens / TRACE_BLOCK_TOKENS))

    def prompt(self, req: TraceRequest) -> str:
        """Concatenated block texts; the last block is cut to the request's remaining words."""
        if not req.hash_ids:
            return self.block_text(-1 - int(req.timestamp_ms))[: 4 * self.scaled_input_tokens(req)]
        want = self.scaled_input_tokens(req)
        parts = []
        for i, h in enumerate(req.hash_ids):
            remaining = want - i * self.block_tokens
            if remaining <= 0:
                break
            text = self.block_text(h)
            if remaining < self.block_tokens:
                text = " ".join(text.split(" ")[:remaining]) + " "
            parts.append(text)
        return "".join(parts)
