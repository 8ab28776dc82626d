"""``concat_arrays_into`` (the original's ``mooncake._fast_copy``): arrays packed end to end
into caller memory, exactly, or a ValueError before anything is written (pure: no store)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from mooncake_core.store.fast_copy import concat_arrays_into


def test_concat_arrays_into_packs_the_selected_run_exactly() -> None:
    rng = np.random.default_rng(7)
    arrays = [rng.integers(0, 255, n, dtype=np.uint8) for n in (3, 0, 17, 5)] + [np.arange(6, dtype=np.float64)]
    want = b"".join(a.tobytes() for a in arrays[1:4])
    dst = ctypes.create_string_buffer(len(want) + 8)
    assert concat_arrays_into(arrays, ctypes.addressof(dst), len(want), 1, 3) == len(want)
    assert dst.raw[:len(want)] == want and dst.raw[len(want):] == b"\0" * 8
    full = b"".join(a.tobytes() for a in arrays)
    dst = ctypes.create_string_buffer(len(full))
    assert concat_arrays_into(arrays, ctypes.addressof(dst), len(full)) == len(full) and dst.raw == full
    assert concat_arrays_into(arrays, ctypes.addressof(dst), 0, 9, 4) == 0  # start past the end: nothing


def test_concat_arrays_into_refuses_before_writing() -> None:
    dst = ctypes.create_string_buffer(b"\x07" * 7, 7)
    with pytest.raises(ValueError, match="destination buffer too small: need 8 bytes, got 7"):
        concat_arrays_into([np.ones(4, np.uint8), np.ones(4, np.uint8)], ctypes.addressof(dst), 7)
    with pytest.raises(ValueError, match=r"arrays\[1\] is not C-contiguous"):
        concat_arrays_into([np.ones(2, np.uint8), np.arange(8, dtype=np.uint8)[::2]], ctypes.addressof(dst), 7)
    assert dst.raw == b"\x07" * 7
