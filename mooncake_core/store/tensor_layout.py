"""What a stored tensor shard covers of its global tensor, and how a requested view is
assembled from stored shards (pure logic: no I/O, no torch).

Why this exists: a tensor written with one parallel split (e.g. TP=4) must be readable with
another (TP=2, or the full tensor). Object *names* cannot carry that: ``{key}_tp_{rank}`` is
the same name for rank 0 of TP=2 and rank 0 of TP=4. So every stored shard carries its
layout in its header (``ShardLayout``: the global shape and the axes that identify it), and a
read is planned from the layouts:

* a stored split (``StoredSplit``) is the complete set of shards of one global tensor along
  one dimension, checked to tile it exactly (``check_split``): same global shape, dtype and
  split, ranks ``0..count-1``, each shard exactly its uniform slice;
* a request is a box of the global tensor (``full_box`` / ``shard_box``);
* the plan (``plan_assembly``) is, per stored shard overlapping the box, the byte ranges of
  its payload that land at which offsets of the result -- a target shard is the ranges of
  the stored shards that overlap it, the full tensor all of them.

Anything that cannot be answered exactly is refused with a ``LayoutError`` naming the key,
the stored split and the requested one (never a guess, never a partial tensor).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "SPLIT_KINDS",
    "AxisTag",
    "Box",
    "LayoutError",
    "Piece",
    "ShardLayout",
    "StoredSplit",
    "box_runs",
    "check_split",
    "full_box",
    "plan_assembly",
    "shard_box",
    "uniform_range",
]

# kinds whose axis cuts the tensor along ``split_dim`` (the others -- dp, ep, pp -- only
# scope an object: they do not change which elements it holds)
SPLIT_KINDS = ("tp", "writer")

Box = tuple[tuple[int, int], ...]  # per dimension: (start, extent) in the global tensor


class LayoutError(ValueError):
    """A read or write that cannot be answered exactly from the stored layout."""


@dataclass(frozen=True)
class AxisTag:
    """One axis of a stored object's identity (``tp``/``dp``/``ep``/``pp``, or ``writer`` for
    a writer partition): ``rank`` of ``size``; ``split_dim`` for the splitting kinds."""

    kind: str
    rank: int
    size: int
    split_dim: int | None = None
    expert_id: int | None = None
    stage_id: int | None = None


def uniform_range(length: int, rank: int, size: int) -> tuple[int, int]:
    """``(start, extent)`` of ``rank``'s slice when ``length`` is cut into ``size`` equal parts."""
    if size <= 0 or not 0 <= rank < size:
        raise LayoutError(f"rank {rank} of size {size} is not a valid shard")
    if length % size:
        raise LayoutError(f"only uniform splits are supported: {length} is not divisible by {size}")
    n = length // size
    return rank * n, n


def full_box(global_shape: Sequence[int]) -> Box:
    return tuple((0, int(d)) for d in global_shape)


def shard_box(global_shape: Sequence[int], split_dim: int, rank: int, size: int) -> Box:
    """The box of the global tensor that ``rank`` of a ``size``-way split along ``split_dim`` holds."""
    if not 0 <= split_dim < len(global_shape):
        raise LayoutError(f"split_dim {split_dim} is out of range for shape {list(global_shape)}")
    start, extent = uniform_range(int(global_shape[split_dim]), rank, size)
    return tuple((start, extent) if d == split_dim else (0, int(n)) for d, n in enumerate(global_shape))


@dataclass(frozen=True)
class ShardLayout:
    """What one stored object holds: its slice of a global tensor of ``global_shape``,
    identified by ``axes`` (at most one of them a splitting kind)."""

    global_shape: tuple[int, ...]
    axes: tuple[AxisTag, ...]

    def split_axis(self) -> AxisTag | None:
        return next((a for a in self.axes if a.kind in SPLIT_KINDS), None)

    def box(self) -> Box:
        a = self.split_axis()
        if a is None or a.split_dim is None:
            return full_box(self.global_shape)
        return shard_box(self.global_shape, a.split_dim, a.rank, a.size)

    def local_shape(self) -> tuple[int, ...]:
        return tuple(e for _, e in self.box())

    def describe(self) -> str:
        a = self.split_axis()
        scope = ",".join(f"{x.kind}{x.rank}/{x.size}" for x in self.axes if x.kind not in SPLIT_KINDS)
        where = f" [{scope}]" if scope else ""
        if a is None:
            return f"full {list(self.global_shape)}{where}"
        return f"{a.kind} rank {a.rank} of {a.size} along dim {a.split_dim} of {list(self.global_shape)}{where}"


@dataclass(frozen=True)
class StoredSplit:
    """A complete stored split: ``count`` uniform shards of ``global_shape`` along ``split_dim``
    (``count == 1`` and ``split_dim is None``: one object holding the full tensor)."""

    global_shape: tuple[int, ...]
    dtype: str
    split_dim: int | None
    count: int
    kind: str = "tp"

    def describe(self) -> str:
        if self.split_dim is None:
            return f"one full {self.dtype}{list(self.global_shape)}"
        return f"{self.kind}={self.count} along dim {self.split_dim} of {self.dtype}{list(self.global_shape)}"

    def box(self, rank: int) -> Box:
        if self.split_dim is None:
            return full_box(self.global_shape)
        return shard_box(self.global_shape, self.split_dim, rank, self.count)


