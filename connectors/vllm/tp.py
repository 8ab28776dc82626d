"""Which prefill ranks a decode rank reads its KV from under tensor parallelism (pure logic).

Why: with ``tensor_parallel_size`` N every worker holds the KV of its own share of the KV
heads (rank r: heads ``[r*H/N, (r+1)*H/N)``), in its own paged cache, registered with its own
Transfer Engine segment. The blocks ids are the scheduler's and so the same on every rank;
only the bytes differ. A decode rank therefore reads block i from the prefill rank(s) holding
its heads:

* same TP on both sides: decode rank r reads whole blocks from prefill rank r;
* prefill TP = k x decode TP (e.g. prefill 2 -> decode 1): decode rank r holds the heads of
  prefill ranks ``r*k .. r*k+k-1``; prefill rank ``r*k+j``'s block is the j-th of k equal head
  slices of the decode's block. That needs the decode's blocks to be *head-outer* (a block is
  ``[kv_heads, ...]``, so a head slice is one byte range) -- true of vLLM's CPU attention
  backend ``(num_blocks, kv_heads, block_size, 2*head_size)`` and of HND GPU layouts, not of
  NHD flash layouts;
* KV heads replicated on the prefill (fewer KV heads than prefill ranks): every rank of the
  group has the same bytes, the decode reads whole blocks from the group's first rank and
  tells all of them it is done;
* decode TP > prefill TP: not supported (the prefill would have to wait for several decode
  ranks per block, which it cannot know when it answers); the decode computes the prompt.

The same rule as vLLM's NixlConnector (``tp_ratio`` in ``nixl/base_worker.py``), on our layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


class TPMismatch(ValueError):
    """The two instances' tensor-parallel KV layouts cannot be paired; the message says why."""


@dataclass(frozen=True)
class KVShard:
    """The KV layout one side's ranks publish (the same on all ranks of an instance)."""

    tp_size: int
    block_bytes: int  # bytes of one block of one slab on one rank
    num_slabs: int
    kv_heads: int = 0  # KV heads per rank (0: unknown -- params from an older prefill)
    heads_outer: bool = True  # a block is [kv_heads, ...]: each head's slice is one byte range


@dataclass(frozen=True)
class Source:
    """Read from prefill rank ``rank`` into slice ``part`` of ``parts`` equal slices of each local
    block (``parts == 1``: the whole block)."""

    rank: int
    part: int = 0
    parts: int = 1


@dataclass(frozen=True)
class RankPlan:
    """What one decode rank does: the reads, and which prefill ranks to confirm to (free blocks)."""

    reads: tuple[Source, ...]
    notify: tuple[int, ...]


def rank_plan(local_rank: int, local: KVShard, remote: KVShard) -> RankPlan:
    """The reads of decode rank ``local_rank``; raises ``TPMismatch`` naming the mismatch."""
    if not 0 <= local_rank < local.tp_size:
        raise TPMismatch(f"rank {local_rank} out of range for decode TP {local.tp_size}")
    if remote.tp_size < 1:
        raise TPMismatch(f"prefill TP size {remote.tp_size} is not >= 1")
    if local.num_slabs != remote.num_slabs:
        raise TPMismatch(f"prefill has {remote.num_slabs} KV slabs per rank, this decode {local.num_slabs} "
                         "(same model on both?)")
    if remote.tp_size == local.tp_size:
        if local.block_bytes != remote.block_bytes:
            raise TPMismatch(f"prefill blocks are {remote.block_bytes} bytes per slab, this decode's "
                             f"{local.block_bytes} (same model, dtype and block size on both?)")
        return RankPlan((Source(local_rank),), (local_rank,))
    if remote.tp_size < local.tp_size or remote.tp_size % local.tp_size:
        raise TPMismatch(f"decode TP {local.tp_size} cannot read from prefill TP {remote.tp_size}: the decode's "
                         "TP must equal the prefill's or divide it")
    k = remote.tp_size // local.tp_size
    group = tuple(range(local_rank * k, local_rank * k + k))
    if local.block_bytes == remote.block_bytes and (remote.kv_heads == local.kv_heads or not remote.kv_heads):
        return RankPlan((Source(group[0]),), group)  # heads replicated on the prefill: any rank has them all
    if local.block_bytes != k * remote.block_bytes:
        raise TPMismatch(f"prefill TP {remote.tp_size} blocks are {remote.block_bytes} bytes per slab; decode TP "
                         f"{local.tp_size} needs {k} of them per {local.block_bytes}-byte block")
    if remote.kv_heads and local.kv_heads and local.kv_heads != k * remote.kv_heads:
        raise TPMismatch(f"prefill ranks hold {remote.kv_heads} KV heads each, this decode's {local.kv_heads}: "
                         f"not {k} disjoint head slices")
    if not local.heads_outer:
        raise TPMismatch("this decode's KV blocks are not head-outer (NHD layout?): a prefill rank's heads are "
                         "not one byte range of the block")
    return RankPlan(tuple(Source(r, j, k) for j, r in enumerate(group)), group)


def notify_targets(local_rank: int, local_tp: int, segments: list[str] | tuple[str, ...],
                   remote_tp: int) -> list[str]:
    """The prefill segments decode rank ``local_rank`` tells about a transfer it will not read
    (release / failure). ``remote_tp`` 0 means only the prefill's first segment is known (the
    concurrent hand-off before ``ready``): decode rank 0 alone tells it, once."""
    if remote_tp <= 0 or len(segments) != remote_tp:
        return list(segments[:1]) if local_rank == 0 else []
    if remote_tp == local_tp:
        return [segments[local_rank]]
    if remote_tp > local_tp and remote_tp % local_tp == 0:
        k = remote_tp // local_tp
        return list(segments[local_rank * k:local_rank * k + k])
    return list(segments[:1]) if local_rank == 0 else []


def rank_hostname(local_hostname: str, rank: int, p2p: bool, free_port: Callable[[], int]) -> str:
    """The Transfer Engine ``local_hostname`` of TP rank ``rank``: segment names must be unique per
    rank. With P2PHANDSHAKE every engine names itself after the port it binds (unique already).
    With a metadata service the segment is named ``local_hostname`` itself, so rank r > 0 takes
    ``host:port+r`` when a port is given, else ``host:<a free port>``."""
    if p2p or rank == 0:
        return local_hostname
    host, sep, port = local_hostname.rpartition(":")
    if sep and host and port.isdigit() and int(port) > 0 and (":" not in host or host.startswith("[")):
        return f"{host}:{int(port) + rank}"
    return f"{local_hostname}:{free_port()}"
