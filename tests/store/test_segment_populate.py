"""A store client's segment is populated before setup returns, within a time budget, and the
rest of a large one in the background (``StoreSegment``): real mmap, pages checked with
mincore(2)."""

from __future__ import annotations

import ctypes
import mmap
import sys

import pytest

from mooncake_core.store.segment import StoreSegment

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
MiB = 1 << 20


def resident(seg: StoreSegment) -> int:
    """Pages of ``seg`` in memory (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pages = seg.size // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(seg.addr), ctypes.c_size_t(seg.size), vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec)


def test_a_segment_is_populated_before_the_constructor_returns() -> None:
    seg = StoreSegment(16 * MiB)
    try:
        if seg._populater is None and resident(seg) == 0:
            pytest.skip("this kernel has no MADV_POPULATE_WRITE (populating stays lazy)")
        assert seg._populater is None, "16 MiB fit the budget: nothing left for the background"
        assert resident(seg) == seg.size // mmap.PAGESIZE
    finally:
        seg.close()


def test_what_the_budget_leaves_is_populated_in_the_background(monkeypatch) -> None:
    monkeypatch.setattr(StoreSegment, "SYNC_S", 0.0)
    seg = StoreSegment(16 * MiB)
    try:
        if seg._populater is None:
            pytest.skip("this kernel has no MADV_POPULATE_WRITE (populating stays lazy)")
        seg._populater.join(timeout=30)
        assert resident(seg) == seg.size // mmap.PAGESIZE
    finally:
        seg.close()


def test_prefault_off_leaves_the_segment_lazy(monkeypatch) -> None:
    monkeypatch.setenv("MC_STORE_PREFAULT", "0")
    seg = StoreSegment(16 * MiB)
    try:
        assert seg._populater is None and resident(seg) == 0
    finally:
        seg.close()
