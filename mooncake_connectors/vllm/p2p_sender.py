"""The prefill side of a ``MooncakeCoreConnector`` worker: hold a finished request's blocks for a decode.

Pull model: the prefill writes nothing; it keeps the blocks until every decode rank reading
them confirmed (``done``/``failed``/``release``) or the lease ran out (``leases.SendTracker``),
then reports the request in ``finished_sending`` so vLLM frees them. In the concurrent hand-off
it also answers a decode's ``want`` with ``ready`` -- whichever of the two comes second
triggers it (``leases.Rendezvous``).
"""

from __future__ import annotations

import time
from typing import Callable

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
from vllm.logger import init_logger

from mooncake_connectors.vllm import stats as S
from mooncake_connectors.vllm.leases import Rendezvous, SendTracker
from mooncake_connectors.vllm.p2p_messages import SendReq
from mooncake_connectors.vllm.p2p_notifier import Notifier
from mooncake_core.pd import notify
from mooncake_core.pd.notify import Confirmation, Ready, Want
from mooncake_core.pd.params import RemotePrefill

logger = init_logger("vllm.mooncake_core.p2p_connector")


class Sender:
    """Prefill-side state of one worker: held requests, the concurrent hand-off's rendezvous, and
    the requests whose blocks may be freed."""

    def __init__(self, lease_s: float, notifier: Notifier, stats: S.StatsRecorder):
        self.lease_s = lease_s
        self._notifier = notifier
        self._stats = stats
        self._sends = SendTracker()
        self._rdv: Rendezvous[RemotePrefill] = Rendezvous()  # wants <-> finished requests
        self._done: set[str] = set()  # requests whose blocks may be freed (next poll reports them)
        self._held_since: dict[str, float] = {}
        #: this host's wall clock: lease expiries are stated on it (tests inject a skewed one)
        self.clock: Callable[[], float] = time.time

    def has_results(self) -> bool:
        return bool(self._done)

    def pending(self) -> bool:
        """Requests held for a decode (a poll may sleep waiting for their confirmations)."""
        return bool(self._sends.held())

    def hold(self, rid: str, sr: SendReq) -> None:
        """The scheduler handed request ``rid`` off: hold its blocks (and offer ``ready``)."""
        self._held_since[rid] = time.monotonic()
        if self._sends.hold(rid, sr.transfer_id, sr.expiry, self.clock()):
            self._done.add(rid)  # (under TP a decode rank may have confirmed before this rank held)
        if sr.ready is not None:
            for pair in self._rdv.offer(sr.transfer_id, sr.ready, sr.expiry):
                self.send_ready(pair)

    def send_ready(self, pair: tuple[str, RemotePrefill] | None, inline: bool = True) -> None:
        """The finished request's params to the decode that asked (one quick round trip)."""
        if pair is not None:
            seg, rp = pair
            self._notifier.send(seg, rp.transfer_id, Ready(rp), inline=inline)

    def on_want(self, tid: str, want: Want, now: float) -> None:
        # a repeat (the first ready was lost: the decode may be unreachable) goes in the
        # background, so a peer that does not answer cannot stall this engine's steps
        again = self._rdv.answered(tid, want.segment)
        self.send_ready(self._rdv.want(tid, want.segment, now + self.lease_s), inline=not again)

    def on_confirmation(self, tid: str, conf: Confirmation, now: float) -> None:
        # the rendezvous keeps its offer until the lease ends: a sibling decode rank may ask later
        rid = self._sends.confirm(tid, now, conf.sender, conf.readers)
        if rid is None:
            return
        self._done.add(rid)
        t = self._held_since.get(rid)
        if t is not None:
            self._stats.observe(S.HOLD_SECONDS, time.monotonic() - t)
        logger.info("MooncakeCoreConnector: kv released request=%s transfer=%s (%s) held_ms=%.1f", rid, tid,
                    notify.encode(conf),
                    (time.monotonic() - t) * 1e3 if t is not None else -1.0)

    def collect(self, res: KVConnectorTransferResults, now: float) -> None:
        """Report the requests whose blocks may be freed: confirmed, or their lease ran out."""
        self._rdv.expire(now)
        expired = self._sends.expire(now)
        if expired:
            logger.warning("MooncakeCoreConnector: lease expired without a decode confirmation, freeing blocks "
                           "of %d request(s): %s", len(expired), sorted(expired)[:8])
        self._stats.add(S.LEASES_EXPIRED, len(expired))
        self._done.update(expired)
        for rid in self._done:
            self._held_since.pop(rid, None)
        res.finished_sending, self._done = self._done, set()
