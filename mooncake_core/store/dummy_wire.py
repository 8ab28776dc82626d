"""The dummy client <-> ``mooncake_client`` protocol (pure: no sockets, no memory access).

A *dummy* client (``MooncakeDistributedStore.setup_dummy``) is an engine process that keeps no
segment of its own: it forwards every store call to the node's standing service
(``mooncake_client``, the "real client") over a local Unix socket, and the bytes move through
shared memory both processes map (memfd regions the dummy creates and passes with
``SCM_RIGHTS``). This module is what the two sides agree on:

* framing (a 4-byte little-endian length, then one msgpack message) and the message types,
  versioned (``WIRE_VERSION``: a mismatch is refused naming both versions);
* for every forwarded store method, which arguments are *addresses* in the dummy's memory
  (``PTR_LAYOUTS``) and what the method answers when the call cannot be made (``FAILURE``):
  the service translates those addresses into its own mapping of the dummy's regions, after
  checking the whole extent lies in one region (a bad pointer is refused with -600, it never
  makes the service read or write outside what the dummy shared);
* ``RegionMap``: that translation, both ways.

Why msgspec: typed, versioned structs with a tagged union decode in microseconds, which
matters on a path whose 4 KiB put is a few tens of microseconds.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = ["AUTH_CONTEXT", "Ack", "Attach", "Attached", "Call", "Challenge", "ERR_INVALID", "ERR_RPC", "EXT_BUFFER",
           "EXT_CONFIG", "EXT_STAGED", "EXT_TENSOR", "EXT_VIEW", "FAILURE", "HEADER", "MapRegion", "Message",
           "PTR_LAYOUTS", "Ping", "Pong", "RegionMap", "Reply", "TranslateError", "UnmapRegion", "WIRE_VERSION",
           "decode", "encode_frame", "failure_value", "ipc_name", "translate_arguments"]

#: bumped whenever a message or an ext payload changes shape
WIRE_VERSION = 1
#: the auth context of this channel (auth.prove/verify): a proof made for another channel is refused
AUTH_CONTEXT = "mooncake-dummy-ipc-v1"
#: frame header: payload length
HEADER = struct.Struct("<I")
#: the store's codes this protocol answers with (codes.py)
ERR_INVALID = -600
ERR_RPC = -900

# msgpack ext codes inside Call args / Reply values
EXT_TENSOR = 1   # a tensor by value: (dtype, shape, bytes | staged ref)
EXT_CONFIG = 2   # a ReplicateConfig: {field: value}
EXT_BUFFER = 3   # a BufferHandle's bytes
EXT_STAGED = 4   # (offset, length) in the connection's staging window
EXT_VIEW = 5     # a tensor viewing the dummy's own memory: (dummy address, nbytes, dtype, shape)
EXT_TASK = 6     # a QueryTaskResponse: (id, type, status, created ms, updated ms, client, message)


def ipc_name(port: int) -> str:
    """The abstract Unix socket a service on ``port`` listens on (per network namespace, as the
    TCP port is; no file to clean up after a crash)."""
    return f"\0mooncake_core_client_{port}"


class Challenge(msgspec.Struct, tag=True):
    """Service -> dummy, first message of a connection."""
    version: int
    nonce: bytes
    auth_required: bool
    service_id: str


class Attach(msgspec.Struct, tag=True):
    """Dummy -> service: who I am. ``proof`` answers the nonce when auth is on."""
    version: int
    client_id: str
    pid: int
    proof: bytes = b""


class Attached(msgspec.Struct, tag=True):
    service_id: str
    segment_name: str
    #: regions of this client the service has mapped (a fresh service has none: re-register)
    known_regions: list[int]


class MapRegion(msgspec.Struct, tag=True):
    """Dummy -> service, sent with the memfd: map ``size`` bytes that are ``base`` in the dummy.
    ``window``: this connection's staging window (bulk bytes of put/get go there)."""
    base: int
    size: int
    window: bool = False


class UnmapRegion(msgspec.Struct, tag=True):
    base: int


class Call(msgspec.Struct, tag=True):
    method: str
    args: list[Any]
    kwargs: dict[str, Any] = {}


class Ping(msgspec.Struct, tag=True):
    pass


