"""The decode side of a ``MooncakeCoreConnector`` worker: pull a request's KV blocks from a prefill.

A request the scheduler hands over (``RecvReq``) is read at once when its params name the
prefill's blocks (the first read from a prefill host waits one notification round trip for that
host's clock offset, ``peer_clock.PeerClocks``: the lease is judged on this host's clock); in
the concurrent hand-off it first waits for the prefill's ``ready`` (asked for with ``want``,
asked again every ``want_retry_s``, given up after ``prefill_wait_s``). Reads
go through the Transfer Engine, block granular with contiguous runs merged, one batch per
prefill rank read from (``tp.rank_plan``); small ones inside the step, larger ones
asynchronously. Every ending -- read, failed, aborted, not started -- is reported to vLLM once
and confirmed to the prefill so it frees its blocks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
from vllm.logger import init_logger

from mooncake_connectors.vllm import stats as S
from mooncake_connectors.vllm.kv_groups import GroupLayout, group_plan
from mooncake_connectors.vllm.layout import Slab, coalesce, pair_blocks, plan, remote_slabs_from_regions
from mooncake_connectors.vllm.p2p_config import LEASE_MARGIN_S, P2PConfig
from mooncake_connectors.vllm.p2p_messages import RecvReq, remote_shard
from mooncake_connectors.vllm.p2p_notifier import Notifier
from mooncake_connectors.vllm.peer_clock import LeaseExpired, PeerClocks
from mooncake_connectors.vllm.tp import KVShard, RankPlan, rank_plan, readers
from mooncake_core.engine import TransferEngine
from mooncake_core.pd.notify import ClockAnswer, Confirmation, Kind, NotifyError, Ready, Want
from mooncake_core.pd.params import ParamsError, PendingPrefill, RemotePrefill

logger = init_logger("vllm.mooncake_core.p2p_connector")


@dataclass
class Pull:
    """One request's reads: one Transfer Engine batch per prefill rank read from (0: done in step)."""

    req: RecvReq
    batch_ids: list[int]
    nbytes: int
    nblocks: int
    started: float
    notify: list[str]  # prefill segments to confirm to
    readers: int = 1  # decode ranks confirming to each of them (tp.RankPlan.readers)
    codes: dict[int, int] = field(default_factory=dict)  # batch id -> final status

    def status(self, check: Any) -> int:
        """0 while any batch runs, then 1 if all completed, else the first failure's code."""
        for bid in self.batch_ids:
            if bid not in self.codes:
                code = check(bid)
                if code == 0:
                    return 0
                self.codes[bid] = code
        return next((c for c in self.codes.values() if c != 1), 1)


