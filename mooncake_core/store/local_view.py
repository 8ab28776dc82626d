"""What one store client holds locally, as its data paths see it."""

from __future__ import annotations

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
    not written into; ``offload``: the SSD tier's files, when there is a tier dir."""

    __slots__ = ("epoch", "host", "name", "offload", "segment")

    def __init__(self) -> None:
        self.segment: StoreSegment | None = None
        self.name = ""
        self.host = ""
        self.epoch = 0
        self.offload: OffloadFiles | None = None

    def mine(self, segment_name: str) -> bool:
        """Whether ``segment_name`` is our own mapped segment (a memcpy, not a transfer)."""
        return self.segment is not None and segment_name == self.name
