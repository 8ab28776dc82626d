"""Tensor-parallel sharding rules shared by the ``*_with_tp`` store methods (pure logic).

Upstream Mooncake stores a TP-split tensor as one object per rank, named
``{key}_tp_{rank}``, and only accepts *uniform* splits: ``0 <= split_dim < ndim`` and the
split dimension divisible by ``tp_size`` (anything else is ``INVALID_PARAMS``, -600).
Keeping the rules here, away from the I/O, lets them be unit-tested in microseconds and keeps
every TP variant (tensor / ``_from`` buffer / batch) in agreement.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ShardError", "shard_bounds", "tp_key_name", "uniform_shard_check"]


class ShardError(ValueError):
    """The requested split is not one upstream accepts (maps to -600)."""


def tp_key_name(key: str, tp_rank: int) -> str:
    """The object name of ``key``'s shard for ``tp_rank`` (upstream's naming)."""
    return f"{key}_tp_{tp_rank}"


def uniform_shard_check(shape: Sequence[int], split_dim: int, tp_size: int) -> int:
    """Validate a uniform split; returns the shard length along ``split_dim``.

    Raises ShardError naming what is wrong (negative/out-of-range dim, uneven split).
    """
    ndim = len(shape)
    if tp_size <= 0:
        raise ShardError(f"tp_size must be >= 1, got {tp_size}")
    if split_dim < 0 or split_dim >= ndim:
        raise ShardError(f"split_dim {split_dim} is out of range for a {ndim}-d tensor of shape {list(shape)}")
    dim = int(shape[split_dim])
    if dim % tp_size:
        raise ShardError(f"only uniform sharding is supported: dim {split_dim} of shape {list(shape)} "
                         f"({dim}) is not divisible by tp_size {tp_size}")
    return dim // tp_size


def shard_bounds(shape: Sequence[int], split_dim: int, tp_size: int) -> list[tuple[int, int]]:
    """``(start, length)`` along ``split_dim`` of each rank's shard."""
    n = uniform_shard_check(shape, split_dim, tp_size)
    return [(r * n, n) for r in range(tp_size)]
