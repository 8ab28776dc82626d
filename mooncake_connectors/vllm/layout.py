"""KV-cache memory layout and block-granular transfer plans (pure logic, no vLLM / torch import).

vLLM hands the connector one tensor per attention layer. Whatever the backend, each tensor is
one or more *slabs*: contiguous arrays of ``num_blocks`` equal blocks (on CPU the whole tensor
``(num_blocks, kv_heads, block_size, 2*head_size)`` is one slab, K rows then V rows inside a
block; GPU flash layouts ``(2, num_blocks, ...)`` are two slabs, K and V). Moving whole blocks
of every slab moves exactly the KV of those blocks -- no more bytes than needed.

A transfer plan pairs local and remote block ids and merges runs that are contiguous on both
sides into one request, so a 13-block prompt with fresh allocations typically becomes one
request per slab instead of thirteen.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slab:
    """``num_blocks`` blocks of ``block_bytes`` each, ``stride`` bytes apart, starting at ``base``."""

    base: int
    num_blocks: int
    block_bytes: int
    stride: int

    @property
    def nbytes(self) -> int:
        return self.stride * (self.num_blocks - 1) + self.block_bytes if self.num_blocks else 0

    def addr(self, block_id: int) -> int:
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block id {block_id} out of range (slab has {self.num_blocks} blocks)")
        return self.base + block_id * self.stride


def slabs_of(data_ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], elem_size: int,
             num_blocks: int) -> list[Slab]:
    """Split one layer's KV tensor (``strides`` in elements, as torch reports them) into slabs.

    The block dimension is the first of the first two dimensions whose size is ``num_blocks``
    (a leading dimension before it enumerates slabs, e.g. K and V); the dimensions after it must
    be contiguous so that one block is one byte range."""
    if len(shape) != len(strides) or not shape:
        raise ValueError(f"bad KV cache tensor shape {tuple(shape)} / strides {tuple(strides)}")
    cands = [i for i in range(min(2, len(shape))) if shape[i] == num_blocks]
    if not cands:
        raise ValueError(f"KV cache tensor of shape {tuple(shape)} has no block dimension of size {num_blocks} "
                         "in its first two dimensions; unsupported layout")
    bd = cands[0]
    expect = 1
    for d in range(len(shape) - 1, bd, -1):
        if shape[d] != 1 and strides[d] != expect:
            raise ValueError(f"KV cache tensor (shape {tuple(shape)}, strides {tuple(strides)}) is not "
                             "contiguous within a block; cannot move whole blocks")
        expect *= shape[d]
    block_bytes = expect * elem_size
    outer = shape[0] if bd == 1 else 1
    return [Slab(base=data_ptr + (o * strides[0] * elem_size if bd == 1 else 0), num_blocks=num_blocks,
                 block_bytes=block_bytes, stride=strides[bd] * elem_size) for o in range(outer)]


@dataclass(frozen=True)
class Run:
    """``count`` consecutive blocks starting at ``local`` here and ``remote`` there."""

    local: int
    remote: int
    count: int


def pair_blocks(local_ids: list[int], remote_ids: list[int], local_hit_blocks: int) -> list[tuple[int, int]]:
    """Pair the decode's freshly allocated blocks with the prefill's blocks holding the same tokens.

    ``local_ids`` are the decode blocks after its own prefix-cache hit of ``local_hit_blocks``
    blocks; ``remote_ids`` are all the prefill's blocks for the prompt. Block i of the request
    is ``remote_ids[i]`` there, so fresh local block j is remote block ``local_hit_blocks + j``.
    Extra local blocks (room for generated tokens) have no remote counterpart and are skipped.
    """
    if local_hit_blocks < 0:
        raise ValueError(f"local_hit_blocks must be >= 0, got {local_hit_blocks}")
    rem = remote_ids[local_hit_blocks:]
    return list(zip(local_ids, rem))


def coalesce(pairs: list[tuple[int, int]]) -> list[Run]:
    """Merge pairs contiguous on both sides into runs (order preserved)."""
    runs: list[Run] = []
    for loc, rem in pairs:
        if runs and runs[-1].local + runs[-1].count == loc and runs[-1].remote + runs[-1].count == rem:
            last = runs[-1]
            runs[-1] = Run(last.local, last.remote, last.count + 1)
        else:
            runs.append(Run(loc, rem, 1))
    return runs


def plan(local_slabs: list[Slab], remote_slabs: list[Slab], runs: list[Run], part: int = 0,
         parts: int = 1, remote_part: int = 0, remote_parts: int = 1) -> tuple[list[int], list[int], list[int]]:
    """(local_addrs, remote_addrs, lengths) moving every run in every slab.

    A run becomes one request per slab when blocks are packed (stride == block_bytes) on both
    sides; otherwise one request per block. Tensor parallelism moves head slices, one request
    per block: ``parts > 1`` (prefill TP = parts x decode TP) puts each remote block into slice
    ``part`` of ``parts`` equal slices of the local block; ``remote_parts > 1`` (decode TP >
    prefill TP) reads slice ``remote_part`` of ``remote_parts`` equal slices of each remote block
    into the whole local block. A slice of a head-outer block is one contiguous byte range; the
    slices of a run's blocks are a block apart (strided), hence one request each."""
    if len(local_slabs) != len(remote_slabs):
        raise ValueError(f"KV layouts differ: {len(local_slabs)} slabs here, {len(remote_slabs)} on the peer")
    if not 0 <= part < parts:
        raise ValueError(f"slice {part} of {parts} does not exist")
    if not 0 <= remote_part < remote_parts:
        raise ValueError(f"remote slice {remote_part} of {remote_parts} does not exist")
    la: list[int] = []
    ra: list[int] = []
    ln: list[int] = []
    for i, (ls, rs) in enumerate(zip(local_slabs, remote_slabs)):
        n = ls.block_bytes // parts
        if ls.block_bytes != parts * n or rs.block_bytes != remote_parts * n:
            raise ValueError(f"KV layouts differ in slab {i}: {ls.block_bytes} bytes per block here, "
                             f"{rs.block_bytes} on the peer" + (f" (x {parts} slices)" if parts > 1 else "")
                             + (f" (/ {remote_parts} slices)" if remote_parts > 1 else "")
                             + " (same model, dtype and block size on both?)")
        packed = parts == remote_parts == 1 and ls.stride == ls.block_bytes and rs.stride == rs.block_bytes
        for r in runs:
            if r.local + r.count > ls.num_blocks or r.remote + r.count > rs.num_blocks:
                raise ValueError(f"run {r} exceeds slab {i} (local {ls.num_blocks} blocks, "
                                 f"remote {rs.num_blocks} blocks)")
            if packed:
                la.append(ls.addr(r.local))
                ra.append(rs.addr(r.remote))
                ln.append(r.count * ls.block_bytes)
            else:
                for k in range(r.count):
                    la.append(ls.addr(r.local + k) + part * n)
                    ra.append(rs.addr(r.remote + k) + remote_part * n)
                    ln.append(n)
    return la, ra, ln


