"""Prefill-side bookkeeping of KV blocks held for a decode instance (pure logic, clock injected).

Why: a prefill keeps a finished request's blocks until the decode confirms it has read them.
If the decode dies, or the proxy never sends the decode request, the blocks must not leak
(vLLM #35943): each held request has a lease; when it expires the blocks are freed anyway.
Confirmations may arrive before the worker learns of the request (the scheduler tells the
worker one step later), so early confirmations are remembered for a while.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

#: What a prefill offers a decode in ``ready`` (the connector's ``RemotePrefill``).
Offer = TypeVar("Offer")


@dataclass
class SendTracker:
    """Maps transfer ids to vLLM request ids and decides when each request's blocks can be freed.

    Under tensor parallelism with more decode ranks than prefill ranks several decode ranks read
    one prefill rank's blocks; each confirmation names its sender and the number of readers, and
    the blocks are freed once every reader confirmed (a repeated confirmation counts once)."""

    early_ttl_s: float = 600.0
    _by_tid: dict[str, str] = field(default_factory=dict)  # transfer id -> request id
    _expiry: dict[str, float] = field(default_factory=dict)  # request id -> lease expiry (monotonic)
    _early: dict[str, float] = field(default_factory=dict)  # transfer id -> time confirmed before known
    _acks: dict[str, tuple[set[int], int, float]] = field(default_factory=dict)  # tid -> (senders, readers, since)
    expired_total: int = 0
    confirmed_total: int = 0

    def hold(self, request_id: str, transfer_id: str, expiry: float, now: float) -> bool:
        """Start holding; returns True if the decode already confirmed (free right away)."""
        if transfer_id in self._early:
            del self._early[transfer_id]
            self.confirmed_total += 1
            return True
        self._by_tid[transfer_id] = request_id
        self._expiry[request_id] = expiry
        return False

    def confirm(self, transfer_id: str, now: float, sender: int = 0, readers: int = 1) -> str | None:
        """Decode rank ``sender`` of ``readers`` confirmed reading ``transfer_id``; returns the request
        id to free once all ``readers`` have, if the request is known."""
        if readers > 1:
            senders, need, since = self._acks.get(transfer_id, (set(), readers, now))
            senders.add(sender)
            if len(senders) < max(need, readers):
                self._acks[transfer_id] = (senders, max(need, readers), since)
                return None
        self._acks.pop(transfer_id, None)
        rid = self._by_tid.pop(transfer_id, None)
        if rid is None:
            self._early[transfer_id] = now
            return None
        if self._expiry.pop(rid, None) is None:
            return None
        self.confirmed_total += 1
        return rid

    def expire(self, now: float) -> list[str]:
        """Request ids whose lease ran out (freed without confirmation); also forgets stale early ones."""
        out = [rid for rid, t in self._expiry.items() if t <= now]
        if out:
            gone = set(out)
            for rid in out:
                del self._expiry[rid]
            for t in [t for t, r in self._by_tid.items() if r in gone]:
                del self._by_tid[t]
                self._acks.pop(t, None)
            self.expired_total += len(out)
        for tid in [t for t, at in self._early.items() if now - at > self.early_ttl_s]:
            del self._early[tid]
        for tid in [t for t, a in self._acks.items() if t not in self._by_tid and now - a[2] > self.early_ttl_s]:
            del self._acks[tid]
        return out

    def held(self) -> int:
        return len(self._expiry)


@dataclass
class Rendezvous(Generic[Offer]):
    """Prefill side of the concurrent hand-off: pairs a decode's ``want`` with the finished request.

    Either may come first: the decode usually asks while the prefill still computes (its
    request was sent at the same time), but a slow decode asks after the prefill has finished.
    When both are known, ``want``/``offer`` return ``(decode segment, params)`` to send in a
    ``ready`` notification, for every ``want`` once the offer is known: a decode repeats its
    ``want`` only when no ``ready`` came (lost on the way), so a repeat is answered again.
    Under tensor parallelism every decode rank asks the prefill's rank 0 (the one segment the
    proxy knows), so an offer answers several wants and stays until its expiry (the lease): a
    rank's ``done`` must not hide it from a sibling rank that asks later. Unpaired entries are
    dropped at their expiry (a decode that never asks is covered by the send lease; a want for a
    prefill that never finishes is noise).
    """

    _wants: dict[str, tuple[list[str], float]] = field(default_factory=dict)  # tid -> (decode segments, expiry)
    _offers: dict[str, tuple[Offer, float, set[str]]] = field(default_factory=dict)  # tid -> (offer, expiry, answered)

    def want(self, transfer_id: str, decode_segment: str, expiry: float) -> tuple[str, Offer] | None:
        offer = self._offers.get(transfer_id)
        if offer is not None:
            offer[2].add(decode_segment)
            return decode_segment, offer[0]
        segs, _ = self._wants.get(transfer_id, ([], expiry))
        if decode_segment not in segs:
            segs.append(decode_segment)
        self._wants[transfer_id] = (segs, max(expiry, self._wants.get(transfer_id, (segs, expiry))[1]))
        return None

    def offer(self, transfer_id: str, offer: Offer, expiry: float) -> list[tuple[str, Offer]]:
        segs, _ = self._wants.pop(transfer_id, ([], 0.0))
        self._offers[transfer_id] = (offer, expiry, set(segs))
        return [(seg, offer) for seg in segs]

    def answered(self, transfer_id: str, decode_segment: str) -> bool:
        """Whether ``decode_segment`` was sent a ``ready`` for ``transfer_id`` already (so its
        ``want`` now is a repeat: that ``ready`` was lost, or the decode is slow to see it)."""
        offer = self._offers.get(transfer_id)
        return offer is not None and decode_segment in offer[2]

    def expire(self, now: float) -> None:
        self._wants = {t: w for t, w in self._wants.items() if w[1] > now}
        self._offers = {t: o for t, o in self._offers.items() if o[1] > now}

    def pending(self) -> int:
        """Wants not yet answered plus offers not yet expired."""
        return len(self._wants) + len(self._offers)


@dataclass
class ClockOffsets:
    """Decode side: each prefill host's wall clock against ours, measured NTP-style over one
    notification round trip, so a lease expiry the prefill stated on *its* clock is checked on
    ours with the skew taken out (clocks of different hosts may differ by seconds; the margin
    alone does not cover that).

    ``sample`` takes our wall/monotonic readings at send and receipt and the peer's wall time
    stamped in between: offset = peer - midpoint, uncertain by half the round trip. ``deadline``
    turns a peer-clock expiry into our wall clock, minus that uncertainty. An offset older than
    ``max_age_s`` is stale (a host's clock may be stepped): the caller measures again.
    """

    max_age_s: float = 30.0
    _by_peer: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # peer -> (offset, err, mono)

    def sample(self, peer: str, sent_wall: float, sent_mono: float, peer_wall: float,
               recv_wall: float, recv_mono: float) -> tuple[float, float]:
        rtt = max(0.0, recv_mono - sent_mono)
        offset = peer_wall - (sent_wall + recv_wall) / 2.0
        self._by_peer[peer] = (offset, rtt / 2.0, recv_mono)
        return offset, rtt / 2.0

    def assume(self, peer: str, now_mono: float) -> None:
        """A peer that cannot answer (an older version): take its clock as ours, say so once."""
        self._by_peer[peer] = (0.0, 0.0, now_mono)

    def fresh(self, peer: str, now_mono: float) -> bool:
        got = self._by_peer.get(peer)
        return got is not None and now_mono - got[2] <= self.max_age_s

    def offset(self, peer: str) -> tuple[float, float] | None:
        got = self._by_peer.get(peer)
        return None if got is None else (got[0], got[1])

    def deadline(self, peer: str, peer_expiry: float) -> float:
        """``peer_expiry`` (the peer's wall clock) on our wall clock, early by the uncertainty;
        uncorrected for a peer never measured."""
        got = self._by_peer.get(peer)
        if got is None:
            return peer_expiry
        return peer_expiry - got[0] - got[1]
