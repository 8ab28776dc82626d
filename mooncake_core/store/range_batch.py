"""Ranged reads of a batch as arrays (``get_into_ranges``, ``batch_get_into_multi_buffer_ranges``).

Why: the per-key path of a ranged read builds, per key, a ``GetReply`` with its
``ReplicaDesc`` list from the master's reply, sorts the replicas and wraps them in a lease
object -- the per-key Python objects issue 18 took out of the whole-object batches. Here the
master's packed reply (one lease grant for the batch) is read with ``numpy.frombuffer``; the
fragments are columns (key, destination, object offset, length), grouped by the segment
their object lives in and read with one vectored ``batch_transfer_sync_read`` per remote
segment (a memcpy per fragment from our own segment).

Per-fragment semantics are the per-key path's (``RangeApi._read_fragments``): a missing key
gives its fragments the master's code, a range past the end of its object -600, an empty
range 0; a failed vectored read is retried fragment by fragment (unless the peer did not
answer for half a timeout: then its fragments fail, -800, without another wait); every
fragment read after the batch's lease ran out -- or under a master that no longer leads --
is discarded with -707. Replies this layout does not cover (several replicas, disk
replicas) return None: the caller then takes the per-key path with the same replies.
"""

from __future__ import annotations

import time

import numpy as np

from mooncake_core.store.batch_path import get_arrays
from mooncake_core.store.codes import INVALID, LEASE_EXPIRED, TRANSFER_FAIL
from mooncake_core.store.core import _unresponsive
from mooncake_core.store.internals import StoreInternals
from mooncake_core.store.memory import memmove
from mooncake_core.store.protocol import BatchGetReply
from mooncake_core.utils.log import get_logger

__all__ = ["read_ranges"]

log = get_logger("mooncake.store.range_api")


def read_ranges(core: StoreInternals, keys: list[str], reply: BatchGetReply, t_req: float, kix: np.ndarray,
                addr: np.ndarray, off: np.ndarray, size: np.ndarray, op: str) -> np.ndarray | None:
    """Read fragment f -- ``size[f]`` bytes at offset ``off[f]`` of object ``keys[kix[f]]``
    into ``addr[f]`` -- under ``reply`` (the packed ``batch_get`` of ``keys``, asked for at
    ``t_req``). Returns per fragment the bytes read or a negative code, or None when the
    reply needs the per-key path."""
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
        log.warning("%s: key %r: source range [%d, %d) is beyond the object (%d bytes)",
                    op, keys[k], int(off[f]), int(off[f] + size[f]), int(ksize[k]))
    rc[past] = INVALID
    todo = np.flatnonzero(~missing & ~past & (size > 0))
    fseg = kseg[kix[todo]]
    fsrc = kaddr[kix[todo]] + off[todo]
    fdst, flen = addr[todo], size[todo]
    good = np.ones(len(todo), bool)
    own = core.segment
    engine = core.engine
    for g in np.unique(fseg).tolist():
        sel = np.flatnonzero(fseg == g)
        name = reply.segments[g]
        d, s, m = fdst[sel].tolist(), fsrc[sel].tolist(), flen[sel].tolist()
        if own is not None and name == core.segment_name:
            for a, b, c in zip(d, s, m):
                memmove(a, b, c)
            continue
        t0 = time.monotonic()
        got = engine.batch_transfer_sync_read(name, d, s, m)
        if got is not None and got >= 0:
            continue
        log.warning("%s: batched read of %d ranges from %s failed (%s); %s", op, len(d), name, got,
                    "not retried (no answer)" if _unresponsive(engine, t0) else "retrying one by one")
        if _unresponsive(engine, t0):
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
        log.warning("%s: lease expired during the read of %d range(s) (first of %r); results discarded",
                    op, len(done), keys[int(kix[done[0]])])
    elif len(done) and 0 < reply.confirm_after_ms < (now - t_req) * 1000.0:
        # a new master does not know its predecessor's leases and may reuse their ranges
        current, why = core.leading_epoch()
        if current != reply.epoch:
            late = True
            log.warning("%s: the master changed during the read (epoch %s -> %s%s); results discarded (-707)",
                        op, reply.epoch, current, f": {why}" if why else "")
    rc[done] = LEASE_EXPIRED if late else size[done]
    return rc
