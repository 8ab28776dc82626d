"""Shard identities for the unified parallel tensor IO API (pure logic, upstream names).

``ParallelAxis`` / ``TensorParallelism`` / ``ReadTarget`` are the request types of
``put_tensor_with_parallelism`` / ``get_tensor_with_parallelism`` (``mooncake.store`` exports
the same names). This module validates them with upstream's rules and derives the object key
a shard is stored under:

* one TP axis only -> ``{key}_tp_{rank}`` (the legacy ``*_with_tp`` name, so both families
  read each other's shards);
* otherwise -> ``{key}__{kind}_{rank}of{size}[_sd{split_dim}][_eid{expert}][_sid{stage}]`` per
  axis, axes in canonical order dp, tp, ep, pp;
* a writer partition ``(rank, size, split_dim)`` -> ``{key}__writer_{rank}of{size}_sd{dim}``
  plus a small manifest object ``{key}__writer_manifest`` that lets a reader rebuild the full
  tensor without knowing the partitioning;
* a TP shard written with other axes (dp/ep/pp) -> also ``{group}__parallelism_manifest``
  (``group`` = the key with the non-TP axes): the shard *names* embed the TP size, so a reader
  with another TP size learns the stored one there (a single-TP reader learns it from the
  ``{key}_tp_0`` shard's header instead).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import msgspec

from mooncake_core.store.tensor_layout import AxisTag

__all__ = [
    "ParallelAxis",
    "ParallelismError",
    "ReadTarget",
    "TensorParallelism",
    "ParallelManifest",
    "WriterManifest",
    "WriterPartition",
    "axis_tags",
    "parallelism_key",
    "parallelism_manifest_key",
    "parse_writer_partition",
    "tp_axis",
    "validate_axes",
    "with_tp_rank",
    "writer_manifest_key",
    "writer_shard_key",
]

_KINDS = ("dp", "tp", "ep", "pp")  # canonical key order
MAX_AXES = 4
READ_MODES = ("as_stored", "shard", "full")


class ParallelismError(ValueError):
    """A parallelism request upstream would refuse (the store methods map it to -600/None)."""


class ParallelAxis:
    """One axis of a shard identity: ``kind`` in tp/dp/ep/pp, ``rank`` of ``size``;
    ``split_dim`` (TP only), ``expert_id`` (EP), ``stage_id`` (PP)."""

    __slots__ = ("expert_id", "kind", "rank", "size", "split_dim", "stage_id")

    def __init__(self, kind: str = "", rank: int = 0, size: int = 1, split_dim: int | None = None,
                 expert_id: int | None = None, stage_id: int | None = None) -> None:
        self.kind = kind
        self.rank = rank
        self.size = size
        self.split_dim = split_dim
        self.expert_id = expert_id
        self.stage_id = stage_id

    def __repr__(self) -> str:
        return (f"ParallelAxis(kind={self.kind!r}, rank={self.rank}, size={self.size}, split_dim={self.split_dim}, "
                f"expert_id={self.expert_id}, stage_id={self.stage_id})")


class TensorParallelism:
    """The ordered axes that identify a stored or requested shard."""

    __slots__ = ("axes",)

    def __init__(self, axes: list[ParallelAxis] | None = None) -> None:
        self.axes: list[ParallelAxis] = list(axes or [])

    def __repr__(self) -> str:
        return f"TensorParallelism(axes={self.axes!r})"


class ReadTarget:
    """What a read materialises: ``as_stored`` (the object as written), ``shard`` (the shard
    named by ``parallelism``) or ``full`` (the reconstructed full tensor)."""

    __slots__ = ("mode", "parallelism")

    def __init__(self, mode: str = "as_stored", parallelism: TensorParallelism | None = None) -> None:
        self.mode = mode
        self.parallelism = parallelism

    def __repr__(self) -> str:
        return f"ReadTarget(mode={self.mode!r}, parallelism={self.parallelism!r})"


@dataclass(frozen=True)
class WriterPartition:
    rank: int
    size: int
    split_dim: int


class WriterManifest(msgspec.Struct, frozen=True):
    """Stored at ``{key}__writer_manifest``: how the full tensor was partitioned."""

    size: int
    split_dim: int
    shape: list[int]
    dtype: str


class ParallelManifest(msgspec.Struct, frozen=True):
    """Stored at ``parallelism_manifest_key``: the TP split the group's shards were written with."""

    size: int
    split_dim: int
    shape: list[int]
    dtype: str


