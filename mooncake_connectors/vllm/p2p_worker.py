"""The worker side of ``MooncakeCoreConnector``: one per TP rank, in vLLM's worker process.

It owns the Transfer Engine and this rank's registered KV slabs, and composes three parts:
the decode-side ``Puller`` (reads a request's blocks from a prefill), the prefill-side
``Sender`` (holds a finished request's blocks until the decode confirmed or the lease ran out)
and the ``Notifier`` both use to talk to peer workers. Each step it routes the scheduler's
``MooncakeConnectorMetadata`` to them (``start_load``) and, in ``poll``, the notifications that
arrived (decoded by ``mooncake_core.pd.notify``), then collects what finished.
"""

from __future__ import annotations

import socket
import time
from typing import Callable

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
from vllm.logger import init_logger

from mooncake_connectors.vllm import stats as S
from mooncake_connectors.vllm.idle import idle_wait_s
from mooncake_connectors.vllm.kv_groups import GroupLayout
from mooncake_connectors.vllm.layout import Slab, heads_outer, slabs_of
from mooncake_connectors.vllm.p2p_config import P2PConfig
from mooncake_connectors.vllm.p2p_messages import MooncakeConnectorMetadata, MooncakeHandshake
from mooncake_connectors.vllm.p2p_notifier import Notifier
from mooncake_connectors.vllm.p2p_puller import Puller
from mooncake_connectors.vllm.p2p_sender import Sender
from mooncake_connectors.vllm.tp import KVShard, rank_hostname
from mooncake_core.engine import TransferEngine
from mooncake_core.pd import notify
from mooncake_core.pd.notify import CLOCK_NAME, ClockAnswer, ClockQuery, NotifyError, Ready, Want

