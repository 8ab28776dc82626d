"""Raw memory helpers of the store client (ctypes; no store state).

Why they exist: the store moves bytes between *addresses*, as the C++ client does, so any
buffer-protocol object is a source or destination without a staging copy. ``new_bytes``
fills a fresh ``bytes`` in place (what C extensions do); ``spans`` maps an object's bytes
onto the caller's parts; ``fingerprints`` sample ranges so a re-report after a master
change never publishes memory that was reused meanwhile; ``populate_range`` faults pages in
with one syscall before a transfer writes there.
"""

from __future__ import annotations

import ctypes
import mmap
import operator
import struct
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from mooncake_core import envs
from mooncake_core.transfer import device_memory
from mooncake_core.store.offload import mem_view

__all__ = ["PAGE", "PREFAULT_MIN", "buffer_addr", "bytes_addr", "bytes_addrs", "fingerprint", "fingerprint_in",
           "fingerprints", "host_bytes", "madvise_populate", "memmove", "new_bytes", "populate_range",
           "prefault_enabled", "spans"]

_memmove = ctypes.memmove


def memmove(dst: int, src: int, n: int) -> None:
    """``ctypes.memmove``, or a device copy when either side is registered GPU memory (a vLLM
    store connector's KV blocks on the GPU: ``register_buffer`` registers them as ``cuda:N``).
    One flag check on host-only processes."""
    if device_memory.active():
        device_memory.copy_any(dst, src, n)
    else:
        _memmove(dst, src, n)


def host_bytes(addr: int, n: int) -> bytes:
    """A copy of ``n`` bytes at ``addr`` (host or registered GPU memory) as ``bytes``."""
    out = bytearray(n)
    if n:
        memmove(buffer_addr(out, "host_bytes")[0], addr, n)
    return bytes(out)
_PyBytes_FromStringAndSize = ctypes.pythonapi.PyBytes_FromStringAndSize
_PyBytes_FromStringAndSize.restype = ctypes.py_object
_PyBytes_FromStringAndSize.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)


def _bytes_addr_ctypes(b: bytes) -> int:
    return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value or 0


def _payload_offset() -> int | None:
    """Offset of a bytes object's payload from its ``id`` in this CPython (the header size),
    when it is the same for every probe; None elsewhere (then ctypes is asked every time)."""
    probes = [b"x" * n for n in (1, 7, 100, 5000)]
    offs = {_bytes_addr_ctypes(b) - id(b) for b in probes}
    return offs.pop() if len(offs) == 1 else None


_BYTES_PAYLOAD = _payload_offset() if sys.implementation.name == "cpython" else None


def bytes_addr(b: bytes) -> int:
    """Address of a bytes object's payload (no copy). In CPython that is ``id(b)`` plus the
    object header (checked at import): ~30x cheaper than the ctypes round trip, which was a
    noticeable share of a batch of small puts."""
    if _BYTES_PAYLOAD is not None and b.__class__ is bytes:
        return id(b) + _BYTES_PAYLOAD
    return _bytes_addr_ctypes(b)


def bytes_addrs(values: list[bytes]) -> list[int]:
    """``bytes_addr`` of every bytes object of ``values`` (exact ``bytes`` only)."""
    off = _BYTES_PAYLOAD
    if off is None:
        return [_bytes_addr_ctypes(b) for b in values]
    return [i + off for i in map(id, values)]


def new_bytes(size: int) -> tuple[bytes, int]:
    """A fresh, not-yet-shared bytes object of ``size`` and its payload address.

    Filling it in place before handing it out is what C extensions do; it spares the
    copy that ``bytes(bytearray)`` would make of every payload we receive.
    """
    b = _PyBytes_FromStringAndSize(None, size)
    return b, bytes_addr(b)


def buffer_addr(value: Any, what: str) -> tuple[int, int, Any]:
    """(address, nbytes, keepalive) of any contiguous buffer-protocol object."""
    if isinstance(value, bytes):
        return bytes_addr(value), len(value), value
    try:
        mv = memoryview(value)
    except TypeError:
        raise TypeError(f"{what}: expected a bytes-like object, got {type(value).__name__}") from None
    if not mv.contiguous:
        raise ValueError(f"{what}: buffer must be contiguous")
    nbytes = mv.nbytes
    if nbytes == 0:
        return 0, 0, mv
    arr = np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, dtype=np.uint8)
    return int(arr.ctypes.data), nbytes, (mv, arr)


