"""Unit tests of the hybrid KV cache groups' plans (mooncake_connectors/vllm/kv_groups.py): which
blocks of each group move, and where they live when groups share buffers."""

from __future__ import annotations

import pytest

from mooncake_connectors.vllm.kv_groups import (FULL, NULL_BLOCK, STATE, WINDOW, GroupLayout, GroupSpec, group_plan,
                                                pair_group, sent_blocks, window_blocks)
from mooncake_connectors.vllm.layout import Slab

MAMBA, ATTN = GroupSpec(STATE, 512), GroupSpec(FULL, 32)
PAGE, STATE_BYTES = 16384, 10112


def _granite_like(base: int, nb: int = 64) -> GroupLayout:
    """What vLLM 0.32 registers for the tiny Granite-4.0-H model: a Mamba layer (raw bytes, state
    10112 of a 16384-byte page) and an attention layer over one buffer."""
    return GroupLayout.build((MAMBA, ATTN), [(0, [Slab(base, nb, STATE_BYTES, PAGE)]), (1, [Slab(base, nb, PAGE, PAGE)])])


def test_shared_buffer_is_one_region_and_each_group_keeps_its_block_bytes():
    g = _granite_like(0x10000)
    assert g.regions == ((0x10000, 64 * PAGE),)
    local = g.local_slabs()
    assert local == [[Slab(0x10000, 64, STATE_BYTES, PAGE)], [Slab(0x10000, 64, PAGE, PAGE)]]
    # the peer has its own address and may have more blocks: rebuilt from its region
    remote = g.remote_slabs([(0x900000, 100 * PAGE)], "p:1")
    assert remote == [[Slab(0x900000, 100, STATE_BYTES, PAGE)], [Slab(0x900000, 100, PAGE, PAGE)]]
    assert g.tag == _granite_like(0x555000).tag and g.tag.startswith("state,full/32#1r2s#")
    other = GroupLayout.build((MAMBA, ATTN), [(0, [Slab(0, 64, 9000, PAGE)]), (1, [Slab(0, 64, PAGE, PAGE)])])
    assert other.tag != g.tag  # a different state size must not pass for the same layout
    with pytest.raises(ValueError, match="publishes 0 memory regions"):
        g.remote_slabs([], "p:1")


def test_plan_moves_the_attention_blocks_and_the_state_as_the_state():
    g = _granite_like(0)
    remote = g.remote_slabs([(1 << 30, 64 * PAGE)], "p:1")
    # decode: state block 7, attention blocks 3,4,5,6; prefill: state 1, attention 2,3,4,5
    la, ra, ln, n = group_plan(g.specs, g.local_slabs(), remote, [[7], [3, 4, 5, 6]], [[1], [2, 3, 4, 5]], 0)
    assert n == 5
    assert list(zip(la, ra, ln)) == [(7 * PAGE, (1 << 30) + PAGE, STATE_BYTES),          # the state, unpadded
                                     (3 * PAGE, (1 << 30) + 2 * PAGE, 4 * PAGE)]        # one run of 4 blocks
    with pytest.raises(ValueError, match="KV cache groups differ"):
        group_plan(g.specs, g.local_slabs(), remote, [[3, 4]], [[1], [2]], 0)


def test_pairing_rules_per_group_kind():
    # full attention: block i of the prompt on both sides, after the decode's own hit
    assert pair_group(ATTN, [8, 9], [2, 3, 4, 5], 2) == [(8, 4), (9, 5)]
    # a state: the last non-null blocks (align mode pads with null blocks)
    assert pair_group(MAMBA, [NULL_BLOCK, NULL_BLOCK, 7], [NULL_BLOCK, 4, NULL_BLOCK, 9], 0) == [(7, 9)]
    # a window of 64 tokens in 16-token blocks needs 5 blocks: only those move
    win = GroupSpec(WINDOW, 16, window_blocks(64, 16))
    assert win.window_blocks == 5
    assert pair_group(win, list(range(10, 20)), [NULL_BLOCK] * 3 + list(range(30, 37)), 0) == \
        list(zip(range(15, 20), range(32, 37)))
    # the prefill offers what would move
    assert sent_blocks(win, [NULL_BLOCK] * 3 + list(range(30, 37))) == list(range(32, 37))
    assert sent_blocks(MAMBA, [NULL_BLOCK, 4]) == [4] and sent_blocks(ATTN, [0, 1]) == [0, 1]
    with pytest.raises(ValueError, match="unknown KV cache group kind"):
        GroupSpec("cross", 16)