class Pong(msgspec.Struct, tag=True):
    service_id: str
    healthy: int


class Ack(msgspec.Struct, tag=True):
    code: int = 0
    message: str = ""


class Reply(msgspec.Struct, tag=True):
    """A call's answer: ``value``, or ``error`` = (exception type name, message) to re-raise
    (TypeError / ValueError as the full client raises them)."""
    value: Any = None
    error: tuple[str, str] | None = None


Message = Challenge | Attach | Attached | MapRegion | UnmapRegion | Call | Ping | Pong | Ack | Reply


def encode_frame(enc: msgspec.msgpack.Encoder, msg: Message) -> bytes:
    body = enc.encode(msg)
    return HEADER.pack(len(body)) + body


def decode(dec: msgspec.msgpack.Decoder[Any], body: bytes | memoryview) -> Message:
    return dec.decode(body)  # type: ignore[no-any-return]


# ------------------------------------------------------------------ addresses in arguments
@dataclass(frozen=True)
class One:
    """``ptr`` (an address) with extent ``size`` (a parameter name, or None: the extent is not
    read or written -- unregister)."""
    ptr: str
    size: str | None


@dataclass(frozen=True)
class Many:
    """Parallel lists ``ptrs`` / ``sizes``."""
    ptrs: str
    sizes: str


@dataclass(frozen=True)
class Nested:
    """Lists of lists ``ptrs`` / ``sizes`` (scatter-gather per key)."""
    ptrs: str
    sizes: str


@dataclass(frozen=True)
class Ranges:
    """``get_into_ranges``: buffer i's extent is the furthest ``dst + size`` of its ranges."""
    ptrs: str
    dst: str
    sizes: str


Layout = One | Many | Nested | Ranges

_ONE = (One("buffer_ptr", "size"),)
_MANY = (Many("buffer_ptrs", "sizes"),)
_NESTED = (Nested("all_buffer_ptrs", "all_sizes"),)

#: the store methods whose arguments carry addresses in the dummy's memory
PTR_LAYOUTS: dict[str, tuple[Layout, ...]] = {
    **{m: _ONE for m in (
        "put_from", "upsert_from", "get_into", "put_tensor_from", "upsert_tensor_from", "get_tensor_into",
        "put_tensor_with_tp_from", "get_tensor_with_tp_into", "put_tensor_with_parallelism_from",
        "upsert_tensor_with_parallelism_from", "get_tensor_with_parallelism_into", "register_buffer")},
    "unregister_buffer": (One("buffer_ptr", None),),
    "put_from_with_metadata": (One("buffer_ptr", "size"), One("metadata_buffer_ptr", "metadata_size")),
    **{m: _MANY for m in (
        "batch_put_from", "batch_upsert_from", "batch_get_into", "batch_put_tensor_from",
        "batch_upsert_tensor_from", "batch_get_tensor_into", "batch_put_tensor_with_tp_from",
        "batch_get_tensor_with_tp_into", "batch_put_tensor_with_parallelism_from",
        "batch_upsert_tensor_with_parallelism_from", "batch_get_tensor_with_parallelism_into")},
    **{m: _NESTED for m in (
        "batch_put_from_multi_buffers", "batch_upsert_from_multi_buffers", "batch_get_into_multi_buffers",
        "batch_put_from_multi_buffer_ranges", "batch_get_into_multi_buffer_ranges")},
    "get_into_ranges": (Ranges("buffer_ptrs", "all_dst_offsets", "all_sizes"),),
}


class TranslateError(ValueError):
    """An address argument the service cannot serve (outside every shared region, a size
    that is not an int, lists of different lengths); the message says which and why."""