def spans(parts: Sequence[tuple[int, int]], base: int, total: int) -> list[tuple[int, int, int]]:
    """Map the object bytes ``[0, total)`` onto ``parts`` (local (addr, len) pieces laid end
    to end): ``(local_addr, base + object_offset, length)`` per piece that is used."""
    out = []
    off = 0
    for addr, n in parts:
        if off >= total:
            break
        m = min(n, total - off)
        if m > 0:
            out.append((addr, base + off, m))
        off += m
    return out


#: 8-byte words sampled per object: the first ``FP_HEAD`` words back to back, the others
#: spread evenly from there to its last word (they overlap, covering every byte, for objects up
#: to 504 bytes; a 1 KiB one every other word). Why the dense head: a smaller object written
#: later at the same address overwrites only the start of the old one, and values often share
#: their first word (a format's magic, a writer id) -- with one word sampled at the start, such
#: an overwrite went unseen and the old key was re-reported over the new bytes (chaos CI run).
FP_WORDS = 64
FP_HEAD = 4
#: fixed odd weights: the fingerprint is sum(word_k * w_k) + size * w_last (mod 2^64), so a
#: change of any sampled word changes it (odd weights are invertible mod 2^64)
_FP_W = np.random.default_rng(0x6D6F6F6E63616B65).integers(0, 1 << 62, FP_WORDS + 1, dtype=np.uint64) * 2 + 1
_FP_K = np.arange(FP_WORDS, dtype=np.int64)
_FP_TAIL = np.maximum(_FP_K - FP_HEAD, 0)  # per sample: its step in the evenly spread part
_FP_IS_HEAD = _FP_K < FP_HEAD


def _fp_offsets(sizes: np.ndarray) -> np.ndarray:
    """The sampled words' offsets in objects of ``sizes`` (>= 8 bytes): shape (len, FP_WORDS),
    or (FP_WORDS,) for a 0-d ``sizes``. Every offset lies in ``[0, size - 8]``."""
    last = np.asarray(sizes, np.int64)[..., None] - 8
    head = np.minimum(8 * _FP_K, last)
    start = 8 * FP_HEAD  # the spread part starts after the head and ends at the last word
    tail = start + np.maximum(last - start, 0) * _FP_TAIL // (FP_WORDS - FP_HEAD - 1)
    out = np.where(_FP_IS_HEAD, head, np.minimum(tail, last))
    return out[0] if out.shape[0] == 1 and np.ndim(sizes) == 0 else out
_MASK64 = 0xFFFFFFFFFFFFFFFF


def fingerprint(addr: int, size: int) -> int:
    """Cheap sampled fingerprint of ``[addr, addr+size)`` (see ``fingerprints``).

    Recorded at put time and re-checked before re-reporting an object after a master
    restart, so that a range whose memory was meanwhile reused is never re-published.
    """
    if size <= 0:
        return 0
    return int(fingerprints(mem_view(addr, size), np.zeros(1, np.int64), np.array([size], np.int64))[0])


_FP_W_INT = [int(w) for w in _FP_W]
_FP_STRUCTS: dict[int, struct.Struct | None] = {}


def _fp_struct(size: int) -> struct.Struct | None:
    """One ``Struct`` reading the ``FP_WORDS`` sampled words of a ``size``-byte object (pad
    bytes between them), or None when they overlap (objects under ~512 bytes)."""
    st = _FP_STRUCTS.get(size, False)
    if st is False:
        ats = _fp_offsets(np.int64(size)).tolist()
        gaps = [b - a - 8 for a, b in zip(ats, ats[1:])]
        st = None if min(gaps) < 0 else struct.Struct("<" + "".join(
            f"Q{g}x" if g else "Q" for g in gaps) + "Q")
        if len(_FP_STRUCTS) < 4096:
            _FP_STRUCTS[size] = st
    return st  # type: ignore[return-value]


def fingerprint_in(mem: Any, off: int, size: int) -> int:
    """``fingerprints`` of the one object ``[off, off + size)`` of ``mem``: the same value, in
    plain Python (one ``struct`` unpack and 64 multiplications, ~5 us) -- the numpy path costs
    tens of microseconds of fixed overhead for a single object, a share of every single put."""
    st = _fp_struct(size) if size >= 8 else None
    if st is None or off < 0 or off + size > len(mem):
        return int(fingerprints(mem, np.array([off], np.int64), np.array([size], np.int64))[0])
    w = _FP_W_INT
    return (sum(map(operator.mul, st.unpack_from(mem, off), w)) + size * w[FP_WORDS]) & _MASK64