def check_split(key: str, split: StoredSplit,
                found: Sequence[tuple[int, str, str, tuple[int, ...], ShardLayout | None]]) -> None:
    """Check that the objects read -- ``(rank, object key, dtype, local shape, layout)`` from
    their headers -- are those ranks of ``split``. Raises LayoutError naming what differs."""
    for rank, okey, dtype, local, layout in found:
        if dtype != split.dtype:
            raise LayoutError(f"{key!r}: shard {okey!r} is {dtype}, the split is {split.describe()}")
        if split.split_dim is None:
            if layout is not None and layout.split_axis() is not None:
                raise LayoutError(f"{key!r}: {okey!r} is a shard ({layout.describe()}), not a full tensor")
            if tuple(local) != split.global_shape:
                raise LayoutError(f"{key!r}: {okey!r} has shape {list(local)}, expected {list(split.global_shape)}")
            continue
        if layout is None:
            raise LayoutError(f"{key!r}: shard {okey!r} carries no layout metadata (written by an older "
                              "mooncake-core); read it with ReadTarget('as_stored') or with the split it was "
                              "written with, or write it again")
        a = layout.split_axis()
        if (a is None or a.kind != split.kind or a.rank != rank or a.size != split.count
                or a.split_dim != split.split_dim or layout.global_shape != split.global_shape):
            raise LayoutError(f"{key!r}: shard {okey!r} holds {layout.describe()}, expected rank {rank} of "
                              f"{split.describe()} (shards of different writes under one key?)")
        if tuple(local) != layout.local_shape():
            raise LayoutError(f"{key!r}: shard {okey!r} has shape {list(local)}, its layout says "
                              f"{list(layout.local_shape())}")


@dataclass(frozen=True)
class Piece:
    """Copy ``size`` bytes from offset ``src_off`` of object ``source`` (its index in the
    plan's source list) to offset ``dst_off`` of the result."""

    source: int
    src_off: int
    dst_off: int
    size: int


def _intersect(a: Box, b: Box) -> Box | None:
    out = []
    for (a0, ae), (b0, be) in zip(a, b):
        lo, hi = max(a0, b0), min(a0 + ae, b0 + be)
        if hi <= lo:
            return None
        out.append((lo, hi - lo))
    return tuple(out)


def box_runs(src: Box, dst: Box, itemsize: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The contiguous byte runs that copy ``src ∩ dst`` from a C-contiguous array holding
    ``src`` into one holding ``dst``: ``(src_offsets, dst_offsets, run_bytes)`` (offsets in
    bytes from each array's first element; empty arrays when the boxes do not overlap)."""
    empty = np.zeros(0, np.int64)
    if len(src) != len(dst):
        raise LayoutError(f"boxes of different rank: {len(src)} and {len(dst)} dimensions")
    if not src:  # 0-d tensors: one element
        return np.zeros(1, np.int64), np.zeros(1, np.int64), itemsize
    inter = _intersect(src, dst)
    if inter is None:
        return empty, empty, 0
    ndim = len(inter)
    sshape = [e for _, e in src]
    dshape = [e for _, e in dst]
    ext = [e for _, e in inter]
    # dims after k are whole in the intersection and both arrays: one run spans them
    k = ndim - 1
    while k > 0 and ext[k] == sshape[k] == dshape[k]:
        k -= 1
    run = int(np.prod(ext[k:], dtype=np.int64))
    sstride = [int(np.prod(sshape[d + 1:], dtype=np.int64)) for d in range(ndim)]
    dstride = [int(np.prod(dshape[d + 1:], dtype=np.int64)) for d in range(ndim)]
    s_off = np.array([sum((inter[d][0] - src[d][0]) * sstride[d] for d in range(ndim))], np.int64)
    d_off = np.array([sum((inter[d][0] - dst[d][0]) * dstride[d] for d in range(ndim))], np.int64)
    for d in range(k):
        steps = np.arange(ext[d], dtype=np.int64)
        s_off = (s_off[:, None] + steps[None, :] * sstride[d]).reshape(-1)
        d_off = (d_off[:, None] + steps[None, :] * dstride[d]).reshape(-1)
    return s_off * itemsize, d_off * itemsize, run * itemsize


def plan_assembly(key: str, split: StoredSplit, target: Box, itemsize: int,
                  data_offsets: Sequence[int]) -> list[Piece]:
    """The pieces that fill a C-contiguous result holding ``target`` (a box of the global
    tensor) from the shards of ``split`` (shard i's payload starts at ``data_offsets[i]`` of
    its object). Raises LayoutError when the shards do not cover the box exactly."""
    if len(target) != len(split.global_shape):
        raise LayoutError(f"{key!r}: a {len(target)}-d request for a {len(split.global_shape)}-d tensor "
                          f"({split.describe()})")
    for d, ((t0, te), n) in enumerate(zip(target, split.global_shape)):
        if t0 < 0 or te < 0 or t0 + te > n:
            raise LayoutError(f"{key!r}: requested range [{t0}, {t0 + te}) of dim {d} is outside "
                              f"{split.describe()}")
    pieces: list[Piece] = []
    covered = 0
    for i in range(split.count):
        src_box = split.box(i)
        s_off, d_off, run = box_runs(src_box, target, itemsize)
        covered += len(s_off) * run
        base = data_offsets[i]
        pieces.extend(Piece(i, base + int(s), int(d), run) for s, d in zip(s_off.tolist(), d_off.tolist()))
    want = int(np.prod([e for _, e in target], dtype=np.int64)) * itemsize
    if covered != want:  # the uniform tiling makes this impossible unless the split is wrong
        raise LayoutError(f"{key!r}: the stored shards ({split.describe()}) cover {covered} of the "
                          f"{want} bytes requested")
    return pieces