class RegionMap:
    """Dummy regions the service mapped: dummy address <-> service address.

    Sorted by dummy base; lookups are a bisect. Not thread-safe (the owner locks)."""

    def __init__(self) -> None:
        self._bases: list[int] = []
        self._regions: dict[int, tuple[int, int]] = {}  # dummy base -> (size, local base)

    def add(self, base: int, size: int, local: int) -> None:
        if base in self._regions:
            raise ValueError(f"region at 0x{base:x} is already mapped")
        i = bisect.bisect_left(self._bases, base)
        if (i > 0 and self._end(self._bases[i - 1]) > base) or (i < len(self._bases) and base + size > self._bases[i]):
            raise ValueError(f"region 0x{base:x}+{size} overlaps a mapped region")
        self._bases.insert(i, base)
        self._regions[base] = (size, local)

    def remove(self, base: int) -> tuple[int, int] | None:
        """(size, local base) of the region that starts at ``base``, now forgotten; None if none."""
        r = self._regions.pop(base, None)
        if r is not None:
            self._bases.remove(base)
        return r

    def _end(self, base: int) -> int:
        return base + self._regions[base][0]

    def bases(self) -> list[int]:
        return list(self._bases)

    def region(self, base: int) -> tuple[int, int] | None:
        return self._regions.get(base)

    def find(self, addr: int) -> int | None:
        """Dummy base of the region holding ``addr``."""
        i = bisect.bisect_right(self._bases, addr) - 1
        if i < 0:
            return None
        b = self._bases[i]
        return b if addr < self._end(b) else None

    def to_local(self, addr: int, size: int) -> int:
        """The service address of ``[addr, addr+size)``; TranslateError unless it lies in one region."""
        if not isinstance(addr, int) or isinstance(addr, bool) or not isinstance(size, int) or size < 0:
            raise TranslateError(f"address {addr!r} / size {size!r}: expected non-negative integers")
        b = self.find(addr)
        if b is None:
            raise TranslateError(f"address 0x{addr:x} is not in memory shared with mooncake_client "
                                 f"(allocate it with alloc_from_mem_pool)")
        rsize, local = self._regions[b]
        if addr + size > b + rsize:
            raise TranslateError(f"0x{addr:x}+{size} runs past the end of its shared region "
                                 f"(0x{b:x}+{rsize})")
        return local + (addr - b)

    def to_dummy(self, local_addr: int) -> int | None:
        """The dummy address of a service address inside a mapped region, or None."""
        for b in self._bases:
            rsize, local = self._regions[b]
            if local <= local_addr < local + rsize:
                return b + (local_addr - local)
        return None


