"""What one store client holds locally, as its data paths see it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mooncake_core.store.offload import OffloadFiles
from mooncake_core.store.segment import StoreSegment

__all__ = ["SegmentView"]


class SegmentView:
    """Our own segment and SSD-tier files, shared by the core (which sets them up, re-mounts
    and tears them down) and the write and read paths (which read them on every call).

    ``segment``: the memory we contribute (None without one); ``name``: the segment name
    peers and the master know us by (set even without memory: it tells "our own" replicas
    apart); ``host``: its host, for same-host replica choice; ``epoch``: the epoch of the
    master our segment is mounted at (0 = not yet): a reservation granted by another one is
    not written into; ``offload``: the SSD tier's files, when there is a tier dir;
    ``extra_regions``: (address, size) of memory mounted besides the segment
    (``mount_segment``, wired by the client) -- replicas there name our segment too."""

    __slots__ = ("epoch", "extra_regions", "host", "name", "offload", "segment")

    def __init__(self) -> None:
        self.segment: StoreSegment | None = None
        self.name = ""
        self.host = ""
        self.epoch = 0
        self.offload: OffloadFiles | None = None
        self.extra_regions: Callable[[], list[tuple[int, int]]] = list

    def mine(self, segment_name: str) -> bool:
        """Whether ``segment_name`` is our own mapped segment (a memcpy, not a transfer)."""
        return self.segment is not None and segment_name == self.name

    def holds(self, addrs: np.ndarray, sizes: np.ndarray) -> bool:
        """Whether every range ``[addrs[i], addrs[i] + sizes[i])`` lies in our segment or in
        memory mounted besides it: the batch paths copy replicas named ours with memmove, and
        refuse a placement that would land anywhere else."""
        seg = self.segment
        if seg is None:
            return False
        if not len(addrs):
            return True
        ends = addrs + sizes
        inside = (addrs >= seg.addr) & (ends <= seg.addr + seg.size)
        if bool(inside.all()):
            return True
        for a, n in self.extra_regions():
            inside |= (addrs >= a) & (ends <= a + n)
        return bool(inside.all())

    def in_segment(self, addrs: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """Per range, whether it lies in our segment itself (only those are re-reported after
        a master change: memory mounted besides it is not)."""
        seg = self.segment
        if seg is None:
            return np.zeros(len(addrs), bool)
        return (addrs >= seg.addr) & (addrs + sizes <= seg.addr + seg.size)
