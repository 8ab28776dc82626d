"""The read path of one store client: every whole-object and ranged read.

A read: ``get_replica_list`` (or one packed ``batch_get`` for a batch) grants a lease -> we
read one replica (own segment first, then a same-host one, then any; disk last) straight
into the destination -> the read only counts if the lease is still valid afterwards (-707
otherwise: the range may have been reused). A read that took longer than the master's
``confirm_after_ms`` is trusted only if the master that granted its lease still leads (one
ping per batch): a new master does not know its predecessor's leases.

A batch whose destinations are all fresh bytes objects or all caller buffers goes as arrays
(``batch_arrays``): one lease grant, one vectored read per remote segment, the bytes
objects sliced from one staging buffer. Anything unusual -- several replicas per key, disk
replicas, big objects -- goes key by key with the same replies in hand. A batch that
outlived its lease is split and its late keys read again under fresh leases.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mooncake_core.errors import MooncakeError
from mooncake_core.store.batch_arrays import get_arrays, part_offsets, parts_arrays
from mooncake_core.store.client_metrics import ClientMetrics
from mooncake_core.store.codes import INVALID, LEASE_EXPIRED, NOT_FOUND, OK, TRANSFER_FAIL
from mooncake_core.store.internals import EngineLike, Parts
from mooncake_core.store.local_view import SegmentView
from mooncake_core.store.master_client import MasterClient
from mooncake_core.store.memory import (PREFAULT_MIN, buffer_addr, host_bytes, memmove, new_bytes, populate_range,
                                        prefault_enabled, spans)
from mooncake_core.store.offload import mem_view
from mooncake_core.store.packing import expand_gets
from mooncake_core.store.peer_timeout import unresponsive
from mooncake_core.store.protocol import BatchGetReply, GetReply, ReplicaDesc
from mooncake_core.store.validate import host_of
from mooncake_core.transfer import device_memory
from mooncake_core.utils.log import get_logger

__all__ = ["ReadPath"]

log = get_logger("mooncake.store.client")
range_log = get_logger("mooncake.store.range_api")


class ReadPath:
    """Reads of one store client (thread-safe: all state is per call). Built at setup from
    the client's master stub, engine, segment view and metrics, and ``promote``: what to do
    with an object just read from the SSD tier (copy it back to memory, in the background)."""

    #: how many times a batch that outlived its lease is split and its late keys read again
    LEASE_SPLITS = 6

    def __init__(self, master: MasterClient, engine: EngineLike, local: SegmentView, metrics: ClientMetrics,
                 promote: Callable[[str, bytes], None]):
        self.master = master
        self.engine = engine
        self.local = local
        self.metrics = metrics
        self.promote = promote

    # ================================================================== replicas
    def pick_order(self, replicas: Sequence[ReplicaDesc]) -> list[ReplicaDesc]:
        """Memory replicas first (ours, then same host, then others), disk replicas last."""
        name, host = self.local.name, self.local.host

        def rank(r: ReplicaDesc) -> int:
            if r.kind == "disk":
                return 3
            if r.segment_name == name:
                return 0
            if host_of(r.segment_name) == host:
                return 1
            return 2
        return sorted((r for r in replicas if r.status == "complete"), key=rank)

    def read_replica(self, rep: ReplicaDesc, parts: Parts, size: int) -> None:
        """Read the ``size``-byte object of replica ``rep`` into the destination parts."""
        if rep.kind == "disk":
            offload = self.local.offload
            if offload is None:
                raise MooncakeError(NOT_FOUND, "object is only on the SSD tier and no root_fs_dir is configured")
            if len(parts) == 1 and device_memory.find(parts[0][0], size) is None:
                offload.read_into(rep.path, mem_view(parts[0][0], size), size)
            else:
                tmp = bytearray(size)
                offload.read_into(rep.path, memoryview(tmp), size)
                tmp_addr = buffer_addr(tmp, "tmp")[0]
                for dst, off, n in spans(parts, 0, size):
                    memmove(dst, tmp_addr + off, n)
            return
        pieces = spans(parts, rep.addr, size)
        if self.local.mine(rep.segment_name):
            for dst, src, n in pieces:
                memmove(dst, src, n)
            return
        rc = self.engine.batch_transfer_sync_read(rep.segment_name, [d for d, _, _ in pieces],
                                                  [r for _, r, _ in pieces], [n for _, _, n in pieces])
        if rc is None or rc < 0:
            raise MooncakeError(TRANSFER_FAIL, f"read of {size} bytes from segment {rep.segment_name} failed ({rc})")

    def _read_with_fallback(self, order: Sequence[ReplicaDesc], parts: Parts, size: int,
                            first_error: Any = None) -> None:
        last: MooncakeError | None = None
        for rep in order:
            try:
                self.read_replica(rep, parts, size)
                return
            except MooncakeError as e:
                last = e
        if last is None:
            raise MooncakeError(TRANSFER_FAIL, f"no readable replica (transfer returned {first_error})")
        raise last

    def fetch_replicas(self, keys: list[str]) -> list[GetReply | int]:
        """One master round trip: a lease'd replica list (or an error code) per key."""
        master = self.master
        if len(keys) == 1:
            try:
                return [master.get_replica_list(keys[0])]
            except MooncakeError as e:
                return [e.code]
        return list(master.batch_get_replica_list(keys))

    # ================================================================== leases
    def leading_epoch(self) -> tuple[int, str]:
        """(epoch of the master leading now, "") by one ping, or (-1, why) when it cannot be
        told (unreachable, or the address answering is no longer the leader)."""
        try:
            info = self.master.ping(timeout=2.0)
        except MooncakeError as e:
            return -1, str(e)
        if not info.is_leader:
            return -1, f"{self.master.address} is no longer the master leader"
        return info.epoch, ""

    def _confirm_epochs(self, replies: Sequence[GetReply | int], results: list[int], keys: list[str],
                        elapsed_ms: float, op: str) -> list[int]:
        """A read that took longer than the master's ``confirm_after_ms`` is trusted only if
        the master that granted its lease still leads: a new master (restart or HA failover)
        does not know those leases, and may hand the ranges to new puts once its recovery
        hold has passed. One ping answers for the whole batch; any doubt fails the read
        with -707 (lease expired) -- a miss, never foreign bytes. Returns the indices failed
        because a *different* master now leads (worth one retry)."""
        epochs = {r.epoch for i, r in enumerate(replies)
                  if results[i] >= 0 and isinstance(r, GetReply) and 0 < r.confirm_after_ms < elapsed_ms}
        if not epochs:
            return []
        current, why = self.leading_epoch()
        if current > 0:
            why = f"the master changed during the read (epoch {min(epochs)} -> {current})"
        if epochs == {current}:
            return []
        failed = [i for i, r in enumerate(replies)
                  if results[i] >= 0 and isinstance(r, GetReply) and r.epoch in epochs and r.epoch != current]
        for i in failed:
            results[i] = LEASE_EXPIRED
        log.warning("%s: %d key(s) (first %r) read for %.0f ms under leases that cannot be confirmed: "
                    "%s; results discarded (-707)%s", op, len(failed), keys[failed[0]], elapsed_ms, why,
                    "; reading them again" if current > 0 else "")
        return failed if current > 0 else []

    # ================================================================== whole objects
    def read_batch(self, keys: list[str], dests: list[Any], op: str) -> list[int]:
        """Read each key into ``dests[i]``: a list of (addr, capacity) parts filled in order,
        or None to allocate a fresh bytes object (stored back into ``dests[i]`` as
        ``(bytes, size)``). Returns per-key bytes read or a negative code."""
        return self._read_within_leases(keys, dests, op, [d is None for d in dests], 0)

    def _read_within_leases(self, keys: list[str], dests: list[Any], op: str, fresh: list[bool],
                            depth: int) -> list[int]:
        """One batched read; then the keys whose read outlived its lease (-707: their bytes
        may come from a reused range, so they were discarded) are read again under fresh
        leases -- in two halves, each of which may split again, up to LEASE_SPLITS times, so a
        batch too large for one lease (a short --default_kv_lease_ttl) still completes, and
        every byte returned was read while its own lease held. A single late key is read once
        more."""
        if len(keys) > 1:
            got = self._read_flat(keys, dests, op)
            results = got if got is not None else self._read_listed(keys, dests, op)
        else:
            results = self._read_listed(keys, dests, op)
        late = [i for i, r in enumerate(results) if r == LEASE_EXPIRED]
        if not late or depth >= self.LEASE_SPLITS or (len(late) == 1 and depth > 0):
            return results
        log.info("%s: %d of %d key(s) outlived their lease; reading them again in %s", op, len(late), len(keys),
                 "two halves" if len(late) > 1 else "a second read")
        half = (len(late) + 1) // 2
        for part in (late[:half], late[half:]):
            if not part:
                continue
            sub = [None if fresh[i] else dests[i] for i in part]
            again = self._read_within_leases([keys[i] for i in part], sub, op, [fresh[i] for i in part], depth + 1)
            for j, i in enumerate(part):
                results[i] = again[j]
                if fresh[i]:
                    dests[i] = sub[j]
        return results

    def _read_listed(self, keys: list[str], dests: list[Any], op: str, retry: bool = True,
                     fetched: tuple[float, list[GetReply | int]] | None = None) -> list[int]:
        """The key-by-key read of ``read_batch`` (one lease grant, one batched transfer per
        remote segment). ``fetched``: (when the lease was asked for, the replies) already in
        hand."""
        t0 = time.perf_counter()
        fresh = [d is None for d in dests]
        n = len(keys)
        results: list[int] = [0] * n
        if fetched is not None:
            t_req, replies = fetched
        else:
            t_req = time.monotonic()
            try:
                replies = self.fetch_replicas(keys)
            except MooncakeError as e:
                return [e.code] * n
        remote: dict[str, list[tuple[int, Parts, int, list[ReplicaDesc]]]] = {}
        deadlines = [0.0] * n
        read_parts: list[Parts | None] = [None] * n
        pending_promote: list[int] = []
        prefault = prefault_enabled()
        own_name = self.local.name
        for i, reply in enumerate(replies):
            if isinstance(reply, int):
                results[i] = reply
                continue
            deadlines[i] = t_req + reply.lease_ttl_ms / 1000.0
            order = self.pick_order(reply.replicas)
            if not order:
                results[i] = NOT_FOUND
                continue
            size = order[0].size
            if dests[i] is None:
                b, addr = new_bytes(size)
                dests[i] = (b, size)
                parts = [(addr, size)]
                if size >= PREFAULT_MIN and prefault:
                    populate_range(addr, size)
            else:
                parts = dests[i]
                cap = sum(c for _, c in parts)
                if cap < size:
                    results[i] = INVALID
                    log.warning("%s(%r): buffer of %d bytes is smaller than the object (%d bytes)",
                                op, keys[i], cap, size)
                    continue
            read_parts[i] = parts
            results[i] = size
            first = order[0]
            if first.kind != "disk" and first.segment_name != own_name and size > 0:
                remote.setdefault(first.segment_name, []).append((i, parts, size, order))
                continue
            try:
                if size:
                    self._read_with_fallback(order, parts, size)
                if first.kind == "disk":
                    pending_promote.append(i)
            except MooncakeError as e:
                results[i] = e.code
        # one batched read per remote segment
        for seg_name, items in remote.items():
            locs: list[int] = []
            rems: list[int] = []
            lens: list[int] = []
            for _, parts, size, order in items:
                for d, r, m in spans(parts, order[0].addr, size):
                    locs.append(d)
                    rems.append(r)
                    lens.append(m)
            t_read = time.monotonic()
            rc = self.engine.batch_transfer_sync_read(seg_name, locs, rems, lens)
            if rc is not None and rc >= 0:
                continue
            # retry one by one to isolate the failing key/replica -- but a segment that did not
            # answer for half a timeout is not asked again: only the other replicas are tried
            gone = unresponsive(self.engine, t_read)
            for i, parts, size, order in items:
                try:
                    self._read_with_fallback([r for r in order if not (gone and r.segment_name == seg_name)],
                                             parts, size, first_error=rc)
                except MooncakeError as e:
                    results[i] = e.code
        now = time.monotonic()
        for i in range(n):
            if results[i] >= 0 and not isinstance(replies[i], int) and now >= deadlines[i]:
                log.warning("%s(%r): lease expired during the read; result discarded", op, keys[i])
                results[i] = LEASE_EXPIRED
        stale = self._confirm_epochs(replies, results, keys, (now - t_req) * 1000.0, op)
        if stale and retry:
            # the master changed under a long read: read those keys again under fresh leases
            # (their owners re-report them to the new master); once, so a flapping master
            # cannot keep us here
            sub_dests = [None if fresh[i] else dests[i] for i in stale]
            again = self._read_listed([keys[i] for i in stale], sub_dests, op, retry=False)
            for j, i in enumerate(stale):
                results[i] = again[j]
                if fresh[i]:
                    dests[i] = sub_dests[j]
        for i in pending_promote:
            got = read_parts[i]
            if results[i] >= 0 and got is not None:
                d = dests[i][0]
                # get(): the fresh bytes object is immutable, share it; get_into: the caller
                # owns the buffer, so the (disk-path only) promotion takes a copy
                data = d if isinstance(d, bytes) else b"".join(
                    host_bytes(a, m) for a, _, m in spans(got, 0, results[i]))
                self.promote(keys[i], data)
        self.metrics.count(op, min(results) if results else OK, sum(r for r in results if r > 0), t0)
        return results

    def _read_flat(self, keys: list[str], dests: list[Any], op: str) -> list[int] | None:
        """``read_batch`` of a batch whose destinations are all fresh bytes objects (None) or
        all buffers -- one each, or several filled in order (``*_multi_buffers``): one lease
        grant, one vectored read per segment. None when the destinations are of another shape
        (the per-key route then runs from the start)."""
        n = len(keys)
        fresh = dests[0] is None
        if fresh:
            if any(d is not None for d in dests):
                return None
        elif any(d is None for d in dests):
            return None
        t0 = time.perf_counter()
        t_req = time.monotonic()
        try:
            reply = self.master.batch_get_packed(keys)
        except MooncakeError as e:
            return [e.code] * n
        got = get_arrays(reply, n)
        if got is None or (len(got[3]) and int(got[1].max()) >= PREFAULT_MIN):
            # disk or several replicas, big objects: the per-key route, with the replies in hand
            return self._read_listed(keys, dests, op, fetched=(t_req, expand_gets(reply, n)))
        codes, sizes, seg, src, found = got
        results = codes.tolist()
        pos = np.flatnonzero(found) if len(src) < n else np.arange(n)
        ln = sizes.astype(np.int64)[pos]
        src = src.astype(np.int64)
        multi: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        if fresh:
            offs = np.concatenate(([0], np.cumsum(ln)[:-1])) if len(ln) else ln
            stage = bytearray(max(int(ln.sum()), 1))
            base = np.frombuffer(stage, np.uint8).ctypes.data
            dst = offs + base
        else:
            if all(len(d) == 1 for d in dests):
                caps = np.fromiter((d[0][1] for d in dests), np.int64, n)[pos]
                dst = np.fromiter((d[0][0] for d in dests), np.int64, n)[pos]
            else:
                pc, pa, pcap = parts_arrays(dests)
                pkey, poff = part_offsets(pc, pcap)
                caps = np.bincount(pkey, pcap, n).astype(np.int64)[pos] if len(pcap) else np.zeros(len(pos), np.int64)
                dst = np.zeros(len(pos), np.int64)  # unused: the pieces carry the addresses
                multi = (pkey, poff, pa, pcap)
            small = caps < ln
            if small.any():
                for j in np.flatnonzero(small).tolist():
                    i = int(pos[j])
                    results[i] = INVALID
                    log.warning("%s(%r): buffer of %d bytes is smaller than the object (%d bytes)",
                                op, keys[i], int(caps[j]), int(ln[j]))
                keep = ~small
                pos, ln, dst, src, seg = pos[keep], ln[keep], dst[keep], src[keep], seg[keep]
        if multi is None:
            owner, pdst, psrc, plen = np.arange(len(pos)), dst, src, ln
        else:
            # the object's bytes fill its buffers in order: piece k takes what is left of the
            # object past the capacities of the pieces before it, at most its own capacity
            pkey, poff, pa, pcap = multi
            jof = np.full(n, -1, np.int64)
            jof[pos] = np.arange(len(pos))
            pj = jof[pkey] if len(pkey) else pkey
            take = np.clip(ln[np.maximum(pj, 0)] - poff, 0, pcap) if len(pj) and len(pos) else np.zeros_like(pj)
            keep = (pj >= 0) & (take > 0)
            owner = pj[keep]
            pdst, psrc, plen = pa[keep], src[owner] + poff[keep], take[keep]
        ok = np.ones(len(pos), bool)
        groups = [0] if len(reply.segments) == 1 else np.unique(seg).tolist()
        own = self.local.segment
        for g in groups:
            objs = np.arange(len(pos)) if len(groups) == 1 else np.flatnonzero(seg == g)
            psel = np.flatnonzero(seg[owner] == g) if len(groups) > 1 else None
            name = reply.segments[g]
            d, s_, m = (pdst, psrc, plen) if psel is None else (pdst[psel], psrc[psel], plen[psel])
            if own is not None and name == self.local.name:
                if not self.local.holds(src[objs], ln[objs]):
                    ok[objs] = False
                    continue
                for a, b, c in zip(d.tolist(), s_.tolist(), m.tolist()):
                    if c:
                        memmove(a, b, c)
                continue
            nz = m > 0
            if not nz.all():
                d, s_, m = d[nz], s_[nz], m[nz]
            if not len(m):
                continue
            t_read = time.monotonic()
            rc = self.engine.batch_transfer_sync_read(name, d.tolist(), s_.tolist(), m.tolist())
            if rc is not None and rc >= 0:
                continue
            if unresponsive(self.engine, t_read):
                # a segment that did not answer for half a timeout is not asked again key by key
                # (one more timeout per key); every key has this one replica here
                ok[objs] = False
                continue
            for j in objs.tolist():  # isolate the failing keys
                c = int(ln[j])
                parts = [(int(dst[j]), c)] if multi is None else dests[int(pos[j])]
                try:
                    self.read_replica(ReplicaDesc(name, int(src[j]), c), parts, c)
                except MooncakeError:
                    ok[j] = False
        for i, m_, good in zip(pos.tolist(), ln.tolist(), ok.tolist()):
            results[i] = m_ if good else TRANSFER_FAIL
        now = time.monotonic()
        if now >= t_req + reply.lease_ttl_ms / 1000.0:
            late = [int(i) for i in pos[ok].tolist()]
            if late:
                log.warning("%s: lease expired during the read of %d key(s) (first %r); results discarded",
                            op, len(late), keys[late[0]])
            for i in late:
                results[i] = LEASE_EXPIRED
        elif 0 < reply.confirm_after_ms < (now - t_req) * 1000.0:
            replies = expand_gets(reply, n)
            stale = self._confirm_epochs(replies, results, keys, (now - t_req) * 1000.0, op)
            if stale:  # a different master leads now: read those again under fresh leases, once
                sub = [None if fresh else dests[i] for i in stale]
                again = self._read_listed([keys[i] for i in stale], sub, op, retry=False)
                for j, i in enumerate(stale):
                    results[i] = again[j]
                    if fresh and again[j] >= 0:
                        dests[i] = sub[j]
        if fresh:
            view = memoryview(stage)
            for i, o, m_ in zip(pos.tolist(), offs.tolist(), ln.tolist()):
                if results[i] >= 0 and dests[i] is None:
                    dests[i] = (bytes(view[o:o + m_]), m_)
        self.metrics.count(op, min(results) if results else OK, sum(r for r in results if r > 0), t0)
        return results

    # ================================================================== ranges
    def read_ranges(self, keys: list[str], reply: BatchGetReply, t_req: float, kix: np.ndarray,
                    addr: np.ndarray, off: np.ndarray, size: np.ndarray, op: str) -> np.ndarray | None:
        """Ranged reads of a batch as arrays (``get_into_ranges``,
        ``batch_get_into_multi_buffer_ranges``): fragment f -- ``size[f]`` bytes at offset
        ``off[f]`` of object ``keys[kix[f]]`` into ``addr[f]`` -- under ``reply`` (the packed
        ``batch_get`` of ``keys``, asked for at ``t_req``). Returns per fragment the bytes read
        or a negative code, or None when the reply needs the per-key route (several replicas,
        disk replicas).

        Per-fragment semantics are the per-key route's (``RangeApi._read_fragments``): a
        missing key gives its fragments the master's code, a range past the end of its object
        -600, an empty range 0; a failed vectored read is retried fragment by fragment (unless
        the peer did not answer for half a timeout: then its fragments fail, -800, without
        another wait); every fragment read after the batch's lease ran out -- or under a
        master that no longer leads -- is discarded with -707."""
        n = len(keys)
        arrays = get_arrays(reply, n)
        if arrays is None:
            return None
        codes, sizes, seg, src, found = arrays
        # per key: its segment index and address (-1 / 0 for keys not found)
        kseg = np.full(n, -1, np.int64)
        kaddr = np.zeros(n, np.int64)
        kseg[found] = seg
        kaddr[found] = src.astype(np.int64)
        ksize = sizes.astype(np.int64)
        rc = np.zeros(len(kix), np.int64)
        fcode = codes[kix].astype(np.int64)
        missing = fcode != 0
        rc[missing] = fcode[missing]
        past = ~missing & (off + size > ksize[kix])
        for f in np.flatnonzero(past).tolist():
            k = int(kix[f])
            range_log.warning("%s: key %r: source range [%d, %d) is beyond the object (%d bytes)",
                              op, keys[k], int(off[f]), int(off[f] + size[f]), int(ksize[k]))
        rc[past] = INVALID
        todo = np.flatnonzero(~missing & ~past & (size > 0))
        fseg = kseg[kix[todo]]
        fsrc = kaddr[kix[todo]] + off[todo]
        fdst, flen = addr[todo], size[todo]
        good = np.ones(len(todo), bool)
        engine = self.engine
        for g in np.unique(fseg).tolist():
            sel = np.flatnonzero(fseg == g)
            name = reply.segments[g]
            d, s, m = fdst[sel].tolist(), fsrc[sel].tolist(), flen[sel].tolist()
            if self.local.mine(name):
                for a, b, c in zip(d, s, m):
                    memmove(a, b, c)
                continue
            t0 = time.monotonic()
            got = engine.batch_transfer_sync_read(name, d, s, m)
            if got is not None and got >= 0:
                continue
            range_log.warning("%s: batched read of %d ranges from %s failed (%s); %s", op, len(d), name, got,
                              "not retried (no answer)" if unresponsive(engine, t0) else "retrying one by one")
            if unresponsive(engine, t0):
                good[sel] = False
                continue
            for j, a, b, c in zip(sel.tolist(), d, s, m):
                one = engine.batch_transfer_sync_read(name, [a], [b], [c])
                if one is None or one < 0:
                    good[j] = False
        rc[todo[~good]] = TRANSFER_FAIL
        done = todo[good]
        now = time.monotonic()
        late = now >= t_req + reply.lease_ttl_ms / 1000.0
        if late and len(done):
            range_log.warning("%s: lease expired during the read of %d range(s) (first of %r); results discarded",
                              op, len(done), keys[int(kix[done[0]])])
        elif len(done) and 0 < reply.confirm_after_ms < (now - t_req) * 1000.0:
            # a new master does not know its predecessor's leases and may reuse their ranges
            current, why = self.leading_epoch()
            if current != reply.epoch:
                late = True
                range_log.warning("%s: the master changed during the read (epoch %s -> %s%s); results "
                                  "discarded (-707)", op, reply.epoch, current, f": {why}" if why else "")
        rc[done] = LEASE_EXPIRED if late else size[done]
        return rc