def _int_list(name: str, v: Any) -> list[Any]:
    if not isinstance(v, (list, tuple)):
        raise TranslateError(f"{name}: expected a list, got {type(v).__name__}")
    return list(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def translate_arguments(method: str, arguments: dict[str, Any], to_local: Callable[[int, int], int]) -> None:
    """Rewrite, in place, the address arguments of ``method`` (bound by parameter name) into
    service addresses. TranslateError names the argument that cannot be served. An address or
    size that is not an int at all is left as it is: the store refuses its type (TypeError, as
    a full client raises) before touching any memory."""
    def tr(ptr: Any, size: Any) -> Any:
        return to_local(ptr, size) if _is_int(ptr) and _is_int(size) else ptr

    for lay in PTR_LAYOUTS.get(method, ()):
        if isinstance(lay, One):
            if lay.ptr not in arguments:
                continue
            ptr = arguments[lay.ptr]
            size = arguments.get(lay.size, 0) if lay.size else 0
            try:
                arguments[lay.ptr] = tr(ptr, size)
            except TranslateError as e:
                raise TranslateError(f"{method}: {lay.ptr}: {e}") from None
        elif isinstance(lay, Many):
            ptrs = _int_list(lay.ptrs, arguments.get(lay.ptrs, []))
            sizes = _int_list(lay.sizes, arguments.get(lay.sizes, []))
            if len(ptrs) != len(sizes):
                raise TranslateError(f"{method}: {lay.ptrs} has {len(ptrs)} entries, {lay.sizes} {len(sizes)}")
            try:
                arguments[lay.ptrs] = [tr(p, s) for p, s in zip(ptrs, sizes)]
            except TranslateError as e:
                raise TranslateError(f"{method}: {lay.ptrs}: {e}") from None
        elif isinstance(lay, Nested):
            all_ptrs: list[Any] = _int_list(lay.ptrs, arguments.get(lay.ptrs, []))
            all_sizes: list[Any] = _int_list(lay.sizes, arguments.get(lay.sizes, []))
            if len(all_ptrs) != len(all_sizes):
                raise TranslateError(f"{method}: {lay.ptrs} has {len(all_ptrs)} lists, {lay.sizes} {len(all_sizes)}")
            out = []
            for i, (ps0, ss0) in enumerate(zip(all_ptrs, all_sizes)):
                ps, ss = _int_list(f"{lay.ptrs}[{i}]", ps0), _int_list(f"{lay.sizes}[{i}]", ss0)
                if len(ps) != len(ss):
                    raise TranslateError(f"{method}: {lay.ptrs}[{i}] has {len(ps)} entries, "
                                         f"{lay.sizes}[{i}] {len(ss)}")
                try:
                    out.append([tr(p, s) for p, s in zip(ps, ss)])
                except TranslateError as e:
                    raise TranslateError(f"{method}: {lay.ptrs}[{i}]: {e}") from None
            arguments[lay.ptrs] = out
        else:
            ptrs = _int_list(lay.ptrs, arguments.get(lay.ptrs, []))
            dst = _int_list(lay.dst, arguments.get(lay.dst, []))
            sizes = _int_list(lay.sizes, arguments.get(lay.sizes, []))
            bases: list[Any] = []
            for i, p in enumerate(ptrs):
                extent = 0
                try:
                    for offs, lens in zip(dst[i], sizes[i]):
                        for o, n in zip(offs, lens):
                            extent = max(extent, int(o) + int(n))
                except (IndexError, TypeError, ValueError):
                    extent = 0  # malformed ranges: the store answers them; only the base is mapped
                try:
                    bases.append(tr(p, extent))
                except TranslateError as e:
                    raise TranslateError(f"{method}: {lay.ptrs}[{i}]: {e}") from None
            arguments[lay.ptrs] = bases


# ------------------------------------------------------------------ what a call answers when it cannot be made
#: result shapes: "code" an int, "codes" one int per key, "bytes", "bytes_list", "none", "nones" one
#: None per key, "list" [], "dict" {}, "ranges" get_into_ranges' nested codes, "str" ""
FAILURE: dict[str, str] = {
    "get": "bytes", "get_batch": "bytes_list", "get_buffer": "none", "batch_get_buffer": "nones",
    "get_replica_desc": "list", "batch_get_replica_desc": "dict", "get_hostname": "str",
    "get_tensor": "none", "get_tensor_into": "none", "get_tensor_with_tp": "none", "get_tensor_with_tp_into": "none",
    "get_tensor_with_parallelism": "none", "get_tensor_with_parallelism_into": "none",
    "batch_get_tensor": "nones", "batch_get_tensor_into": "nones", "batch_get_tensor_with_tp": "nones",
    "batch_get_tensor_with_tp_into": "nones", "batch_get_tensor_with_parallelism": "nones",
    "batch_get_tensor_with_parallelism_into": "nones", "batch_replica_clear": "list", "get_into_ranges": "ranges",
    "put_batch": "code", "upsert_batch": "code", "batch_get_session_end": "code",
}


def failure_value(method: str, arguments: Sequence[Any], code: int) -> Any:
    """What ``method`` returns when the call could not be made (``code``: -900 service
    unreachable, -600 an argument refused), shaped as the full client answers that method.
    Batch methods answer per key: their first list argument sets the length."""
    kind = FAILURE.get(method)
    if kind is None:
        kind = "codes" if method.startswith("batch_") else "code"
    first_list = next((a for a in arguments if isinstance(a, (list, tuple))), [])
    n = len(first_list)
    if kind == "code":
        return code
    if kind == "codes":
        return [code] * n
    if kind == "bytes":
        return b""
    if kind == "bytes_list":
        return [b""] * n
    if kind == "none":
        return None
    if kind == "nones":
        return [None] * n
    if kind == "list":
        return []
    if kind == "dict":
        return {}
    if kind == "str":
        return ""
    # ranges: one code per requested range, per key, per buffer
    keys = arguments[1] if len(arguments) > 1 and isinstance(arguments[1], (list, tuple)) else []
    sizes = arguments[4] if len(arguments) > 4 and isinstance(arguments[4], (list, tuple)) else []
    out = []
    for b, ks in enumerate(keys):
        per_key = []
        for k in range(len(ks)):
            try:
                per_key.append([code] * len(sizes[b][k]))
            except (IndexError, TypeError):
                per_key.append([code])
        out.append(per_key)
    return out
