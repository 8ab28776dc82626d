"""Decode side of ``MooncakeCoreConnector``: the prefill hosts' clocks, so that a lease is judged
on this host's clock.

Why: a prefill states when it frees a request's blocks (``RemotePrefill.lease_expiry_unix``) on
its own wall clock; hosts' clocks differ by seconds, and a decode that compared that with its own
clock could read blocks already freed and reused (the prefill ahead) or refuse live ones (the
prefill behind). ``PeerClocks`` measures each prefill host's offset over one notification round
trip (``ClockQuery`` / ``ClockAnswer`` of ``mooncake_core.pd.notify``; ``leases.ClockOffsets``
holds the arithmetic), parks the reads of a host it has not measured yet until the answer comes,
measures again in the background once the offset is ``refresh_s`` old, and gives the lease end on
this host's clock. A prefill that does not answer in ``CLOCK_ANSWER_S`` (an older version) has its
clock taken as ours: the check is then the wall-clock comparison it was before.

The decode's ``p2p_puller.Puller`` owns one; it sends through the worker's ``Notifier`` and hands
reads back through the ``start`` / ``fail`` callbacks.
"""

from __future__ import annotations

import time
from typing import Callable

from vllm.logger import init_logger

from mooncake_connectors.vllm.leases import ClockOffsets
from mooncake_connectors.vllm.p2p_messages import RecvReq
from mooncake_connectors.vllm.p2p_notifier import Notifier
from mooncake_core.pd.notify import CLOCK_NAME, ClockAnswer, ClockQuery
from mooncake_core.pd.params import RemotePrefill

logger = init_logger("vllm.mooncake_core.p2p_connector")

#: The scheduler, which has no offsets, refuses only params stale beyond any plausible skew (the
#: worker checks precisely).
MAX_CLOCK_SKEW_S = 300.0
#: A prefill that does not answer a clock query in this long has its clock taken as ours.
CLOCK_ANSWER_S = 2.0


class LeaseExpired(RuntimeError):
    """The prefill's lease (on the decode's clock, skew taken out) ends before a read could finish."""


class PeerClocks:
    """The prefill hosts' clock offsets and the reads waiting for one."""

    def __init__(self, refresh_s: float, own_segment: str, notifier: Notifier, start: Callable[[RecvReq], None],
                 fail: Callable[[RecvReq, str], None]) -> None:
        self.offsets = ClockOffsets(refresh_s)
        self.own_segment = own_segment
        #: this host's wall clock (tests inject a skewed one)
        self.clock: Callable[[], float] = time.time
        self._notifier, self._start, self._fail = notifier, start, fail
        self._parked: dict[str, list[RecvReq]] = {}  # prefill segment -> reads waiting for its offset
        self._asked: dict[str, tuple[float, float, float]] = {}  # segment -> (sent wall, sent mono, give up)

    def waiting(self) -> bool:
        """Reads parked until a prefill answers (a poll may sleep for the answer)."""
        return bool(self._parked)

    def submit(self, r: RecvReq) -> None:
        """Start ``r``'s read once its prefill host's clock offset is known (a stale one is used at
        once and measured again; none at all parks the read for one round trip)."""
        assert r.remote is not None
        seg = r.remote.segments[0]
        if self.offsets.offset(seg) is not None:
            if not self.offsets.fresh(seg, time.monotonic()):
                self._ask(seg, inline=False)
            self._start(r)
            return
        self._parked.setdefault(seg, []).append(r)
        self._ask(seg, inline=True)

    def _ask(self, seg: str, inline: bool) -> None:
        """Send ``seg`` a clock query. ``inline`` (reads are parked for the answer) sends from
        the step's thread: one round trip, and an unreachable prefill fails them at once. A
        refresh goes in the background: the read it came with starts now on the offset known, and
        a prefill host slow to answer (a busy box) must not hold up the engine's step -- with it
        every request this instance runs."""
        if seg in self._asked:
            return
        mono = time.monotonic()
        self._asked[seg] = (self.clock(), mono, mono + CLOCK_ANSWER_S)
        if not self._notifier.send(seg, CLOCK_NAME, ClockQuery(self.own_segment), inline=inline):
            self._asked.pop(seg, None)
            for r in self._parked.pop(seg, []):
                self._fail(r, "unreachable")

    def on_answer(self, answer: ClockAnswer) -> None:
        """A prefill's ``clock=``: take the sample, start the reads that waited for it."""
        asked = self._asked.pop(answer.segment, None)
        if asked is None:
            return  # answered after we gave up on it, or never asked
        offset, err = self.offsets.sample(answer.segment, asked[0], asked[1], answer.wall, self.clock(),
                                          time.monotonic())
        logger.info("MooncakeCoreConnector: clock of prefill %s is %+.3f s from ours (+-%.3f s); its lease "
                    "expiries are checked with that taken out", answer.segment, offset, err)
        for r in self._parked.pop(answer.segment, []):
            self._start(r)

    def tick(self, mono: float) -> None:
        """Give up on unanswered queries: an unmeasured host's clock is taken as ours."""
        for seg, (_w, _m, give_up) in list(self._asked.items()):
            if mono > give_up:
                del self._asked[seg]
                if self.offsets.offset(seg) is None:
                    logger.warning("MooncakeCoreConnector: prefill %s does not answer clock queries (an older "
                                   "version?); its lease expiries are taken on our clock", seg)
                    self.offsets.assume(seg, mono)
                for r in self._parked.pop(seg, []):
                    self._start(r)

    def cancel(self, request_id: str) -> RecvReq | None:
        """Take a parked read out (its request was aborted); None when it is not parked here."""
        for parked in self._parked.values():
            for r in parked:
                if r.request_id == request_id:
                    parked.remove(r)
                    return r
        return None

    def lease_end(self, rp: RemotePrefill) -> float:
        """When the prefill frees the blocks, on our wall clock (its clock's offset taken out)."""
        return self.offsets.deadline(rp.segments[0], rp.lease_expiry_unix)