logger = init_logger("vllm.mooncake_core.p2p_connector")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class P2PWorker:
    """Worker-side state: the Transfer Engine, registered KV slabs, and the puller, sender and
    notifier built on them."""

    def __init__(self, config: P2PConfig, tp_rank: int, kv_heads: int, num_blocks: int | None):
        self.config = config
        self.engine_id = config.engine_id
        self.num_blocks = num_blocks
        self.groups: GroupLayout | None = None  # hybrid models: the KV cache groups' layout
        self.te = TransferEngine()
        self.tp_size = config.tp_size
        self.tp_rank = tp_rank
        self.kv_heads = kv_heads  # KV heads on this rank
        self._heads_outer = True
        meta = config.metadata_server
        host = rank_hostname(config.local_hostname, self.tp_rank, config.p2p_handshake, _free_port)
        rc = self.te.initialize(host, meta, config.protocol, config.device_name)
        if rc != 0:
            raise RuntimeError(f"MooncakeCoreConnector: Transfer Engine initialize({host!r}, {meta!r}, "
                               f"{config.protocol!r}, {config.device_name!r}) failed: {self.te.last_error}")
        self.segment = self.te.get_local_segment_name()
        self.slabs: list[Slab] = []
        self.idle_wait_ms = config.idle_wait_ms
        self._idle_step = False  # this step schedules no tokens (MooncakeConnectorMetadata.idle)
        self._events_seen = 0  # te.notify_events() when the last poll drained the notifications
        self.stats = S.StatsRecorder()  # bytes, latency, failures: vLLM's stats hook collects them
        self.notifier = Notifier(self.te, self.tp_rank, self.tp_size)
        self.puller = Puller(config, self.te, self.notifier, self.segment, self.stats)
        self.sender = Sender(config.lease_s, self.notifier, self.stats)
        #: this host's wall clock: leases are stated (prefill) and checked (decode) on it
        self.clock: Callable[[], float] = time.time
        logger.info("MooncakeCoreConnector worker: Transfer Engine segment %s (metadata %s, TP rank %d of %d)",
                    self.segment, meta, self.tp_rank, self.tp_size)

    # ---------------------------------------------------------------- setup
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if self.config.hybrid:
            self._register_groups(kv_caches)
            return
        slabs: list[Slab] = []
        where: dict[int, str] = {}  # slab base -> location: GPU KV caches (kv_buffer_device "cuda") are cuda:N
        for name, t in kv_caches.items():
            nb = self.num_blocks or t.shape[0]
            layer = slabs_of(t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.element_size(), nb)
            loc = f"cuda:{t.device.index or 0}" if t.device.type == "cuda" else "cpu:0"
            where.update((s.base, loc) for s in layer)
            self._heads_outer &= heads_outer(tuple(t.shape), nb, self.kv_heads)
            for s in layer:
                if s.stride != s.block_bytes:
                    raise ValueError(f"layer {name}: KV blocks are not packed (stride {s.stride} != block "
                                     f"{s.block_bytes} bytes); unsupported layout")
            slabs.extend(layer)
        if len({s.block_bytes for s in slabs}) != 1:
            raise ValueError("MooncakeCoreConnector: layers have different block sizes in bytes; unsupported")
        for s in slabs:
            if self.te.register_memory(s.base, s.nbytes, where[s.base]) != 0:
                raise RuntimeError(f"MooncakeCoreConnector: register_memory({s.base:#x}, {s.nbytes}) failed: "
                                   f"{self.te.last_error}")
        self.slabs = slabs
        self.puller.set_local(slabs, self.shard)
        logger.info("MooncakeCoreConnector worker: registered %d KV slabs of %d blocks x %d bytes (%s)",
                    len(slabs), slabs[0].num_blocks, slabs[0].block_bytes, self.segment)

    def _register_groups(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Hybrid models: the groups' layers overlay shared buffers (``kv_groups.py``); register
        each buffer once and plan per group. A Mamba layer comes as a raw byte view whose block
        stride (the page) exceeds its state: its slabs are strided, moved a block at a time."""
        group_of = dict(self.config.group_of_layer)
        layers: list[tuple[int, list[Slab]]] = []
        where: dict[int, str] = {}
        for name, t in kv_caches.items():
            if name not in group_of:
                continue  # a layer of a group that takes no part in transfers
            nb = self.num_blocks or t.shape[0]
            layer = slabs_of(t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.element_size(), nb)
            loc = f"cuda:{t.device.index or 0}" if t.device.type == "cuda" else "cpu:0"
            where.update((s.base, loc) for s in layer)
            layers.append((group_of[name], layer))
        self.groups = GroupLayout.build(self.config.groups, layers)
        for base, nbytes in self.groups.regions:
            loc = next((w for b, w in where.items() if base <= b < base + nbytes), "cpu:0")
            if self.te.register_memory(base, nbytes, loc) != 0:
                raise RuntimeError(f"MooncakeCoreConnector: register_memory({base:#x}, {nbytes}) failed: "
                                   f"{self.te.last_error}")
        self.slabs = [s for group in self.groups.local_slabs() for s in group]
        self._heads_outer = False  # heads are not sliced across TP sizes for a hybrid model
        self.puller.set_local(self.slabs, self.shard, self.groups)
        logger.info("MooncakeCoreConnector worker: hybrid KV cache groups %s: %d layer slabs over %d registered "
                    "buffers of %d blocks (%s)", self.groups.tag, len(self.slabs), len(self.groups.regions),
                    self.groups.num_blocks, self.segment)

    def handshake(self) -> MooncakeHandshake:
        if not self.slabs:
            raise RuntimeError("MooncakeCoreConnector: handshake requested before register_kv_caches")
        shard = self.shard()
        return MooncakeHandshake(segment=self.segment, block_bytes=shard.block_bytes,
                                 num_slabs=shard.num_slabs, tp_rank=self.tp_rank, tp_size=self.tp_size,
                                 kv_heads=self.kv_heads, heads_outer=self._heads_outer,
                                 kv_layout=self.groups.tag if self.groups is not None else "")

    def shard(self) -> KVShard:
        if self.groups is not None:  # hybrid: equal TP only (p2p_scheduler refuses others)
            return KVShard(self.tp_size, self.groups.page_bytes, len(self.slabs), self.kv_heads, False)
        return KVShard(self.tp_size, self.slabs[0].block_bytes, len(self.slabs), self.kv_heads, self._heads_outer)

    def set_clock(self, clock: Callable[[], float]) -> None:
        """Use ``clock`` as this host's wall clock (tests: a host whose clock is off)."""
        self.clock = self.sender.clock = self.puller.clock = clock

    # ---------------------------------------------------------------- each step
    def start_load(self, meta: MooncakeConnectorMetadata) -> None:
        """Route the scheduler's step metadata: aborts and releases, hand-offs to hold, loads to start."""
        self._idle_step = meta.idle
        for rid in meta.cancels:
            self.puller.cancel(rid)
        for segs, remote_tp, tid in meta.releases:
            self.notifier.release(segs, remote_tp, tid)
        for rid, sr in meta.reqs_to_send.items():
            self.sender.hold(rid, sr)
        for r in meta.reqs_to_recv:
            self.puller.start(r)

    def _drain_notifies(self, now: float) -> None:
        for n in self.te.get_notifies():
            try:
                msg = notify.decode(n.msg)
            except NotifyError as e:
                if e.kind == "ready":  # a bad ready fails the decode waiting for it
                    self.puller.on_ready(n.name, e)
                elif e.kind == "clock=":  # the query goes unanswered: the prefill's clock is taken as ours
                    logger.warning("MooncakeCoreConnector: bad clock answer %r: %s", n.msg[:80], e)
                else:
                    logger.warning("MooncakeCoreConnector: ignoring notification %r for transfer %s: %s",
                                   n.msg[:40], n.name, e)
                continue
            if isinstance(msg, Ready):
                self.puller.on_ready(n.name, msg)
            elif isinstance(msg, Want):
                self.sender.on_want(n.name, msg, now)
            elif isinstance(msg, ClockQuery):  # prefill: our wall clock, stamped now
                self.notifier.send(msg.segment, CLOCK_NAME, ClockAnswer(self.segment, self.clock()), inline=True)
            elif isinstance(msg, ClockAnswer):
                self.puller.on_clock(msg)
            else:
                self.sender.on_confirmation(n.name, msg, now)

    def poll(self) -> KVConnectorTransferResults:
        res = KVConnectorTransferResults()
        results = self.puller.has_results() or self.sender.has_results()
        pending = self.puller.pending() or self.sender.pending()
        wait = idle_wait_s(self._idle_step, results, pending, self.idle_wait_ms)
        self._idle_step = False  # once per step (a step without metadata must not sleep)
        if wait:
            self.te.wait_notifies(self._events_seen, wait)
        self._events_seen = self.te.notify_events()  # taken before draining: no event is missed
        now = self.clock()
        self._drain_notifies(now)  # first: a ``ready`` starts its read in this very poll
        self.puller.retry_waiting(time.monotonic())
        self.puller.collect(res)
        self.sender.collect(res, now)  # lease expiries
        return res

    def take_load_errors(self) -> set[int]:
        return self.puller.take_load_errors()

    def shutdown(self) -> None:
        self.notifier.shutdown()
        try:
            self.te.close()
        except Exception:
            pass
