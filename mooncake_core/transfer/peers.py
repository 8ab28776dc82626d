"""Peers of one engine: their descriptors and the transport chosen for each.

On first contact with a target segment its descriptor is fetched (from this process when
the target is another engine here, else from the metadata service, or under P2PHANDSHAKE
from the peer itself over the control channel) and one transport is chosen: the most
preferred registered transport (``priority``) that serves every memory location the peer
published (``capabilities.locations``) and can reach it -- so local > cma > rdma > tcp is the
transports' data, not code here. ``MC_FORCE_TCP=1`` or a ``transport_hint`` overrides the
choice. Each peer has its own dispatch threads for asynchronous batches, so a dead peer only
ever blocks its own work.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

from mooncake_core import envs
from mooncake_core.errors import ErrorCode
from mooncake_core.metadata.base import MetadataBackend
from mooncake_core.transfer.base import Transport, TransferError, TransferRequest, location_kind
from mooncake_core.transfer.control import ControlChannel
from mooncake_core.transfer.descriptor import SegmentDescriptor, ram_key
from mooncake_core.transfer.local import local_owner
from mooncake_core.transfer.segment import LocalSegment
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.net import parse_host_port

log = get_logger("mooncake.te")

__all__ = ["AUTO_HINTS", "Peer", "PeerTable", "check_hint", "hint_table"]

#: transport_hint values meaning "choose automatically"
AUTO_HINTS = ("", "unspec")


def hint_table(transports: Sequence[Transport] | Sequence[type[Transport]]) -> dict[str, str]:
    """transport_hint -> transport name: each transport's name and its ``hints`` aliases."""
    table: dict[str, str] = {}
    for t in transports:
        for h in (t.name, *t.hints):
            table.setdefault(h, t.name)
    return table


def check_hint(hint: str, table: dict[str, str]) -> None:
    """Mooncake raises invalid_argument for an unknown hint; so do we (a programming error)."""
    if hint not in AUTO_HINTS and hint not in table:
        raise ValueError(f"unknown transport_hint {hint!r} (valid: {', '.join(sorted(table))}, "
                         "or '' for automatic)")


@dataclass
class Peer:
    name: str
    desc: SegmentDescriptor
    transport: Transport
    dispatch: ThreadPoolExecutor  # async batches to this peer only (per-peer isolation)
    #: transport_hint -> transport already checked to reach this peer (the latency path's cache)
    hinted: dict[str, Transport] = field(default_factory=dict)


