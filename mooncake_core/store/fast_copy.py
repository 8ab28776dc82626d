"""``concat_arrays_into``: pack a run of numpy arrays end to end into caller memory (the
original's ``mooncake._fast_copy`` helper, same arguments, result and errors).

Why: a batch of many small arrays (a structured-object row group, KV blocks) is sent as one
object; concatenating them with ``np.concatenate`` and then copying the result into a
registered buffer copies every byte twice. Here each array is copied once, straight to its
offset in the destination, with ``memmove`` (which releases the GIL). Threads are accepted for
the original's signature; one thread is enough here: the copies run at memory bandwidth.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mooncake_core.store.memory import memmove

__all__ = ["concat_arrays_into"]


def concat_arrays_into(arrays: list[Any], dest_ptr: int, dest_size: int, start: int = 0, count: int = -1,
                       nthreads: int = 1) -> int:
    """Copy ``arrays[start:start+count]`` (all by default) end to end to ``dest_ptr``;
    returns the bytes copied. ValueError when an array is not C-contiguous or the
    destination (``dest_size`` bytes) is too small -- checked before anything is written."""
    if not isinstance(arrays, list):
        raise TypeError(f"arrays must be a list of ndarrays, got {type(arrays).__name__}")
    n = len(arrays)
    start = min(max(start, 0), n)
    if count < 0 or start + count > n:
        count = n - start
    if count == 0:
        return 0
    picked = arrays[start:start + count]
    for i, a in enumerate(picked, start):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"arrays[{i}] is not an ndarray")
        if not a.flags.c_contiguous:
            raise ValueError(f"arrays[{i}] is not C-contiguous")
    total = sum(int(a.nbytes) for a in picked)
    if total > dest_size:
        raise ValueError(f"destination buffer too small: need {total} bytes, got {dest_size}")
    off = 0
    for a in picked:
        if a.nbytes:
            memmove(dest_ptr + off, int(a.ctypes.data), int(a.nbytes))
            off += int(a.nbytes)
    return off
