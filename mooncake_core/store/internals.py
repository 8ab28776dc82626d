"""What the store client's API families need from its core, as Protocols.

The public ``MooncakeDistributedStore`` (client.py) is a façade over ``StoreCore`` (core.py:
lifecycle, the in-flight gate, the error boundary, in front of its write and read paths) and
one delegate per API family (objects, tensors, TP/parallelism, ranges). The delegates are
typed against ``StoreInternals`` below, not against the core class, so no delegate imports
the core or the façade (no import cycle) and each family says exactly what it uses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np

from mooncake_core.store.master_client import MasterClient
from mooncake_core.store.offload import OffloadFiles
from mooncake_core.store.owned import OwnedIndex
from mooncake_core.store.protocol import BatchGetReply, GetReply, ReplicaDesc
from mooncake_core.store.segment import StoreSegment
from mooncake_core.store.types import ReplicateConfig

__all__ = ["EngineLike", "Parts", "StoreInternals"]

T = TypeVar("T")

#: an object's bytes as (address, length) pieces laid end to end
Parts = list[tuple[int, int]]


class EngineLike(Protocol):
    """The Transfer Engine calls the store makes (ours, or an engine handed to ``setup``)."""

    def register_memory(self, buffer_addr: int, capacity: int, location: str = ...) -> int: ...

    def unregister_memory(self, buffer_addr: int) -> int: ...

    def batch_transfer_sync_write(self, target_hostname: str, buffers: Sequence[int],
                                  peer_buffer_addresses: Sequence[int], lengths: Sequence[int]) -> int: ...

    def batch_transfer_sync_read(self, target_hostname: str, buffers: Sequence[int],
                                 peer_buffer_addresses: Sequence[int], lengths: Sequence[int]) -> int: ...


class StoreInternals(Protocol):
    """The core of one store client, as the API delegates see it."""

    lock: threading.RLock
    ready: bool
    client_id: str
    registered: dict[int, int]
    owned: OwnedIndex
    local_buffer_size: int

    @property
    def segment_name(self) -> str:
        """The name peers and the master know our segment by."""

    @property
    def segment(self) -> StoreSegment | None:
        """The memory we contribute (None without one)."""

    @property
    def offload(self) -> OffloadFiles | None:
        """The SSD tier's files, when there is a tier dir."""

    @property
    def master(self) -> MasterClient:
        """The master stub (MooncakeError -600 when the store is not set up)."""

    @property
    def engine(self) -> EngineLike:
        """The Transfer Engine (MooncakeError -600 when the store is not set up)."""

    @property
    def engine_or_none(self) -> EngineLike | None:
        """The Transfer Engine, or None when the store is not set up or closed."""

    def require_ready(self, what: str) -> None: ...

    def mount(self) -> None:
        """Mount our segment at the master (again, after a master change)."""

    def enter(self, what: str) -> None:
        """Count a data-path call in (close() waits for them before unmapping memory)."""

    def exit(self) -> None: ...

    def call(self, fn: Callable[[], int], keepalive: Any = None, need_ready: str | None = None) -> int: ...

    def call_list(self, fn: Callable[[], list[int]], n: int, keepalive: Any = None,
                  need_ready: str | None = None) -> list[int]: ...

    def count(self, op: str, rc: int, nbytes: int = 0, t0: float | None = None) -> None: ...

    def stale_reservations(self) -> list[int]: ...

    def put_many(self, keys: list[str], srcs: list[Parts] | None, cfg: ReplicateConfig, *, upsert: bool,
                 op: str, flat: tuple[list[int], list[int], list[Any] | None] | None = None) -> list[int]: ...

    def read_batch(self, keys: list[str], dests: list[Any], op: str) -> list[int]: ...

    def read_ranges(self, keys: list[str], reply: BatchGetReply, t_req: float, kix: np.ndarray, addr: np.ndarray,
                    off: np.ndarray, size: np.ndarray, op: str) -> np.ndarray | None: ...

    def forget(self, keys: Iterable[str]) -> None: ...

    def remember_owned(self, key: str, replicas: Iterable[ReplicaDesc], version: int | Any) -> None: ...

    def pick_order(self, replicas: Sequence[ReplicaDesc]) -> list[ReplicaDesc]: ...

    def leading_epoch(self) -> tuple[int, str]: ...

    def fetch_replicas(self, keys: list[str]) -> list[GetReply | int]: ...
