"""KV cache groups of vLLM's hybrid KV cache manager: which blocks of each group move, and where
they live (pure logic, no vLLM / torch import).

Why: a hybrid model (Mamba2 + attention: Granite-4.0-H, Nemotron-H, Jamba; or sliding-window +
full attention) has one KV cache *group* per layer kind, each with its own block ids for a
request. vLLM's hybrid manager lays the groups over shared buffers: layer i of every group views
the same memory, block after block (one page stride for all), and a block id belongs to one
group at a time. A Mamba layer's page holds the layer's recurrent state (conv + SSM state, padded
to the page), handed over as a raw byte view; an attention layer's page holds K/V of
``block_size`` tokens. So a hand-off moves, per group, that group's blocks in that group's layers:

* ``full`` attention: the prompt's blocks, after the decode's own prefix hit (``layout.pair_blocks``);
* ``window`` (sliding-window attention): only the last blocks the window still needs
  (``window_blocks``: the window in blocks, plus one for the boundary, as vLLM's connectors clip);
  older ones are null blocks on the prefill already;
* ``state`` (Mamba): the state page(s), the last ones paired, each moved as the state it is (its
  ``block_bytes``, not the padded page) -- a state cannot be cut into token ranges.

Null blocks (vLLM's block id 0: placeholders of freed or skipped blocks) never move. Both sides
run the same model, so the decode rebuilds the prefill's slabs from its own layout and the
prefill's registered regions (``remote_group_slabs``); ``layout_tag`` says what must match.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from mooncake_connectors.vllm.layout import Slab, coalesce, pair_blocks, plan

#: vLLM's null block (``vllm.v1.attention.backends.utils.NULL_BLOCK_ID``): a placeholder, never data.
NULL_BLOCK = 0
FULL, WINDOW, STATE = "full", "window", "state"
KINDS = (FULL, WINDOW, STATE)


@dataclass(frozen=True)
class GroupSpec:
    """One KV cache group: its kind, its block size in tokens (vLLM's nominal one for a state
    group) and, for a sliding window, how many trailing blocks the window needs."""

    kind: str
    block_size: int
    window_blocks: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown KV cache group kind {self.kind!r} (one of {', '.join(KINDS)})")

    @property
    def tag(self) -> str:
        return {FULL: f"full/{self.block_size}", WINDOW: f"window/{self.block_size}x{self.window_blocks}",
                STATE: "state"}[self.kind]


def window_blocks(window_tokens: int, block_size: int) -> int:
    """Blocks a sliding window of ``window_tokens`` needs: the window, plus one because it need
    not start on a block boundary."""
    return -(-window_tokens // block_size) + 1


def is_hybrid(specs: tuple[GroupSpec, ...]) -> bool:
    """More than one group, or a group that is not full attention: block ids differ per group."""
    return len(specs) > 1 or any(s.kind != FULL for s in specs)


def token_group(specs: tuple[GroupSpec, ...]) -> int:
    """The group whose blocks count the prompt's tokens (the first full-attention group; the first
    group when there is none)."""
    return next((i for i, s in enumerate(specs) if s.kind == FULL), 0)


def sent_blocks(spec: GroupSpec, block_ids: list[int]) -> list[int]:
    """The blocks of a finished prefill request worth offering in this group: all of a full group,
    the non-null tail a window needs, the non-null state blocks."""
    if spec.kind == FULL:
        return list(block_ids)
    live = [b for b in block_ids if b != NULL_BLOCK]
    return live[-spec.window_blocks:] if spec.kind == WINDOW and spec.window_blocks else live


def pair_group(spec: GroupSpec, local_ids: list[int], remote_ids: list[int],
               local_hit_blocks: int) -> list[tuple[int, int]]:
    """(local, remote) block pairs to move in one group. Full attention pairs block i of the
    prompt on both sides (after the decode's own hit); a window and a state pair their last
    non-null blocks (what the window needs; the latest state)."""
    if spec.kind == FULL:
        return pair_blocks(local_ids, remote_ids, local_hit_blocks)
    loc = [b for b in local_ids if b != NULL_BLOCK]
    rem = [b for b in remote_ids if b != NULL_BLOCK]
    n = min(len(loc), len(rem))
    if spec.kind == WINDOW and spec.window_blocks:
        n = min(n, spec.window_blocks)
    return list(zip(loc[len(loc) - n:], rem[len(rem) - n:])) if n else []


@dataclass(frozen=True)
class GroupSlab:
    """One layer's slab of one group, placed in a registered region (``offset`` bytes in)."""

    group: int
    region: int
    offset: int
    block_bytes: int
    stride: int


@dataclass(frozen=True)
class GroupLayout:
    """A worker's KV memory under the hybrid manager: the distinct regions to register (shared
    buffers once) and every layer's slab, tagged with its group."""

    specs: tuple[GroupSpec, ...]
    regions: tuple[tuple[int, int], ...]  # (base address, bytes), in the order they are registered
    slabs: tuple[GroupSlab, ...]
    num_blocks: int

    @classmethod
    def build(cls, specs: tuple[GroupSpec, ...], layers: list[tuple[int, list[Slab]]]) -> "GroupLayout":
        """From each layer's (group, slabs) in vLLM's layer order. Overlapping slabs (layers of
        different groups over one buffer) share one region."""
        if not layers:
            raise ValueError("no KV cache layers to register")
        spans: list[list[int]] = []  # [start, end] merged, in first-seen order
        for _g, slabs in layers:
            for s in slabs:
                start, end = s.base, s.base + s.nbytes
                hit = [sp for sp in spans if start < sp[1] and sp[0] < end]
                if not hit:
                    spans.append([start, end])
                    continue
                keep = hit[0]
                keep[0], keep[1] = min([start] + [sp[0] for sp in hit]), max([end] + [sp[1] for sp in hit])
                spans[:] = [sp for sp in spans if sp is keep or sp not in hit]
        out: list[GroupSlab] = []
        nb = {s.num_blocks for _g, slabs in layers for s in slabs}
        if len(nb) != 1:
            raise ValueError(f"KV cache layers have different block counts {sorted(nb)}; unsupported")
        for g, slabs in layers:
            if not 0 <= g < len(specs):
                raise ValueError(f"layer of KV cache group {g}, but {len(specs)} groups")
            for s in slabs:
                k = next(i for i, sp in enumerate(spans) if sp[0] <= s.base < sp[1])
                out.append(GroupSlab(g, k, s.base - spans[k][0], s.block_bytes, s.stride))
        return cls(specs, tuple((a, b - a) for a, b in spans), tuple(out), nb.pop())

    @property
    def tag(self) -> str:
        """What a peer's layout must equal: the groups, and a digest of every slab's place and size."""
        desc = ";".join(f"{s.group}@{s.region}+{s.offset}:{s.block_bytes}/{s.stride}" for s in self.slabs)
        digest = hashlib.blake2b(desc.encode(), digest_size=8).hexdigest()
        return f"{','.join(s.tag for s in self.specs)}#{len(self.regions)}r{len(self.slabs)}s#{digest}"

    @property
    def page_bytes(self) -> int:
        """The largest block stride (the page the hybrid manager lays every group on)."""
        return max(s.stride for s in self.slabs)

    def local_slabs(self) -> list[list[Slab]]:
        """This worker's slabs per group."""
        return self._slabs_over(list(self.regions), "this worker")

    def remote_slabs(self, regions: list[tuple[int, int]], segment: str) -> list[list[Slab]]:
        """The peer's slabs per group, from the regions its segment publishes (same layout, its
        own addresses; its block count follows from the region sizes)."""
        if len(regions) < len(self.regions):
            raise ValueError(f"segment {segment!r} publishes {len(regions)} memory regions, this hybrid KV "
                             f"layout needs {len(self.regions)} (the same model on both sides?)")
        return self._slabs_over(regions[:len(self.regions)], f"segment {segment!r}")

    def _slabs_over(self, regions: list[tuple[int, int]], who: str) -> list[list[Slab]]:
        out: list[list[Slab]] = [[] for _ in self.specs]
        for s in self.slabs:
            base, length = regions[s.region]
            if length < s.offset + s.block_bytes or s.stride <= 0:
                raise ValueError(f"{who}: region {s.region} ({length} bytes) holds no block of "
                                 f"{s.block_bytes} bytes at offset {s.offset}")
            nb = (length - s.offset - s.block_bytes) // s.stride + 1
            out[s.group].append(Slab(base + s.offset, nb, s.block_bytes, s.stride))
        return out


def group_plan(specs: tuple[GroupSpec, ...], local: list[list[Slab]], remote: list[list[Slab]],
               local_ids: list[list[int]], remote_ids: list[list[int]],
               local_hit_blocks: int) -> tuple[list[int], list[int], list[int], int]:
    """(local addrs, remote addrs, lengths, blocks) moving each group's paired blocks in that
    group's slabs."""
    if not len(specs) == len(local) == len(remote) == len(local_ids) == len(remote_ids):
        raise ValueError(f"KV cache groups differ: {len(specs)} groups here, block ids for {len(local_ids)} "
                         f"local and {len(remote_ids)} remote groups")
    la: list[int] = []
    ra: list[int] = []
    ln: list[int] = []
    nblocks = 0
    for g, spec in enumerate(specs):
        pairs = pair_group(spec, local_ids[g], remote_ids[g], local_hit_blocks)
        if not pairs:
            continue
        a, b, c = plan(local[g], remote[g], coalesce(pairs))
        la += a
        ra += b
        ln += c
        nblocks += len(pairs)
    return la, ra, ln, nblocks
