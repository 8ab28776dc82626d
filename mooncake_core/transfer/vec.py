"""Vectorised batch handling (pure logic, numpy, no I/O).

Why: SGLang hands the engine one ``batch_transfer_sync`` of tens of thousands of 4-16 KiB
blocks (every KV page of every layer, scattered destination pages). Building one Python
object per block, bounds-checking each with a bisect and wrapping each in a ctypes
``iovec`` cost more CPU than the kernel copy itself (~5 us per block). Here the three
address lists become int64 arrays once, validation is a few array comparisons, adjacent
ranges are merged, and the iovec arrays handed to ``process_vm_writev`` are slices of two
interleaved ``(base, len)`` uint64 arrays -- no per-block Python work after conversion.

Anything unusual (values that do not fit int64, an invalid entry, a range outside the
target's regions) makes these helpers answer ``None``/``False`` so the engine takes its
general per-request path, which produces the exact error message for the offending entry.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

#: batches shorter than this take the per-request path (array set-up is not worth it)
VEC_MIN = 64


def as_arrays(buffers: Any, peers: Any, lengths: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(local, remote, length) as int64 arrays, or None when the lists are of different
    lengths or hold something that is not a plain integer in int64 range."""
    try:
        n = len(buffers)
        if n != len(peers) or n != len(lengths):
            return None
        out = []
        for x in (buffers, peers, lengths):
            a = np.asarray(x)
            if a.ndim != 1 or a.dtype.kind not in "iu" or len(a) != n:
                return None
            if a.dtype != np.int64:
                if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
                    return None
                a = a.astype(np.int64)
            out.append(a)
    except (TypeError, ValueError, OverflowError):
        return None
    return out[0], out[1], out[2]


def locals_ok(local: np.ndarray, remote: np.ndarray, length: np.ndarray) -> bool:
    """Same rule as the engine's per-request check: local > 0, remote >= 0, length >= 0."""
    return bool((local > 0).all() and (remote >= 0).all() and (length >= 0).all())


def region_arrays(desc: Any) -> tuple[np.ndarray, np.ndarray]:
    """Sorted region starts / ends of a descriptor, cached on it (rebuilt if buffers change)."""
    cache = desc.__dict__.get("_vec_index")
    if cache is None or cache[2] != len(desc.buffers):
        starts, ends = region_index(desc.buffers)
        cache = desc.__dict__["_vec_index"] = (starts, ends, len(desc.buffers))
    return cache[0], cache[1]


def region_index(regions: Any) -> tuple[np.ndarray, np.ndarray]:
    """Sorted starts / ends of registered regions (objects with ``addr`` and ``length``)."""
    regs = sorted(regions, key=lambda r: r.addr)
    return (np.array([r.addr for r in regs], dtype=np.int64),
            np.array([r.addr + r.length for r in regs], dtype=np.int64))


def drop_empty(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """The entries whose length (the last array) is > 0, in every array."""
    length = arrays[-1]
    if len(length) and not (length > 0).all():
        keep = length > 0
        return tuple(a[keep] for a in arrays)
    return arrays


def group_bounds(length: np.ndarray, max_bytes: int, max_items: int) -> tuple[list[int], list[int]]:
    """Cut consecutive entries (lengths > 0) into groups of at most ``max_items`` entries,
    a new group starting whenever the running total crosses a ``max_bytes`` boundary.
    Returns (bounds, nbytes): group ``k`` is entries ``bounds[k]:bounds[k+1]`` moving
    ``nbytes[k]`` bytes."""
    n = len(length)
    if n == 0:
        return [0], []
    cum = np.cumsum(length)
    group = (cum - length) // max_bytes  # entries starting in the same max_bytes window
    starts = np.union1d(np.flatnonzero(np.diff(group)) + 1, np.arange(0, n, max_items))
    bounds = starts.tolist() + [n]
    ends_cum = cum[np.asarray(bounds[1:]) - 1]
    return bounds, np.diff(np.concatenate(([0], ends_cum))).tolist()


def in_bounds(desc: Any, remote: np.ndarray, length: np.ndarray) -> bool:
    """Is every [remote, remote+length) inside one published region (as ``find_region``)?"""
    starts, ends = region_arrays(desc)
    if not len(starts):
        return not len(remote)
    i = np.searchsorted(starts, remote, side="right") - 1
    if (i < 0).any():
        return False
    return bool((remote + length <= ends[i]).all())


def coalesce(local: np.ndarray, remote: np.ndarray, length: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Drop empty entries and merge runs where both sides continue the previous entry."""
    local, remote, length = drop_empty(local, remote, length)
    if len(length) < 2:
        return local, remote, length
    cont = (local[:-1] + length[:-1] == local[1:]) & (remote[:-1] + length[:-1] == remote[1:])
    if not cont.any():
        return local, remote, length
    first = np.concatenate(([True], ~cont))
    starts = np.flatnonzero(first)
    return local[starts], remote[starts], np.add.reduceat(length, starts)


def split_long(local: np.ndarray, remote: np.ndarray, length: np.ndarray, max_len: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut entries longer than ``max_len`` into pieces of at most ``max_len`` (order kept)."""
    if not len(length) or int(length.max()) <= max_len:
        return local, remote, length
    nseg = (length + max_len - 1) // max_len
    idx = np.repeat(np.arange(len(length)), nseg)
    first = np.repeat(np.cumsum(nseg) - nseg, nseg)
    off = (np.arange(len(idx)) - first) * max_len
    return local[idx] + off, remote[idx] + off, np.minimum(max_len, length[idx] - off)


class Plan(NamedTuple):
    """A batch laid out for vectored syscalls: chunk ``k`` is iovec entries
    ``bounds[k]:bounds[k+1]`` of ``local_iov`` / ``remote_iov`` and moves ``nbytes[k]``."""

    local_iov: np.ndarray  # (n, 2) uint64: iov_base, iov_len
    remote_iov: np.ndarray
    bounds: list[int]
    nbytes: list[int]
    total: int


def plan_chunks(local: np.ndarray, remote: np.ndarray, length: np.ndarray, *,
                chunk_bytes: int, max_iov: int) -> Plan:
    """Coalesce, split, and cut into chunks of about ``chunk_bytes`` and at most ``max_iov``
    entries -- small enough that whichever thread is free picks up the next one."""
    local, remote, length = coalesce(local, remote, length)
    local, remote, length = split_long(local, remote, length, chunk_bytes)
    n = len(length)
    liov = np.empty((n, 2), dtype=np.uint64)
    riov = np.empty((n, 2), dtype=np.uint64)
    liov[:, 0] = local
    riov[:, 0] = remote
    liov[:, 1] = length
    riov[:, 1] = length
    bounds, nbytes = group_bounds(length, chunk_bytes, max_iov)
    return Plan(liov, riov, bounds, nbytes, int(length.sum()) if n else 0)
