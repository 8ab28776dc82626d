"""BlockHasher: chaining, full blocks only, text mode, determinism across processes."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from mooncake_proxy.scheduling import BlockHasher


def _tokens(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(1, 128_000, size=n).tolist()


def test_one_hash_per_full_block_and_chaining() -> None:
    rng = np.random.default_rng(1)
    h = BlockHasher(block_size=16)
    a = _tokens(rng, 16 * 5 + 7)
    ha = h.hash_tokens(a)
    assert len(ha) == 5  # the 7-token tail is not a full block
    assert len(set(ha)) == 5
    # Same prefix, different tail within the partial block: identical hashes.
    b = a[: 16 * 5] + _tokens(rng, 3)
    assert h.hash_tokens(b) == ha
    # Change one token in block 2: blocks 0-1 equal, every later block differs (chaining).
    c = list(a)
    c[16 * 2 + 5] += 1
    hc = h.hash_tokens(c)
    assert hc[:2] == ha[:2]
    assert all(x != y for x, y in zip(hc[2:], ha[2:]))
    # Same block content at a different position hashes differently (prefix matters).
    d = a[16:32] + a[16:32]
    hd = h.hash_tokens(d)
    assert hd[0] != hd[1]


def test_short_and_empty_prompts() -> None:
    h = BlockHasher(block_size=512)
    assert h.hash_tokens([]) == []
    assert h.hash_tokens(list(range(511))) == []
    assert len(h.hash_tokens(list(range(512)))) == 1


def test_seed_and_block_size_namespace_hashes() -> None:
    toks = list(range(1, 1025))
    assert BlockHasher(512, "model-a").hash_tokens(toks) != BlockHasher(512, "model-b").hash_tokens(toks)
    assert BlockHasher(256).hash_tokens(toks)[:1] != BlockHasher(512).hash_tokens(toks)[:1]


def test_hashes_are_unsigned_64_bit_and_stable_across_processes(python_exe: str) -> None:
    toks = list(range(100, 100 + 2048))
    mine = BlockHasher(512, "s").hash_tokens(toks)
    assert all(0 <= x < 2**64 for x in mine)
    code = ("from mooncake_proxy.scheduling import BlockHasher;"
            "print(BlockHasher(512,'s').hash_tokens(list(range(100,2148))))")
    out = subprocess.run([python_exe, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert eval(out.stdout) == mine  # noqa: S307 - our own subprocess output (a list literal)


def test_hash_text_chunks_of_four_bytes_per_token() -> None:
    rng = np.random.default_rng(2)
    h = BlockHasher(block_size=8)  # 32-byte chunks
    text = "".join(chr(c) for c in rng.integers(97, 123, size=32 * 3 + 5))
    ht = h.hash_text(text)
    assert len(ht) == 3
    other = text[:64] + "Z" + text[65:]
    ho = h.hash_text(other)
    assert ho[:2] == ht[:2] and ho[2] != ht[2]
    assert h.hash_text(text[:31]) == []
    # Multi-byte characters count by UTF-8 bytes.
    assert len(h.hash_text("é" * 16)) == 1  # 32 bytes
    assert BlockHasher.approx_tokens("") == 0
    assert BlockHasher.approx_tokens("abcd") == 1
    assert BlockHasher.approx_tokens("abcde") == 2


@pytest.mark.parametrize("bad", [0, -4, 1.5])
def test_bad_block_size(bad) -> None:
    with pytest.raises(ValueError, match="block_size"):
        BlockHasher(block_size=bad)


def test_bad_tokens_clear_error() -> None:
    with pytest.raises(ValueError, match="token_ids"):
        BlockHasher(2).hash_tokens(["a", "b"])


def test_continue_chain_matches_hash_tokens() -> None:
    rng = np.random.default_rng(5)
    h = BlockHasher(block_size=16, seed="m")
    toks = _tokens(rng, 16 * 4)
    full = h.hash_tokens(toks)
    prev = None
    for i in range(4):
        prev = h.continue_chain(prev, toks[i * 16:(i + 1) * 16])
        assert prev == full[i]
    with pytest.raises(ValueError, match="exactly block_size=16"):
        h.continue_chain(None, toks[:15])
