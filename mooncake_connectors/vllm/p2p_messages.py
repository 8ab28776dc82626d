"""The messages of ``MooncakeCoreConnector`` between its scheduler side (p2p_scheduler.py) and its
workers (p2p_worker.py).

Why apart: vLLM pickles them from the scheduler process to the workers every step (metadata) and
once from each worker to the scheduler (handshake); keeping them in a module of their own keeps
that contract in one place, next to nothing that runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorHandshakeMetadata, KVConnectorMetadata

from mooncake_core.pd.params import PendingPrefill, RemotePrefill
from mooncake_connectors.vllm.tp import KVShard


@dataclass
class MooncakeHandshake(KVConnectorHandshakeMetadata):
    """Worker -> scheduler, once at start: where this worker's KV lives (one per TP rank)."""

    segment: str
    block_bytes: int
    num_slabs: int
    tp_rank: int = 0
    tp_size: int = 1
    kv_heads: int = 0  # KV heads on this rank
    heads_outer: bool = True  # a block is [kv_heads, ...] (tp.KVShard)
    kv_layout: str = ""  # hybrid models: the KV cache groups' layout (kv_groups.GroupLayout.tag); "" otherwise

    def shard(self) -> KVShard:
        return KVShard(self.tp_size, self.block_bytes, self.num_slabs, self.kv_heads, self.heads_outer)


@dataclass
class RecvReq:
    """Decode: pull ``remote`` into ``local_block_ids`` (after ``local_hit_blocks`` cached blocks).

    With the concurrent hand-off ``remote`` is None until the prefill's ``ready`` notification
    names its blocks; ``pending`` says whom to ask and ``need_tokens`` how many prompt tokens
    the prefill must have computed for this decode."""

    request_id: str
    remote: RemotePrefill | None
    local_block_ids: list[int]
    local_hit_blocks: int
    pending: PendingPrefill | None = None
    need_tokens: int = 0
    #: hybrid models: the fresh local blocks of every KV cache group (``local_block_ids`` is then
    #: all of them, for load errors); None for one group
    local_group_block_ids: list[list[int]] | None = None


@dataclass
class SendReq:
    """Prefill: hold a finished request's blocks under ``transfer_id`` until ``expiry`` (unix).
    ``ready`` (concurrent hand-off only) is what the ``ready`` notification carries."""

    transfer_id: str
    expiry: float
    ready: RemotePrefill | None = None


@dataclass
class MooncakeConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> worker, every step."""

    reqs_to_recv: list[RecvReq] = field(default_factory=list)
    reqs_to_send: dict[str, SendReq] = field(default_factory=dict)
    # decode: (prefill segments, prefill TP (0: only rank 0's known), transfer id) whose blocks
    # it will not read (local hit / abort); each rank tells its own prefill ranks (tp.notify_targets)
    releases: list[tuple[tuple[str, ...], int, str]] = field(default_factory=list)
    # decode: requests aborted while their KV was loading (their blocks stay until reported)
    cancels: list[str] = field(default_factory=list)
    # the step schedules no tokens: it only polls the connector (idle.idle_wait_s)
    idle: bool = False


def remote_shard(rp: RemotePrefill) -> KVShard:
    """The prefill's per-rank KV layout its params describe (whether its blocks are head-outer
    matters only to a decode with more TP ranks, which reads head slices of them)."""
    return KVShard(rp.tp_size, rp.block_bytes, rp.num_slabs, rp.kv_heads, rp.heads_outer)