def heads_outer(shape: tuple[int, ...], num_blocks: int, kv_heads: int) -> bool:
    """True when a block of this KV tensor is ``[kv_heads, ...]`` (each head's slice one byte range),
    e.g. vLLM's CPU layout ``(num_blocks, kv_heads, block_size, 2*head_size)``; one head is trivially so."""
    if kv_heads <= 1:
        return True
    bd = next((i for i in range(min(2, len(shape))) if shape[i] == num_blocks), None)
    return bd is not None and len(shape) > bd + 1 and shape[bd + 1] == kv_heads


def remote_slabs_from_regions(regions: list[tuple[int, int]], block_bytes: int, num_slabs: int,
                              segment: str) -> list[Slab]:
    """Rebuild the prefill's slabs from its published segment regions ``[(addr, length)]``.

    The worker registers one region per slab, in slab order, with packed blocks; the peer's
    block count follows from the region length (P and D may size their caches differently)."""
    if len(regions) < num_slabs:
        raise ValueError(f"segment {segment!r} publishes {len(regions)} memory regions, expected {num_slabs} "
                         "KV slabs (is it a MooncakeCoreConnector prefill worker with the same model?)")
    out = []
    for i, (addr, length) in enumerate(regions[:num_slabs]):
        if block_bytes <= 0 or length % block_bytes:
            raise ValueError(f"segment {segment!r} region {i} is {length} bytes, not a multiple of the "
                             f"{block_bytes}-byte block")
        out.append(Slab(base=addr, num_blocks=length // block_bytes, block_bytes=block_bytes, stride=block_bytes))
    return out
