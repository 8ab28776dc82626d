"""TCP wire format (pure encoding, no I/O).

Every message starts with a fixed header carrying a magic and a version, so garbage or a
peer of another release is recognised on the first bytes: a bad magic closes the
connection; a version mismatch is answered with an error naming both versions.

Request  (40 bytes): magic u32 | version u16 | op u8 | flags u8 | req_id u64 | addr u64 |
                     length u64 | aux_len u32 | reserved u32
                     then aux_len bytes of aux (JSON for control ops), then for WRITE the
                     ``length`` payload bytes.
Response (32 bytes): magic u32 | version u16 | op u8 | flags u8 | req_id u64 | status i32 |
                     aux_len u32 | length u64
                     then aux_len bytes (error text or JSON), then for a successful READ the
                     ``length`` payload bytes.

Vectored data ops (WRITEV / READV, see ``tcp_vec.py``): ``addr`` is 0, the aux is the packed
block list (``(remote_addr u64, length u64)`` per block, at most 1024 blocks), ``length`` is
the sum of the block lengths; a WRITEV carries that many payload bytes after the aux, a
successful READV reply carries them after its header. Adding these ops kept WIRE_VERSION 1:
a current target answers any op it does not know with BAD_REQUEST naming it (then closes
the connection, whose remaining bytes it cannot interpret); an older one closes it.

AUTH (``MOONCAKE_AUTH_TOKEN`` set on the target, see ``mooncake_core.auth``): the first
exchange of a connection. An AUTH with an empty aux asks for a challenge, answered OK with a
16-byte nonce in the aux (an empty aux: this target requires no token); an AUTH whose aux is
``HMAC-SHA256(token, "mooncake-te-rpc-v1|" + nonce)`` is answered OK or UNAUTHORIZED. A target
with a token answers any other request of an unauthenticated connection UNAUTHORIZED (with
the reason) and closes it.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

MAGIC = 0x4D435445  # "MCTE"
WIRE_VERSION = 1
MAX_AUX = 1 << 20  # control payloads (descriptors, notifies) are small; anything bigger is garbage

REQ = struct.Struct("<IHBBQQQII")
RESP = struct.Struct("<IHBBQiIQ")


class Op(enum.IntEnum):
    WRITE = 1
    READ = 2
    GET_DESC = 3
    PROBE = 4
    NOTIFY = 5
    WRITEV = 6
    READV = 7
    AUTH = 8


#: every opcode's wire value: the request check is one set lookup (the hot path of the rpc server)
OP_VALUES: frozenset[int] = frozenset(int(op) for op in Op)


class Status(enum.IntEnum):
    OK = 0
    OUT_OF_BOUNDS = -10
    BAD_REQUEST = -600
    VERSION_MISMATCH = -601
    UNAUTHORIZED = -602
    NOT_FOUND = -101
    INTERNAL = -1


class WireError(Exception):
    """Bytes that are not a valid message: the connection must be dropped."""


@dataclass
class Request:
    op: int
    req_id: int
    addr: int = 0
    length: int = 0
    aux_len: int = 0
    version: int = WIRE_VERSION
    flags: int = 0

    def pack(self) -> bytes:
        return REQ.pack(MAGIC, self.version, self.op, self.flags, self.req_id, self.addr,
                        self.length, self.aux_len, 0)


@dataclass
class Response:
    op: int
    req_id: int
    status: int = 0
    aux_len: int = 0
    length: int = 0
    version: int = WIRE_VERSION

    def pack(self) -> bytes:
        return RESP.pack(MAGIC, self.version, self.op, 0, self.req_id, self.status,
                         self.aux_len, self.length)


def unpack_request(buf: bytes | bytearray | memoryview) -> Request:
    """Decode a request header; raise WireError on garbage (wrong magic, unknown op, huge aux)."""
    magic, ver, op, flags, req_id, addr, length, aux_len, _ = REQ.unpack(buf)
    if magic != MAGIC:
        raise WireError(f"bad magic {magic:#010x} (expected {MAGIC:#010x}): not a Mooncake TE peer")
    if aux_len > MAX_AUX:
        raise WireError(f"aux length {aux_len} exceeds limit {MAX_AUX}")
    if ver == WIRE_VERSION and op not in OP_VALUES:
        raise WireError(f"unknown op {op}")
    return Request(op, req_id, addr, length, aux_len, ver, flags)


def unpack_response(buf: bytes | bytearray | memoryview) -> Response:
    magic, ver, op, _flags, req_id, status, aux_len, length = RESP.unpack(buf)
    if magic != MAGIC:
        raise WireError(f"bad magic {magic:#010x} in response (expected {MAGIC:#010x})")
    if aux_len > MAX_AUX:
        raise WireError(f"aux length {aux_len} exceeds limit {MAX_AUX}")
    return Response(op, req_id, status, aux_len, length, ver)


def version_mismatch_message(theirs: int) -> str:
    return (f"wire version mismatch: peer speaks version {theirs}, this engine speaks version "
            f"{WIRE_VERSION}; run the same release on both ends")