class PeerTable:
    """Descriptor cache and per-peer transport choice (thread-safe)."""

    def __init__(self, segment: LocalSegment, transports: Sequence[Transport], meta: MetadataBackend | None,
                 control: ControlChannel, timeout: Callable[[], float]) -> None:
        self.segment = segment
        self.transports = list(transports)  # most preferred first
        self.by_name = {t.name: t for t in self.transports}
        self.hints = hint_table(self.transports)
        self.meta = meta
        self.control = control
        self._timeout = timeout
        self._lock = threading.Lock()
        self._peers: dict[str, Peer] = {}
        self._peer_locks: dict[str, threading.Lock] = {}

    # ------------------------------------------------------------------ descriptors
    def resolve(self, name: str) -> SegmentDescriptor:
        """The current descriptor of segment ``name`` (TransferError when it cannot be had)."""
        if name == self.segment.name:  # never loop through a socket to ourselves
            return self.segment.descriptor()
        other = local_owner(name)
        if other is not None:  # another engine in this process: no metadata round trip
            d = other.local_descriptor()
            if d is not None:
                return d
        deadline = time.monotonic() + min(self._timeout(), 10.0)
        if self.meta is not None:
            raw = self.meta.get(ram_key(name))
            if raw is None:
                raise TransferError(f"segment {name!r} not found in the metadata service "
                                    f"(no key {ram_key(name)!r}); is the peer initialized?",
                                    ErrorCode.SEGMENT_NOT_FOUND)
            return SegmentDescriptor.from_json(raw, expect_name=name)
        # P2PHANDSHAKE: ask the peer itself on its rpc port
        try:
            host, port = parse_host_port(name, what="target segment")
        except ValueError as e:
            raise TransferError(f"P2PHANDSHAKE target must be 'host:rpc_port': {e}",
                                ErrorCode.SEGMENT_NOT_FOUND) from None
        desc = SegmentDescriptor.from_json(self.control.fetch_descriptor(host, port, name, deadline), expect_name=name)
        if desc.name != name:  # name under which we reach it is authoritative
            desc.name = name
        return desc

    def endpoint(self, name: str) -> tuple[str, int]:
        """(host, rpc port) of segment ``name``, for a probe (no transport is chosen)."""
        if self.meta is None:
            return parse_host_port(name, what="peer_server_name")
        raw = self.meta.get(ram_key(name))
        if raw is None:
            raise TransferError(f"segment {name!r} not found", ErrorCode.SEGMENT_NOT_FOUND)
        desc = SegmentDescriptor.from_json(raw, expect_name=name)
        return desc.host, desc.port

    # ------------------------------------------------------------------ transport choice
    def choose(self, desc: SegmentDescriptor) -> Transport:
        """The most preferred transport that serves the peer's memory and can reach it."""
        tcp = self.by_name.get("tcp")
        if tcp is not None and envs.MC_FORCE_TCP:
            return tcp
        kinds = {location_kind(b.location) for b in desc.buffers}
        for t in self.transports:
            if not kinds <= t.capabilities.locations or not t.can_reach(desc):
                continue
            if t is tcp and desc.boot_id and desc.boot_id == self.segment.boot_id:
                # loud on purpose: a same-host peer silently on tcp is what users of the original
                # could not tell from a working setup (docs/transfer-engine.md)
                log.warning("peer on this host but cross-memory attach is unavailable (another pid "
                            "namespace, or attach not permitted); using tcp", extra={"segment": desc.name})
            return t
        raise TransferError(f"no transport can reach segment {desc.name!r} with memory {sorted(kinds)} (tried "
                            f"{', '.join(t.name for t in self.transports)})", ErrorCode.SEGMENT_NOT_FOUND)

    def pick(self, peer: Peer, hint: str) -> Transport:
        """The peer's transport, or the one ``hint`` forces (which must reach it)."""
        if hint in AUTO_HINTS:
            return peer.transport
        t = peer.hinted.get(hint)
        if t is not None:
            return t
        t = self.by_name[self.hints[hint]]
        if not t.can_reach(peer.desc):
            raise TransferError(f"transport {hint!r} cannot reach segment {peer.name!r}")
        peer.hinted[hint] = t
        return t

    # ------------------------------------------------------------------ the table
    def cached(self, name: str) -> Peer | None:
        """The peer if already known (the latency path's lookup: no locks)."""
        return self._peers.get(name)

    def get(self, name: str, refresh: bool = False) -> Peer:
        with self._lock:
            p = self._peers.get(name)
            if p is not None and not refresh:
                return p
            plock = self._peer_locks.setdefault(name, threading.Lock())
        with plock:
            with self._lock:
                p = self._peers.get(name)
            if p is not None and not refresh:
                return p
            desc = self.resolve(name)
            transport = self.choose(desc)
            if p is not None:
                p.desc, p.transport = desc, transport
                p.hinted = {}
            else:
                p = Peer(name, desc, transport, ThreadPoolExecutor(max_workers=2, thread_name_prefix="te-peer"))
                log.info("transport selected for peer", extra={"segment": name, "transport": transport.name,
                                                               "host": desc.host, "port": desc.port})
            with self._lock:
                self._peers[name] = p
            return p

    def forget(self, name: str) -> None:
        """Drop a peer that went down (it may have restarted elsewhere): its descriptor, its
        dispatch threads and every transport's and the control channel's connections."""
        with self._lock:
            p = self._peers.pop(name, None)
        if p is not None:
            p.dispatch.shutdown(wait=False)
            for t in self.transports:
                t.drop_peer(p.desc)
            self.control.drop_peer(p.desc.host, p.desc.port)

    def check_bounds(self, peer: Peer, reqs: list[TransferRequest]) -> None:
        """Initiator-side check against the published regions. Required for cma/local (the target
        is not involved); for tcp the target checks again, but checking here too means a batch
        with one bad entry is refused whole instead of half-executed."""
        for attempt in (0, 1):
            bad = next((r for r in reqs if peer.desc.find_region(r.remote_addr, r.length) is None), None)
            if bad is None:
                return
            if attempt == 0:  # the target may have registered more memory since we looked
                peer = self.get(peer.name, refresh=True)
        assert bad is not None
        raise TransferError(f"{bad.opcode.name.lower()} of {bad.length} bytes at {bad.remote_addr:#x} is outside "
                            f"every region registered by segment {peer.name!r}", ErrorCode.INVALID_PARAMS)

    def close(self) -> None:
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for p in peers:
            p.dispatch.shutdown(wait=False)
