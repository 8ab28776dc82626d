"""Self-describing values: every byte a worker writes says which key, which write, and
carries a checksum, so the checker can tell a correct read from a stale one or from bytes
that were never written to that key ("foreign": another key's value, a torn or recycled
range, garbage).

Layout (little endian)::

    magic "MCv1" | writer u16 | incarnation u16 | thread u16 | seq u32 | key_len u16 | body_len u32
    key bytes | body (a 32-byte digest of the header+key, repeated) | blake2b-8 of all before

The body is cheap to build yet unique per write: a range recycled from another object
fails the key or the checksum check. Stdlib only (runs in the original Mooncake's venv too).
"""

from __future__ import annotations

import hashlib
import struct
from typing import NamedTuple

MAGIC = b"MCv1"
_HDR = struct.Struct("<4sHHHIHI")
_SUM = 8
OVERHEAD = _HDR.size + _SUM  # plus the key's bytes
FOREIGN = ("short", "bad-magic", "bad-length", "bad-checksum", "wrong-key")  # Decoded.status values


class WriteId(NamedTuple):
    """Identity of one write: unique across the run (writer slot, its incarnation, thread, seq)."""

    writer: int
    incarnation: int
    thread: int
    seq: int

    def __str__(self) -> str:
        return f"{self.writer}.{self.incarnation}.{self.thread}.{self.seq}"

    @classmethod
    def parse(cls, s: str) -> "WriteId":
        a, b, c, d = (int(x) for x in s.split("."))
        return cls(a, b, c, d)


class Decoded(NamedTuple):
    """``status`` is "ok" (then ``wid`` is the write), or why the bytes are foreign:
    "short", "bad-magic", "bad-length", "bad-checksum", "wrong-key" (``wid`` set from the header
    when it parses: whose bytes they start with -- a diagnosis, not a valid read)."""

    status: str
    wid: WriteId | None
    detail: str = ""


def min_size(key: str) -> int:
    return OVERHEAD + len(key.encode())


def encode(key: str, wid: WriteId, size: int) -> bytes:
    """A value of exactly ``max(size, min_size(key))`` bytes describing itself."""
    kb = key.encode()
    body_len = max(0, size - OVERHEAD - len(kb))
    head = _HDR.pack(MAGIC, wid.writer, wid.incarnation, wid.thread, wid.seq, len(kb), body_len) + kb
    unit = hashlib.blake2b(head, digest_size=32).digest()
    body = (unit * (body_len // 32 + 1))[:body_len]
    out = head + body
    return out + hashlib.blake2b(out, digest_size=_SUM).digest()


def decode(key: str, data: bytes | bytearray | memoryview) -> Decoded:
    """Check ``data`` read for ``key``; never raises."""
    data = bytes(data)
    if len(data) < _HDR.size + _SUM:
        return Decoded("short", None, f"{len(data)} bytes")
    magic, w, inc, t, seq, klen, blen = _HDR.unpack_from(data)
    if magic != MAGIC:
        return Decoded("bad-magic", None, repr(data[:8]))
    wid = WriteId(w, inc, t, seq)  # whose header it is: which write's bytes are these (diagnosis)
    if _HDR.size + klen + blen + _SUM != len(data):
        return Decoded("bad-length", wid, f"header says {_HDR.size + klen + blen + _SUM}, read {len(data)}")
    if hashlib.blake2b(data[:-_SUM], digest_size=_SUM).digest() != data[-_SUM:]:
        return Decoded("bad-checksum", wid, "")
    got_key = data[_HDR.size:_HDR.size + klen].decode(errors="replace")
    if got_key != key:
        return Decoded("wrong-key", wid, f"value of {got_key!r}")
    return Decoded("ok", wid)
