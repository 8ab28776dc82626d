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
* decode TP = k x prefill TP (e.g. prefill 1 -> decode 2): decode rank r holds a 1/k share of
  prefill rank ``r // k``'s heads and reads only that slice of each of its blocks: slice
  ``(r % k) * parts // k`` of the ``parts`` equal head slices of the prefill's block (``parts =
  k`` when the heads split evenly; fewer when the decode replicates heads, i.e. has more ranks
  than KV heads). That needs the *prefill's* blocks to be head-outer (then a head slice of a
  block is one contiguous byte range, and the slices of consecutive blocks are ``block_bytes``
  apart: one descriptor per block in one batch). The k decode ranks all confirm to prefill rank
  ``r // k``, which frees the blocks once it has heard from all k (``readers``; the count travels
  in the confirmation, as NixlConnector's ``"<request id>:<consumers>"`` notification does);
* TPs neither dividing the other (e.g. 2 -> 3): refused; the decode computes the prompt.

The same rank mapping as vLLM 0.32's NixlConnector (``tp_ratio``, ``compute_tp_mapping`` in
``nixl/tp_mapping.py``: source rank ``r * P // D``, head offset ``r % (D // P)``), on our layout.
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
    # (False for a prefill whose params do not say: an older one)


@dataclass(frozen=True)
class Source:
    """Read from prefill rank ``rank``: slice ``remote_part`` of ``remote_parts`` equal slices of each
    of its blocks into slice ``part`` of ``parts`` equal slices of each local block (both 1: whole
    blocks; the slices are always the same size)."""

    rank: int
    part: int = 0
    parts: int = 1
    remote_part: int = 0
    remote_parts: int = 1


@dataclass(frozen=True)
class RankPlan:
    """What one decode rank does: the reads, which prefill ranks to confirm to (free blocks), and
    how many decode ranks confirm to each of those (the prefill frees after hearing from all)."""

    reads: tuple[Source, ...]
    notify: tuple[int, ...]
    readers: int = 1


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
    if remote.tp_size < local.tp_size:
        return _slice_of_remote(local_rank, local, remote)
    if remote.tp_size % local.tp_size:
        raise TPMismatch(f"decode TP {local.tp_size} cannot read from prefill TP {remote.tp_size}: one TP must "
                         "be a multiple of the other")
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


def _slice_of_remote(local_rank: int, local: KVShard, remote: KVShard) -> RankPlan:
    """Decode TP = k x prefill TP: this rank reads its heads' slice of prefill rank ``r // k``."""
    if local.tp_size % remote.tp_size:
        raise TPMismatch(f"decode TP {local.tp_size} cannot read from prefill TP {remote.tp_size}: one TP must "
                         "be a multiple of the other")
    k = local.tp_size // remote.tp_size
    src = local_rank // k
    if local.block_bytes <= 0 or remote.block_bytes % local.block_bytes:
        raise TPMismatch(f"prefill TP {remote.tp_size} blocks are {remote.block_bytes} bytes per slab, not a "
                         f"multiple of decode TP {local.tp_size}'s {local.block_bytes}-byte blocks")
    parts = remote.block_bytes // local.block_bytes  # head slices of a prefill block
    if k % parts:
        raise TPMismatch(f"prefill TP {remote.tp_size} blocks hold {parts} decode blocks' worth of heads, which "
                         f"the {k} decode TP {local.tp_size} ranks reading each prefill rank cannot share evenly")
    if remote.kv_heads and local.kv_heads and remote.kv_heads != parts * local.kv_heads:
        raise TPMismatch(f"prefill TP {remote.tp_size} ranks hold {remote.kv_heads} KV heads each, decode TP "
                         f"{local.tp_size} ranks {local.kv_heads}: not {parts} disjoint head slices")
    if parts > 1 and not remote.heads_outer:
        raise TPMismatch(f"prefill TP {remote.tp_size}'s KV blocks are not known to be head-outer (NHD layout, "
                         f"or an older prefill): decode TP {local.tp_size} cannot read a head slice of them")
    part = (local_rank % k) * parts // k
    return RankPlan((Source(src, remote_part=part, remote_parts=parts),), (src,), readers=k)


def readers(local_tp: int, remote_tp: int) -> int:
    """How many decode ranks confirm each prefill rank's transfer (``RankPlan.readers``)."""
    if 0 < remote_tp < local_tp and local_tp % remote_tp == 0:
        return local_tp // remote_tp
    return 1


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
    if local_tp % remote_tp == 0:
        return [segments[local_rank // (local_tp // remote_tp)]]
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
