"""A batch as arrays: the master's packed replies and the callers' piece tables as numpy
columns (pure; shared by the write path, the read path and ranged reads).

Why: building Python objects per key -- a replica descriptor decoded from the master's
reply, an (address, length) pair per piece -- was most of a large batch's client CPU. The
packed replies (``packing``) are read with ``numpy.frombuffer``; a reply of a shape these
columns do not cover (several replicas per key, disk replicas, one that does not add up)
gives None, and the caller takes the per-key path, which decodes and checks it.
"""

from __future__ import annotations

import numpy as np

from mooncake_core.store.internals import Parts
from mooncake_core.store.protocol import BatchGetReply, Placements

__all__ = ["get_arrays", "part_offsets", "parts_arrays", "pieces", "placement_arrays"]


def placement_arrays(pl: Placements, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(codes, segment index, address) of placements of ``n`` keys with at most one replica
    per key (the replica arrays list the placed keys in order), or None: several replicas,
    or a reply that does not add up."""
    codes = np.frombuffer(pl.codes, np.int32)
    counts = np.frombuffer(pl.counts, np.uint8)
    if len(codes) != n or len(counts) != n:
        return None
    seg = np.frombuffer(pl.seg, np.uint32)
    dst = np.frombuffer(pl.addrs, np.uint64)
    placed = codes == 0
    if not np.array_equal(counts, placed) or len(seg) != len(dst) or len(dst) != int(np.count_nonzero(placed)):
        return None
    if len(seg) and int(seg.max()) >= len(pl.segments):
        return None
    return codes, seg, dst.astype(np.int64)


def get_arrays(reply: BatchGetReply, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                     np.ndarray] | None:
    """(codes, sizes, segment index, address, found) of a packed batch get of ``n`` keys with
    at most one memory replica per key and no disk replica (the replica arrays list the found
    keys in order), or None: another shape, or a reply that does not add up."""
    codes = np.frombuffer(reply.codes, np.int32)
    sizes = np.frombuffer(reply.sizes, np.uint64)
    counts = np.frombuffer(reply.counts, np.uint8)
    seg = np.frombuffer(reply.seg, np.uint32)
    src = np.frombuffer(reply.addrs, np.uint64)
    found = codes == 0
    if (reply.disk or len(codes) != n or len(sizes) != n or not np.array_equal(counts, found)
            or len(seg) != len(src) or len(src) != int(np.count_nonzero(found))
            or (len(seg) and int(seg.max()) >= len(reply.segments))):
        return None
    return codes, sizes, seg, src, found


def part_offsets(counts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(key index, offset inside its object) of every part of a multi-part batch: key i is
    the ``counts[i]`` parts that follow key i-1's, laid end to end (``lens``: their lengths,
    or capacities when reading). A key may have no parts."""
    key = np.repeat(np.arange(len(counts)), counts)
    ends = np.concatenate(([0], np.cumsum(lens)))
    first = np.concatenate(([0], np.cumsum(counts)))[:-1]
    return key, ends[:-1] - ends[first][key]


def parts_arrays(parts: list[Parts]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(parts per key, part addresses, part lengths) of per-key (address, length) lists."""
    counts = np.fromiter(map(len, parts), np.int64, len(parts))
    flat = [x for p in parts for pair in p for x in pair]
    pa = np.array(flat, np.int64).reshape(-1, 2) if flat else np.zeros((0, 2), np.int64)
    return counts, pa[:, 0], pa[:, 1]


def pieces(n: int, pos: np.ndarray, dst: np.ndarray, key: np.ndarray, off: np.ndarray, pa: np.ndarray,
           pl: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(placed index, source, destination, length) of every non-empty piece of a placed
    object of a batch of ``n`` (``pos``/``dst``: the placed keys and where their objects
    go; ``key``/``off``/``pa``/``pl``: per piece its key, offset in the object, address and
    length)."""
    jof = np.full(n, -1, np.int64)
    jof[pos] = np.arange(len(pos))
    pj = jof[key] if len(key) else key
    keep = (pj >= 0) & (pl > 0)
    owner = pj[keep]
    return owner, pa[keep], dst[owner] + off[keep], pl[keep]
