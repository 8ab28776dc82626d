"""Mooncake Store: the distributed KV-cache pool (client API as upstream ``mooncake.store``).

``from mooncake_core.store import MooncakeDistributedStore, ReplicateConfig, SoftPinAction``.
The master lives in ``master_*`` modules; this package's import stays light (no torch, no
sockets) so ``import mooncake.store`` through ``mooncake_core.compat`` is cheap.
"""

from mooncake_core.store.buffer_pool import BufferLease, BufferPool, RegisteredBufferPool  # noqa: F401
from mooncake_core.store.client import (  # noqa: F401
    MooncakeDistributedStore,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
)
from mooncake_core.store.host_mem import MooncakeHostMemAllocator  # noqa: F401
from mooncake_core.store.config import MooncakeConfig, MooncakeStoreConfig, StoreConfig  # noqa: F401
from mooncake_core.store.numa import bind_to_numa_node  # noqa: F401
from mooncake_core.store.parallelism import ParallelAxis, ReadTarget, TensorParallelism  # noqa: F401
from mooncake_core.store.types import QueryTaskResponse, TaskStatus, TaskType  # noqa: F401

__all__ = [
    "MooncakeDistributedStore",
    "ReplicateConfig",
    "SoftPinAction",
    "ReplicaStatus",
    "StoreConfig",
    "MooncakeStoreConfig",
    "MooncakeConfig",
    "ParallelAxis",
    "TensorParallelism",
    "ReadTarget",
    "bind_to_numa_node",
    "BufferPool",
    "RegisteredBufferPool",
    "BufferLease",
    "QueryTaskResponse",
    "TaskStatus",
    "TaskType",
    "MooncakeHostMemAllocator",
]