class Puller:
    """Decode-side state of one worker: requests waiting for ``ready``, reads in flight, endings
    to report."""

    def __init__(self, config: P2PConfig, te: TransferEngine, notifier: Notifier, segment: str,
                 stats: S.StatsRecorder):
        self._te = te
        self._notifier = notifier
        self._stats = stats
        self.segment = segment  # ours: where a prefill sends ``ready``
        self.tp_rank, self.tp_size = notifier.tp_rank, notifier.tp_size
        self.block_size = config.block_size
        self.sync_load_max_bytes = config.sync_load_max_bytes
        self.prefill_wait_s = config.prefill_wait_s
        self.want_retry_s = config.want_retry_s
        self._slabs: list[Slab] = []
        self._shard: Callable[[], KVShard] | None = None
        self._groups: GroupLayout | None = None  # hybrid models: the KV cache groups' layout
        self._remote: dict[str, list[Slab]] = {}  # "segment|engine id" -> the prefill's slabs
        self._remote_groups: dict[str, list[list[Slab]]] = {}  # hybrid: "segment|engine id|groups" -> per group
        self._pulls: list[Pull] = []
        self._read_now: list[Pull] = []  # finished synchronously this step (small reads)
        self._failed_now: list[RecvReq] = []
        self._load_errors: set[int] = set()
        #: concurrent hand-off: transfer id -> (req, deadline, when to ask again)
        self.waiting: dict[str, tuple[RecvReq, float, float]] = {}
        self._cancelled: set[str] = set()  # aborted while an async read runs
        self._cancelled_now: list[str] = []  # aborted before their read: report
        #: each prefill host's clock against ours (leases are stated on the prefill's)
        self._clocks = PeerClocks(config.clock_refresh_s, segment, notifier, self._read, self._fail)

    @property
    def clock(self) -> Callable[[], float]:
        """This host's wall clock, leases are checked on it (tests inject a skewed one)."""
        return self._clocks.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self._clocks.clock = clock

    def set_local(self, slabs: list[Slab], shard: Callable[[], KVShard], groups: GroupLayout | None = None) -> None:
        """This worker's registered KV slabs and its layout (known once vLLM registered the caches);
        ``groups`` for a hybrid model."""
        self._slabs = slabs
        self._shard = shard
        self._groups = groups

    def has_results(self) -> bool:
        """Endings this step's poll will report."""
        return bool(self._read_now or self._failed_now or self._cancelled_now)

    def pending(self) -> bool:
        """Reads in flight, ``ready`` or a clock answer awaited (a poll may sleep for them)."""
        return bool(self._pulls or self.waiting or self._clocks.waiting())

    # ---------------------------------------------------------------- from the scheduler
    def start(self, r: RecvReq) -> None:
        if r.pending is not None:
            self.ask(r)
        else:
            self.submit(r)

    def cancel(self, rid: str) -> None:
        """The request was aborted while loading; report it once no read can write its blocks."""
        for tid, (r, _deadline, _again) in list(self.waiting.items()):
            if r.request_id == rid:
                del self.waiting[tid]
                self._cancelled_now.append(rid)
                if r.pending is not None:
                    self._tell_pending(r.pending, "release")
                return
        parked = self._clocks.cancel(rid)
        if parked is not None and parked.remote is not None:  # waiting for the prefill's clock: nothing read
            self._cancelled_now.append(rid)
            self._notifier.release(parked.remote.segments, parked.remote.tp_size, parked.remote.transfer_id)
            return
        if any(p.req.request_id == rid for p in self._pulls):
            self._cancelled.add(rid)  # reported when the read ends
        # else: already reported received; the scheduler freed the blocks itself

    # ---------------------------------------------------------------- concurrent hand-off
    def ask(self, r: RecvReq) -> None:
        """Tell the prefill (still computing, usually) to send ``ready`` to us when done."""
        assert r.pending is not None
        pp = r.pending
        if self._notifier.send(pp.segment, pp.transfer_id, Want(self.segment), inline=True):
            mono = time.monotonic()
            self.waiting[pp.transfer_id] = (r, mono + self.prefill_wait_s, mono + self.want_retry_s)
        else:
            self._fail(r, "unreachable")  # prefill unreachable: recompute or fail per policy, now

    def _tell_pending(self, pp: PendingPrefill, kind: Kind) -> None:
        """Before ``ready`` only the prefill's rank 0 is known."""
        for seg in self._notifier.targets((pp.segment,), 0):
            self._notifier.send(seg, pp.transfer_id, Confirmation(kind))

    def on_ready(self, tid: str, ready: Ready | NotifyError) -> None:
        """The prefill finished: check what it sent (or its error) and start the read now."""
        entry = self.waiting.pop(tid, None)
        if entry is None:
            return  # cancelled or timed out meanwhile (the prefill's lease frees its blocks)
        r = entry[0]
        try:
            if isinstance(ready, NotifyError):
                raise ready
            rp = ready.remote
            need_blocks = -(-r.need_tokens // max(1, rp.block_size))
            if rp.transfer_id != tid or rp.segment != r.pending.segment:  # type: ignore[union-attr]
                raise ParamsError(f"ready for transfer {rp.transfer_id} from {rp.segment} does not match")
            if rp.block_size != self.block_size:
                raise ParamsError(f"prefill block size {rp.block_size} differs from this decode's {self.block_size}")
            rank_plan(self.tp_rank, self._local_shard(), remote_shard(rp))  # TPMismatch names the difference
            layout = self._groups.tag if self._groups is not None else ""
            if rp.kv_layout != layout:
                raise ParamsError(f"the prefill's KV cache groups ({rp.kv_layout or 'one group'}) differ from this "
                                  f"decode's ({layout or 'one group'})")
            if rp.num_tokens < r.need_tokens or len(rp.block_ids) < need_blocks:
                raise ParamsError(f"prefill computed {rp.num_tokens} tokens in {len(rp.block_ids)} blocks, the "
                                  f"decode needs {r.need_tokens}")
        except ValueError as e:  # ParamsError, TPMismatch, NotifyError
            logger.error("MooncakeCoreConnector: request %s: bad ready notification for transfer %s: %s",
                         r.request_id, tid, e)
            self._fail(r, "bad_ready")
            if r.pending is not None:
                self._tell_pending(r.pending, "failed")
            return
        self.submit(RecvReq(r.request_id, rp, r.local_block_ids, r.local_hit_blocks,
                            local_group_block_ids=r.local_group_block_ids))

    def on_clock(self, answer: ClockAnswer) -> None:
        """A prefill answered our clock query: its reads waiting for the offset start now."""
        self._clocks.on_answer(answer)

    def retry_waiting(self, mono: float) -> None:
        """Give up on a ``ready`` not come within ``prefill_wait_s``; ask again after ``want_retry_s``.
        Reads waiting for a clock answer that did not come start with the prefill's clock taken as ours."""
        self._clocks.tick(mono)
        for tid, (r, deadline, again) in list(self.waiting.items()):
            if mono > deadline:
                del self.waiting[tid]
                logger.error("MooncakeCoreConnector: request %s: no ready from prefill %s for transfer %s within "
                             "prefill_wait_s=%.0f", r.request_id, r.pending.segment if r.pending else "?", tid,
                             self.prefill_wait_s)
                self._fail(r, "no_ready")
            elif mono > again and r.pending is not None:
                # no ready yet: the prefill still computes, or its ready was lost -- ask again
                # (background: the prefill may be the one that is unreachable now)
                self.waiting[tid] = (r, deadline, mono + self.want_retry_s)
                logger.info("MooncakeCoreConnector: request %s: no ready from prefill %s for transfer %s yet; "
                            "asking again", r.request_id, r.pending.segment, tid)
                self._notifier.send(r.pending.segment, tid, Want(self.segment))

    # ---------------------------------------------------------------- reads
    def _local_shard(self) -> KVShard:
        if self._shard is None:
            raise RuntimeError("MooncakeCoreConnector: a KV load before register_kv_caches")
        return self._shard()

    def _remote_slabs(self, rp: RemotePrefill, segment: str) -> list[Slab]:
        # keyed by engine id too: a prefill restarted on the same port has a new layout
        key = f"{segment}|{rp.engine_id}"
        cached = self._remote.get(key)
        if cached is None:
            regions = [(a, n) for a, n, _loc in self._te.get_segment_buffers(segment)]
            cached = remote_slabs_from_regions(regions, rp.block_bytes, rp.num_slabs, segment)
            self._remote[key] = cached
            logger.info("MooncakeCoreConnector worker: peer %s reached over %s", segment,
                        self._te.transport_for(segment))
        return cached

    def submit(self, r: RecvReq) -> None:
        """Read ``r``'s blocks once its prefill host's clock offset is known."""
        self._clocks.submit(r)

    def _read(self, r: RecvReq) -> None:
        rp = r.remote
        assert rp is not None
        rplan: RankPlan | None = None
        try:
            left = self._clocks.lease_end(rp) - self.clock()
            if left < LEASE_MARGIN_S:
                raise LeaseExpired(f"prefill lease on transfer {rp.transfer_id} ends in {left:.1f} s on our clock "
                                   f"(the prefill's clock offset taken out), too close to start the read")
            rplan = rank_plan(self.tp_rank, self._local_shard(), remote_shard(rp))
            reads = []  # (segment, local addrs, remote addrs, lengths) per prefill rank read from
            if self._groups is not None:
                nblocks, reads = self._group_reads(r, rp, rplan)
            else:
                pairs = pair_blocks(r.local_block_ids, rp.block_ids, r.local_hit_blocks)
                runs = coalesce(pairs)
                nblocks = len(pairs)
                for src in rplan.reads:
                    seg = rp.segments[src.rank]
                    reads.append((seg, *plan(self._slabs, self._remote_slabs(rp, seg), runs, src.part, src.parts,
                                             src.remote_part, src.remote_parts)))
            nbytes = sum(sum(ln) for _s, _la, _ra, ln in reads)
            notify = [rp.segments[k] for k in rplan.notify]
            if nbytes <= self.sync_load_max_bytes:
                # Small: read now, in this step. The request is then reported received by this same
                # step's get_finished, and the scheduler runs it in the next step. An asynchronous
                # read would finish on a Transfer Engine thread that must win the GIL from this
                # busy loop and be noticed by a later step's poll: milliseconds for ~0.3 ms of copying.
                started = time.monotonic()
                for seg, la, ra, ln in reads:
                    if self._te.batch_transfer_sync_read(seg, la, ra, ln) != 0:
                        self._forget(seg, rp.engine_id)
                        raise RuntimeError(f"read from {seg} failed: {self._te.last_error}")
                self._read_now.append(Pull(r, [], nbytes, nblocks, started, notify, rplan.readers))
                return
            pull = Pull(r, [], nbytes, nblocks, time.monotonic(), notify, rplan.readers)
            for seg, la, ra, ln in reads:
                bid = self._te.batch_transfer_async_read(seg, la, ra, ln)
                if bid <= 0:
                    self._forget(seg, rp.engine_id)
                    if pull.batch_ids:  # reads already running may still write the blocks: report at their end
                        pull.codes[-1] = -1
                        break
                    raise RuntimeError(f"Transfer Engine refused the read from {seg}: {self._te.last_error}")
                pull.batch_ids.append(bid)
            self._pulls.append(pull)
        except Exception as e:
            logger.error("MooncakeCoreConnector: KV pull for request %s (transfer %s from %s) failed to start: %s",
                         r.request_id, rp.transfer_id, ",".join(rp.segments), e)
            self._fail(r, "lease" if isinstance(e, LeaseExpired) else "start")
            targets = ([rp.segments[k] for k in rplan.notify] if rplan is not None
                       else self._notifier.targets(rp.segments, rp.tp_size))
            for seg in targets:  # best effort: lets a live prefill free early
                self._notifier.confirm(seg, rp.transfer_id, "failed", readers(self.tp_size, rp.tp_size))

    def _group_reads(self, r: RecvReq, rp: RemotePrefill,
                     rplan: RankPlan) -> tuple[int, list[tuple[str, list[int], list[int], list[int]]]]:
        """A hybrid model's reads: each KV cache group's blocks in that group's layers, whole
        blocks from the prefill rank of the same number (equal TP sizes only)."""
        assert self._groups is not None
        if r.local_group_block_ids is None or not rp.group_block_ids:
            raise ParamsError(f"transfer {rp.transfer_id}: a hybrid model's hand-off needs block ids per KV cache "
                              f"group on both sides (the prefill sent {len(rp.group_block_ids)} groups)")
        reads = []
        nblocks = 0
        for src in rplan.reads:
            if src.parts != 1 or src.remote_parts != 1:
                raise ParamsError(f"transfer {rp.transfer_id}: a hybrid model's KV moves between equal TP sizes "
                                  f"only (prefill TP {rp.tp_size}, decode TP {self.tp_size})")
            seg = rp.segments[src.rank]
            la, ra, ln, nblocks = group_plan(self._groups.specs, self._groups.local_slabs(),
                                             self._remote_group_slabs(rp, seg), r.local_group_block_ids,
                                             [list(g) for g in rp.group_block_ids], r.local_hit_blocks)
            reads.append((seg, la, ra, ln))
        return nblocks, reads

    def _forget(self, segment: str, engine_id: str) -> None:
        """Drop what we cached of a prefill whose read failed (it may have restarted)."""
        self._remote.pop(f"{segment}|{engine_id}", None)
        self._remote_groups.pop(f"{segment}|{engine_id}|groups", None)

    def _remote_group_slabs(self, rp: RemotePrefill, segment: str) -> list[list[Slab]]:
        assert self._groups is not None
        key = f"{segment}|{rp.engine_id}|groups"
        cached = self._remote_groups.get(key)
        if cached is None:
            regions = [(a, n) for a, n, _loc in self._te.get_segment_buffers(segment)]
            cached = self._groups.remote_slabs(regions, segment)
            self._remote_groups[key] = cached
        return cached

    def _fail(self, r: RecvReq, reason: str) -> None:
        """``r``'s KV will not arrive (the next poll reports it failed); ``reason`` is one of
        ``stats.P2P_FAILURES``."""
        self._stats.add(S.failure(reason))
        self._failed_now.append(r)

    # ---------------------------------------------------------------- endings
    def collect(self, res: KVConnectorTransferResults) -> None:
        """Report this step's endings into ``res`` and confirm them to the prefills."""
        res.finished_recving.update(self._cancelled_now)
        self._cancelled_now = []
        still: list[Pull] = []
        done = [(p, 1) for p in self._read_now]
        self._read_now = []
        for p in self._pulls:
            code = p.status(self._te.transfer_check_status)
            if code == 0:
                still.append(p)
            else:
                done.append((p, code))
        for p, code in done:
            self._end(p, code, res)
        self._pulls = still
        for r in self._failed_now:
            res.finished_recving.add(r.request_id)
            res.failed_recving.add(r.request_id)
            self._load_errors.update(r.local_block_ids)
        self._failed_now = []

    def _end(self, p: Pull, code: int, res: KVConnectorTransferResults) -> None:
        rp = p.req.remote
        assert rp is not None
        if p.req.request_id in self._cancelled:  # aborted meanwhile: only free its blocks
            self._cancelled.discard(p.req.request_id)
            res.finished_recving.add(p.req.request_id)
            for seg in p.notify:
                self._notifier.confirm(seg, rp.transfer_id, "release", p.readers)
            return
        if code == 1 and self.clock() < self._clocks.lease_end(rp):
            pulled_ms = (time.monotonic() - p.started) * 1e3
            t_n = time.monotonic()
            for seg in p.notify:
                self._notifier.confirm(seg, rp.transfer_id, "done", p.readers, inline=True)
            self._stats.add(S.PULLED_BYTES, p.nbytes)
            self._stats.add(S.PULLED_BLOCKS, p.nblocks)
            self._stats.observe(S.PULL_SECONDS, pulled_ms / 1e3)
            logger.info("MooncakeCoreConnector: kv pulled request=%s transfer=%s blocks=%d bytes=%d ms=%.1f "
                        "notify_ms=%.1f", p.req.request_id, rp.transfer_id, p.nblocks, p.nbytes, pulled_ms,
                        (time.monotonic() - t_n) * 1e3)
            res.finished_recving.add(p.req.request_id)
            return
        why = "lease expired during the read" if code == 1 else f"transfer status {code}"
        logger.error("MooncakeCoreConnector: KV pull for request %s (transfer %s from %s) failed: %s",
                     p.req.request_id, rp.transfer_id, ",".join(p.notify), why)
        for seg in p.notify:
            self._forget(seg, rp.engine_id)
            self._notifier.confirm(seg, rp.transfer_id, "failed", p.readers)
        self._fail(p.req, "read" if code != 1 else "lease")

    def take_load_errors(self) -> set[int]:
        out, self._load_errors = self._load_errors, set()
        return out