def fingerprints(mem: Any, offs: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Fingerprints (``uint64``) of the objects ``[offs[i], offs[i] + sizes[i])`` of the byte
    buffer ``mem``, all at once: ``FP_WORDS`` unaligned 8-byte words per object (see
    ``FP_WORDS``), weighted and summed. Why not a hash per object: a batch of 1,000 small puts
    spent more CPU hashing (blake2b, ~3 us per KiB object in CPython) than writing. Objects
    of one size laid end to end (a batch put) are read through one strided view, others by a
    numpy gather; both give the same values. Objects under 8 bytes are zero-padded, empty
    ones fingerprint as 0."""
    n = len(offs)
    out = np.zeros(n, np.uint64)
    if not n:
        return out
    offs = np.asarray(offs, np.int64)
    sizes = np.asarray(sizes, np.int64)
    buf = np.frombuffer(mem, np.uint8)
    if int(sizes.min()) < 8:
        for i in np.flatnonzero(sizes < 8).tolist():
            o, m = int(offs[i]), int(sizes[i])
            if m > 0:
                word = int.from_bytes(bytes(buf[o:o + m]), "little")
                out[i] = (word * int(_FP_W[0]) + m * int(_FP_W[-1])) & _MASK64
        big = np.flatnonzero(sizes >= 8)
        if len(big):
            out[big] = fingerprints(mem, offs[big], sizes[big])
        return out
    if len(buf) < 8 or int((offs + sizes).max()) > len(buf) or int(offs.min()) < 0:
        raise ValueError("fingerprints: an object lies outside the buffer")
    words = np.ndarray(shape=(len(buf) - 7,), dtype=np.uint64, buffer=buf, strides=(1,))
    w = _FP_W[:FP_WORDS]
    size0 = int(sizes[0])
    if n > 1 and bool((sizes == size0).all()) and bool((np.diff(offs) == size0).all()):
        start = int(offs[0])
        if n >= _STRIDED_MIN:
            # laid end to end: sample k of every object is one strided slice (64 numpy calls)
            acc = np.zeros(n, np.uint64)
            for k, at in enumerate(_fp_offsets(np.int64(size0)).tolist()):
                acc += words[start + at:start + at + (n - 1) * size0 + 1:size0] * w[k]
        else:
            # fewer objects: one (objects x samples) take from a strided 2-D view (~2x cheaper
            # than the strided slices or the general gather below for 100 objects)
            rows = np.lib.stride_tricks.as_strided(words[start:], shape=(n, size0 - 7), strides=(size0, 1))
            acc = (rows[:, _fp_offsets(np.int64(size0))] * w).sum(axis=1, dtype=np.uint64)
    else:
        pos = offs[:, None] + _fp_offsets(sizes)
        acc = (words[pos] * w).sum(axis=1, dtype=np.uint64)
    return acc + sizes.astype(np.uint64) * _FP_W[FP_WORDS]


#: objects from which a batch laid end to end is fingerprinted by strided slices
_STRIDED_MIN = 512
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_libc: Any = None


def madvise_populate(addr: int, length: int) -> bool:
    """Fault in writable pages of ``[addr, addr+length)`` without changing their contents."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        _libc.madvise.restype = ctypes.c_int
    return _libc.madvise(addr, length, _MADV_POPULATE_WRITE) == 0  # ctypes drops the GIL


PAGE = mmap.PAGESIZE
PREFAULT_MIN = 1 << 20


def prefault_enabled() -> bool:
    """``MC_STORE_PREFAULT`` (default on; ``0`` off), Linux only: fault pages in with one
    madvise before a transfer writes there, and populate a fresh segment in the background."""
    return envs.MC_STORE_PREFAULT and sys.platform.startswith("linux")


def populate_range(addr: int, size: int) -> None:
    """Fault in the whole pages inside ``[addr, addr+size)`` in one syscall before a transfer
    writes there: cheaper than taking each page fault inside process_vm_readv/recv."""
    lo = (addr + PAGE - 1) & ~(PAGE - 1)
    hi = (addr + size) & ~(PAGE - 1)
    if hi > lo:
        madvise_populate(lo, hi - lo)
