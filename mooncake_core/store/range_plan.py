"""Validation and planning of ranged reads/writes (pure logic, no I/O).

The ranged store methods take nested lists (buffer-major for ``get_into_ranges``, key-major
for the ``*_multi_buffer_ranges`` pair). Upstream answers a malformed *shape* with -600 in the
matching result slots rather than an exception, and reports each fragment separately, so a
bad fragment never spoils its neighbours. This module turns the nested arguments into a flat
list of :class:`Fragment` plus a result skeleton with those -600s already filled in; the I/O
layer then only has to execute fragments and write their byte counts back.

Wrong *types* (a str where a list of int belongs) still raise TypeError naming the argument:
those are programming errors, not data-dependent failures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mooncake_core.errors import ErrorCode

__all__ = ["Coverage", "Fragment", "KeyRanges", "plan_get_into_ranges", "plan_key_ranges"]

INVALID = int(ErrorCode.INVALID_PARAMS)


@dataclass(slots=True)
class Fragment:
    """One contiguous copy between object ``key`` at ``obj_off`` and local memory ``addr``.

    ``slot`` locates its result: ``(i, j, k)`` for get_into_ranges, ``(i, k)`` otherwise.
    """

    key: str
    addr: int
    obj_off: int
    size: int
    slot: tuple[int, ...]


@dataclass(slots=True)
class KeyRanges:
    """All fragments of one key in a ``*_multi_buffer_ranges`` call (result = their sum)."""

    index: int
    key: str
    frags: list[Fragment] = field(default_factory=list)


def _is_list(x: Any) -> bool:
    return isinstance(x, (list, tuple))


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what}: expected int, got {type(v).__name__} ({v!r:.60})")
    return int(v)


def _list(v: Any, what: str) -> Sequence[Any]:
    if not _is_list(v):
        raise TypeError(f"{what}: expected a list, got {type(v).__name__}")
    return v


def _key(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{what}: key must be str, got {type(v).__name__} ({v!r:.60})")
    return v


def plan_get_into_ranges(
    buffer_ptrs: Any, all_keys: Any, all_dst_offsets: Any, all_src_offsets: Any, all_sizes: Any,
    buffer_capacity: Callable[[int], int | None], warn: Callable[[str], None],
) -> tuple[list[list[list[int]]], list[Fragment]]:
    """Plan ``get_into_ranges``: ``(results skeleton, fragments to read)``.

    ``buffer_capacity(ptr)`` gives how many bytes may be written from ``ptr`` (its registered
    extent) or None when ``ptr`` is not in registered memory; fragments that would write past
    it (or into unregistered memory) get -600, as upstream does.
    """
    ptrs = [_int(p, f"get_into_ranges: buffer_ptrs[{i}]") for i, p in enumerate(_list(buffer_ptrs, "buffer_ptrs"))]
    keys2 = [list(_list(ks, f"get_into_ranges: all_keys[{i}]")) for i, ks in enumerate(_list(all_keys, "all_keys"))]
    dst3 = _list(all_dst_offsets, "get_into_ranges: all_dst_offsets")
    src3 = _list(all_src_offsets, "get_into_ranges: all_src_offsets")
    size3 = _list(all_sizes, "get_into_ranges: all_sizes")
    if not len(ptrs) == len(keys2) == len(dst3) == len(src3) == len(size3):
        warn(f"get_into_ranges: top-level size mismatch: {len(ptrs)} buffer_ptrs, {len(keys2)} all_keys, "
             f"{len(dst3)} all_dst_offsets, {len(src3)} all_src_offsets, {len(size3)} all_sizes")
        return [[[INVALID] for _ in keys2[i]] if i < len(keys2) and keys2[i] else [[INVALID]]
                for i in range(len(ptrs))], []
    results: list[list[list[int]]] = []
    frags: list[Fragment] = []
    for i, ptr in enumerate(ptrs):
        keys = [_key(k, f"get_into_ranges: all_keys[{i}]") for k in keys2[i]]
        d2 = _list(dst3[i], f"get_into_ranges: all_dst_offsets[{i}]")
        s2 = _list(src3[i], f"get_into_ranges: all_src_offsets[{i}]")
        z2 = _list(size3[i], f"get_into_ranges: all_sizes[{i}]")
        if not len(keys) == len(d2) == len(s2) == len(z2):
            warn(f"get_into_ranges: buffer {i}: {len(keys)} keys but {len(d2)}/{len(s2)}/{len(z2)} "
                 "dst/src/size lists")
            results.append([[INVALID] for _ in keys] or [[INVALID]])
            continue
        cap = buffer_capacity(ptr)
        row: list[list[int]] = []
        for j, key in enumerate(keys):
            d = [_int(x, f"get_into_ranges: all_dst_offsets[{i}][{j}]") for x in _list(d2[j], "all_dst_offsets")]
            s = [_int(x, f"get_into_ranges: all_src_offsets[{i}][{j}]") for x in _list(s2[j], "all_src_offsets")]
            z = [_int(x, f"get_into_ranges: all_sizes[{i}][{j}]") for x in _list(z2[j], "all_sizes")]
            if not len(d) == len(s) == len(z):
                warn(f"get_into_ranges: buffer {i} key {key!r}: {len(d)} dst offsets, {len(s)} src offsets, "
                     f"{len(z)} sizes (must match)")
                row.append([INVALID] * max(len(d), len(s), len(z), 1))
                continue
            cell = [0] * len(d)
            for k, (do, so, n) in enumerate(zip(d, s, z)):
                if do < 0 or so < 0 or n < 0:
                    warn(f"get_into_ranges: buffer {i} key {key!r} fragment {k}: negative offset/size")
                    cell[k] = INVALID
                elif cap is None:
                    warn(f"get_into_ranges: buffer {i} ({ptr:#x}) is not registered memory "
                         "(call register_buffer first)")
                    cell[k] = INVALID
                elif do + n > cap:
                    warn(f"get_into_ranges: buffer {i} key {key!r} fragment {k}: dst range [{do}, {do + n}) "
                         f"overflows the registered buffer ({cap} bytes)")
                    cell[k] = INVALID
                else:
                    frags.append(Fragment(key, ptr + do, so, n, (i, j, k)))
            row.append(cell)
        results.append(row)
    return results, frags


def plan_key_ranges(op: str, keys: Any, all_buffer_ptrs: Any, all_sizes: Any, all_offsets: Any,
                    warn: Callable[[str], None]) -> tuple[list[int], list[KeyRanges]]:
    """Plan a ``batch_{get_into,put_from}_multi_buffer_ranges`` call (key-major).

    Object ``keys[i]``'s range ``[all_offsets[i][k], +all_sizes[i][k])`` pairs with the local
    buffer ``all_buffer_ptrs[i][k]``. Returns ``(results skeleton, per-key plans)``.
    """
    keys = [_key(k, f"{op}: keys") for k in _list(keys, f"{op}: keys")]
    p2 = _list(all_buffer_ptrs, f"{op}: all_buffer_ptrs")
    z2 = _list(all_sizes, f"{op}: all_sizes")
    o2 = _list(all_offsets, f"{op}: offsets")
    if not len(keys) == len(p2) == len(z2) == len(o2):
        warn(f"{op}: {len(keys)} keys, {len(p2)} buffer lists, {len(z2)} size lists, {len(o2)} offset lists "
             "(must match)")
        return [INVALID] * len(keys), []
    results = [0] * len(keys)
    plans: list[KeyRanges] = []
    for i, key in enumerate(keys):
        p = [_int(x, f"{op}: all_buffer_ptrs[{i}]") for x in _list(p2[i], f"{op}: all_buffer_ptrs[{i}]")]
        z = [_int(x, f"{op}: all_sizes[{i}]") for x in _list(z2[i], f"{op}: all_sizes[{i}]")]
        o = [_int(x, f"{op}: offsets[{i}]") for x in _list(o2[i], f"{op}: offsets[{i}]")]
        if not len(p) == len(z) == len(o):
            warn(f"{op}: key {key!r}: {len(p)} buffers, {len(z)} sizes, {len(o)} offsets (must match)")
            results[i] = INVALID
            continue
        if any(x <= 0 for x in p) or any(x < 0 for x in z) or any(x < 0 for x in o):
            warn(f"{op}: key {key!r}: null buffer pointer or negative size/offset")
            results[i] = INVALID
            continue
        plans.append(KeyRanges(i, key, [Fragment(key, a, off, n, (i, k))
                                        for k, (a, n, off) in enumerate(zip(p, z, o))]))
    return results, plans


class Coverage:
    """Which bytes of a reserved object have been written (merged half-open intervals).

    A put session may only be ended once every byte is written: an unwritten hole would
    publish whatever the reused segment memory held before -- wrong bytes.
    """

    __slots__ = ("_iv",)

    def __init__(self) -> None:
        self._iv: list[tuple[int, int]] = []

    def add(self, start: int, length: int) -> None:
        if length <= 0:
            return
        iv = sorted([*self._iv, (start, start + length)])
        merged = [iv[0]]
        for a, b in iv[1:]:
            la, lb = merged[-1]
            if a <= lb:
                merged[-1] = (la, max(lb, b))
            else:
                merged.append((a, b))
        self._iv = merged

    def covered(self) -> int:
        return sum(b - a for a, b in self._iv)

    def complete(self, total: int) -> bool:
        return total == 0 or (len(self._iv) == 1 and self._iv[0] == (0, total))
