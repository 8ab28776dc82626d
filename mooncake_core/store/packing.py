"""Array packing of the master's batch messages (pure: no sockets, no numpy).

Why: a batch of 1,000 small puts used to carry one ``ReplicaDesc`` Struct per key in each
direction -- the segment name repeated 1,000 times, and 1,000 Python objects built by the
master and decoded by the client, which cost more CPU than the puts themselves. Packed, a
batch reply is a few byte strings holding little-endian arrays (per-key codes and sizes, per
replica an index into a table of segment names and an address) that the client reads with
``numpy.frombuffer`` without creating an object per key, and the master builds with
``array.array`` appends.

Layout (all little-endian): ``i32`` codes, ``u64`` sizes and addresses, ``u8`` replica
counts, ``u32`` segment indices, ``i64`` put_end versions / codes. See ``protocol.Placements``
and ``protocol.BatchGetReply`` for the messages that carry them.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store.protocol import BatchGetReply, GetReply, Placements, ReplicaDesc

__all__ = ["I32", "I64", "U8", "U32", "U64", "Packer", "expand_gets", "expand_placements", "pack", "unpack"]

_LITTLE = sys.byteorder == "little"

#: array typecodes of the packed layouts (sizes checked at import: "l"/"L" vary by platform)
I32, U32, I64, U64, U8 = "i", "I", "q", "Q", "B"
for _code, _size in ((I32, 4), (U32, 4), (I64, 8), (U64, 8), (U8, 1)):
    assert array(_code).itemsize == _size, f"array typecode {_code!r} is not {_size} bytes here"


def pack(code: str, values: Sequence[int]) -> bytes:
    """``values`` as a little-endian array of ``code`` (raises OverflowError if one does not fit)."""
    a = array(code, values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def unpack(code: str, blob: object, n: int | None, what: str) -> list[int]:
    """The ints of a packed array; -600 naming ``what`` when ``blob`` is not bytes, is not a
    whole number of items, or (``n`` given) does not hold exactly ``n`` items."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise MooncakeError(ErrorCode.INVALID_PARAMS, f"{what}: expected packed bytes, got {type(blob).__name__}")
    a = array(code)
    if len(blob) % a.itemsize:
        raise MooncakeError(ErrorCode.INVALID_PARAMS,
                            f"{what}: {len(blob)} bytes is not a whole number of {a.itemsize}-byte items")
    a.frombytes(blob)
    if not _LITTLE:
        a.byteswap()
    if n is not None and len(a) != n:
        raise MooncakeError(ErrorCode.INVALID_PARAMS, f"{what}: {len(a)} items for {n} keys")
    return a.tolist()


class Packer:
    """Accumulates per-key codes and per-replica (segment, address) pairs of one batch reply,
    with the segment names deduplicated into a table."""

    __slots__ = ("codes", "counts", "segments", "_seg_index", "seg", "addrs")

    def __init__(self) -> None:
        self.codes = array(I32)
        self.counts = array(U8)
        self.segments: list[str] = []
        self._seg_index: dict[str, int] = {}
        self.seg = array(U32)
        self.addrs = array(U64)

    def segment(self, name: str) -> int:
        """Index of segment ``name`` in the table (added on first use)."""
        i = self._seg_index.get(name)
        if i is None:
            i = self._seg_index[name] = len(self.segments)
            self.segments.append(name)
        return i

    def blobs(self) -> tuple[bytes, bytes, list[str], bytes, bytes]:
        """(codes, counts, segments, seg, addrs) ready for the wire."""
        out = []
        for a in (self.codes, self.counts, self.seg, self.addrs):
            if not _LITTLE:
                a = array(a.typecode, a)
                a.byteswap()
            out.append(a.tobytes())
        return out[0], out[1], self.segments, out[2], out[3]


def _replicas(msg: Placements | BatchGetReply, n: int, what: str) -> tuple[list[int], list[int], list[int]]:
    """(per-key replica counts, per-replica segment index, address) of a packed reply,
    checked to add up (-600 naming ``what`` otherwise)."""
    counts = unpack(U8, msg.counts, n, f"{what}: counts")
    seg = unpack(U32, msg.seg, None, f"{what}: seg")
    addrs = unpack(U64, msg.addrs, len(seg), f"{what}: addrs")
    if sum(counts) != len(seg) or (seg and max(seg) >= len(msg.segments)):
        raise MooncakeError(ErrorCode.INVALID_PARAMS, f"{what}: replica counts do not match the replicas")
    return counts, seg, addrs


def expand_placements(pl: Placements, sizes: Sequence[int]) -> list[list[ReplicaDesc] | int]:
    """``Placements`` as one list of replicas (status "processing") or one code per key: the
    shape of the single ``put_start``, for callers that handle keys one by one."""
    n = len(sizes)
    codes = unpack(I32, pl.codes, n, "placements: codes")
    counts, seg, addrs = _replicas(pl, n, "placements")
    out: list[list[ReplicaDesc] | int] = []
    j = 0
    names = pl.segments
    for code, count, size in zip(codes, counts, sizes):
        if code:
            out.append(code)
            continue
        out.append([ReplicaDesc(names[seg[r]], addrs[r], size, "memory", "", "processing")
                    for r in range(j, j + count)])
        j += count
    return out


def expand_gets(reply: BatchGetReply, n: int) -> list[GetReply | int]:
    """``BatchGetReply`` as one ``GetReply`` (memory replicas, then the disk one) or one code
    per key: the shape of the single ``get_replica_list``."""
    codes = unpack(I32, reply.codes, n, "get reply: codes")
    sizes = unpack(U64, reply.sizes, n, "get reply: sizes")
    counts, seg, addrs = _replicas(reply, n, "get reply")
    disk = dict(reply.disk)
    names = reply.segments
    out: list[GetReply | int] = []
    j = 0
    for i, (code, size, count) in enumerate(zip(codes, sizes, counts)):
        if code:
            out.append(code)
            continue
        reps = [ReplicaDesc(names[seg[r]], addrs[r], size) for r in range(j, j + count)]
        j += count
        d = disk.get(i)
        if d is not None:
            reps.append(d)
        out.append(GetReply(reps, reply.lease_ttl_ms, reply.epoch, reply.confirm_after_ms))
    return out
