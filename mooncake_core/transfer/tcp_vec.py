"""Vectored tcp requests (WRITEV / READV): pure encoding, planning and validation, no I/O.

Why: a KV hand-off is one batch of tens of thousands of small scattered blocks. Sent as one
40-byte request + 32-byte reply per block, the tcp path spends more time in Python per
block than the kernel spends copying it. A vectored request carries, as its aux, a packed
array of ``(remote_addr u64, length u64)`` for up to ``MAX_BLOCKS`` blocks, followed (WRITEV)
by their concatenated payload; the reply of a READV is the concatenated payload. Both ends
handle the arrays with numpy: the initiator plans requests without per-block objects, and
the target bounds-checks a whole request with a few array comparisons before memory is
touched. Each end also merges the blocks that are contiguous *on its own side* (the wire
stream is just the concatenation), so contiguous source pages become one iovec entry even
when their destinations are scattered.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mooncake_core.transfer.vec import drop_empty, group_bounds, split_long
from mooncake_core.transfer.wire import WireError

#: one (remote_addr, length) entry on the wire: two little-endian u64
ENTRY_SIZE = 16
#: most blocks one vectored request may carry (its aux is at most 16 KiB)
MAX_BLOCKS = 1024
#: most payload bytes one vectored request may carry; a target refuses more as garbage
MAX_BYTES = 64 << 20
#: addresses at or above this cannot be registered user memory: refused as out of bounds
#: (keeps every sum below in int64 range)
ADDR_LIMIT = 1 << 62

_WIRE = np.dtype("<u8")


def encode_blocks(remote: np.ndarray, length: np.ndarray) -> bytes:
    """Pack parallel arrays into the wire's interleaved ``(addr, len)`` u64 pairs."""
    out = np.empty((len(remote), 2), dtype=_WIRE)
    out[:, 0] = remote
    out[:, 1] = length
    return out.tobytes()


def with_blocks(header: bytes, remote: np.ndarray, length: np.ndarray) -> np.ndarray:
    """``header`` followed by the encoded block list, as one uint8 numpy buffer (its address
    can head an iovec array, so header, block list and payload leave in one syscall)."""
    h = len(header)
    buf = np.empty(h + ENTRY_SIZE * len(remote), dtype=np.uint8)
    buf[:h] = np.frombuffer(header, dtype=np.uint8)
    blocks = buf[h:].view(_WIRE).reshape(len(remote), 2)
    blocks[:, 0] = remote
    blocks[:, 1] = length
    return buf


def decode_blocks(aux: bytes | bytearray | memoryview, total: int, max_blocks: int = MAX_BLOCKS
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(addrs, lengths) int64 arrays of a vectored request, or WireError for a malformed one
    (size not a multiple of 16, no or too many blocks, lengths that do not add up to the
    header's payload length). Out-of-range *values* are not malformed: ``first_bad`` refuses
    them with a message naming the block."""
    n, rest = divmod(len(aux), ENTRY_SIZE)
    if rest or n == 0:
        raise WireError(f"vectored request: block list of {len(aux)} bytes is not a positive multiple of "
                        f"{ENTRY_SIZE}")
    if n > max_blocks:
        raise WireError(f"vectored request carries {n} blocks (limit {max_blocks})")
    if total < 0 or total > MAX_BYTES:
        raise WireError(f"vectored request of {total} payload bytes (limit {MAX_BYTES})")
    arr = np.frombuffer(aux, dtype=_WIRE).reshape(n, 2)
    lens = arr[:, 1]
    if int(lens.max()) > MAX_BYTES or int(lens.sum()) != total:
        raise WireError(f"vectored request: block lengths add up to {int(lens.sum(dtype=object))}, "
                        f"header says {total}")
    addrs = np.minimum(arr[:, 0], ADDR_LIMIT).astype(np.int64)
    return addrs, lens.astype(np.int64)


def first_bad(starts: np.ndarray, ends: np.ndarray, addrs: np.ndarray, lens: np.ndarray) -> int | None:
    """Index of the first block not wholly inside one region, or None when all are.

    Same rule as ``RegionTable.contains``: an empty block is always fine; a block must start
    in a region and end at or before that region's end (it may not span two adjacent ones).
    """
    if not len(starts):
        bad = lens > 0
    else:
        i = np.searchsorted(starts, addrs, side="right") - 1
        ok = (i >= 0) & (addrs < ADDR_LIMIT) & (addrs + lens <= ends[np.maximum(i, 0)])
        bad = ~ok & (lens > 0)
    if not bad.any():
        return None
    return int(np.argmax(bad))


def runs(addrs: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge consecutive blocks that are contiguous in memory (empty ones dropped), in stream
    order: fewer iovec entries for the same bytes."""
    addrs, lens = drop_empty(addrs, lens)
    if len(lens) < 2:
        return addrs, lens
    cont = addrs[:-1] + lens[:-1] == addrs[1:]
    if not cont.any():
        return addrs, lens
    starts = np.flatnonzero(np.concatenate(([True], ~cont)))
    return addrs[starts], np.add.reduceat(lens, starts)


class VecPlan(NamedTuple):
    """A batch cut into vectored requests: request ``k`` is entries ``bounds[k]:bounds[k+1]``
    and carries ``nbytes[k]`` payload bytes."""

    local: np.ndarray
    remote: np.ndarray
    length: np.ndarray
    bounds: list[int]
    nbytes: list[int]


def plan_requests(local: np.ndarray, remote: np.ndarray, length: np.ndarray, *,
                  max_blocks: int = MAX_BLOCKS, max_bytes: int = 16 << 20) -> VecPlan:
    """Drop empty entries, cut entries longer than ``max_bytes``, and group consecutive
    entries into requests of at most ``max_blocks`` entries and about ``max_bytes`` bytes
    (a request closes once it reaches ``max_bytes``). Order is kept, so the stream of a
    request is the concatenation of its entries."""
    if max_blocks <= 0 or max_bytes <= 0:
        raise ValueError(f"max_blocks ({max_blocks}) and max_bytes ({max_bytes}) must be > 0")
    local, remote, length = drop_empty(local, remote, length)
    local, remote, length = split_long(local, remote, length, max_bytes)
    bounds, nbytes = group_bounds(length, max_bytes, max_blocks)
    return VecPlan(local, remote, length, bounds, nbytes)