def _opt_int(v: Any, what: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{what}: expected int or None, got {type(v).__name__}")
    return v


def validate_axes(parallelism: Any, op: str) -> list[ParallelAxis]:
    """Check ``parallelism`` as upstream does; returns its axes (copied, kinds lower-cased).

    TypeError for wrong object types; ParallelismError for values upstream refuses.
    """
    if not isinstance(parallelism, TensorParallelism):
        raise TypeError(f"{op}: parallelism must be a TensorParallelism, got {type(parallelism).__name__}")
    axes = parallelism.axes
    if not isinstance(axes, (list, tuple)) or not all(isinstance(a, ParallelAxis) for a in axes):
        raise TypeError(f"{op}: TensorParallelism.axes must be a list of ParallelAxis")
    if not axes:
        raise ParallelismError(f"{op}: parallelism axes cannot be empty")
    if len(axes) > MAX_AXES:
        raise ParallelismError(f"{op}: {len(axes)} axes exceed the maximum of {MAX_AXES}")
    out: list[ParallelAxis] = []
    seen: set[str] = set()
    for a in axes:
        kind = str(a.kind).lower()
        if kind not in _KINDS:
            raise ParallelismError(f"{op}: unsupported axis kind {a.kind!r} (expected one of {list(_KINDS)})")
        rank, size = _opt_int(a.rank, f"{op}: {kind}.rank"), _opt_int(a.size, f"{op}: {kind}.size")
        if rank is None or size is None or size <= 0 or not 0 <= rank < size:
            raise ParallelismError(f"{op}: invalid rank/size {a.rank}/{a.size} for axis {kind}")
        if kind in seen:
            raise ParallelismError(f"{op}: duplicate axis kind {kind}")
        seen.add(kind)
        sd = _opt_int(a.split_dim, f"{op}: {kind}.split_dim")
        eid = _opt_int(a.expert_id, f"{op}: {kind}.expert_id")
        sid = _opt_int(a.stage_id, f"{op}: {kind}.stage_id")
        if kind == "tp" and sd is None:
            raise ParallelismError(f"{op}: TP axis requires split_dim")
        if kind in ("dp", "ep", "pp") and sd is not None:
            raise ParallelismError(f"{op}: {kind.upper()} axis must not provide split_dim")
        if kind == "ep" and eid is None:
            raise ParallelismError(f"{op}: EP axis requires expert_id")
        if kind == "pp" and sid is None:
            raise ParallelismError(f"{op}: PP axis requires stage_id")
        out.append(ParallelAxis(kind, rank, size, sd, eid, sid))
    return out


def tp_axis(axes: list[ParallelAxis]) -> ParallelAxis | None:
    return next((a for a in axes if a.kind == "tp"), None)


def with_tp_rank(axes: list[ParallelAxis], rank: int) -> list[ParallelAxis]:
    """The same identity for another TP rank (to locate sibling shards)."""
    out = [copy.copy(a) for a in axes]
    for a in out:
        if a.kind == "tp":
            a.rank = rank
    return out


def parallelism_key(base_key: str, axes: list[ParallelAxis]) -> str:
    """The object key of the shard ``axes`` of ``base_key`` (validated axes)."""
    if len(axes) == 1 and axes[0].kind == "tp":
        return f"{base_key}_tp_{axes[0].rank}"
    key = base_key
    for a in sorted(axes, key=lambda a: _KINDS.index(a.kind)):
        key += f"__{a.kind}_{a.rank}of{a.size}"
        if a.split_dim is not None:
            key += f"_sd{a.split_dim}"
        if a.expert_id is not None:
            key += f"_eid{a.expert_id}"
        if a.stage_id is not None:
            key += f"_sid{a.stage_id}"
    return key


def parallelism_manifest_key(base_key: str, axes: list[ParallelAxis]) -> str:
    """Where the TP split of the shards of ``base_key`` scoped by ``axes``' non-TP axes is
    recorded (``{key}__parallelism_manifest`` when there are none, as upstream)."""
    scope = [a for a in axes if a.kind != "tp"]
    return (parallelism_key(base_key, scope) if scope else base_key) + "__parallelism_manifest"


def axis_tags(axes: list[ParallelAxis]) -> tuple[AxisTag, ...]:
    """Validated axes as the layout tags stored in a shard's header (canonical order)."""
    return tuple(AxisTag(a.kind, a.rank, a.size, a.split_dim, a.expert_id, a.stage_id)
                 for a in sorted(axes, key=lambda a: _KINDS.index(a.kind)))


def parse_writer_partition(obj: Any, op: str) -> WriterPartition:
    """``writer_partition``: any object with ``rank``, ``size``, ``split_dim`` attributes
    (as upstream), or a dict with those keys."""
    if isinstance(obj, dict):
        vals = [obj.get(k) for k in ("rank", "size", "split_dim")]
    elif all(hasattr(obj, k) for k in ("rank", "size", "split_dim")):
        vals = [obj.rank, obj.size, obj.split_dim]
    else:
        raise ParallelismError(f"{op}: writer_partition must provide rank, size, and split_dim")
    rank, size, sd = (_opt_int(v, f"{op}: writer_partition") for v in vals)
    if rank is None or size is None or sd is None or size <= 0 or not 0 <= rank < size or sd < 0:
        raise ParallelismError(f"{op}: invalid writer partition rank={rank} size={size} split_dim={sd}")
    return WriterPartition(rank, size, sd)


def writer_shard_key(base_key: str, w: WriterPartition) -> str:
    return f"{base_key}__writer_{w.rank}of{w.size}_sd{w.split_dim}"


def writer_manifest_key(base_key: str) -> str:
    return f"{base_key}__writer_manifest"
