"""Public config types of the store client, with upstream's names and values."""

from __future__ import annotations

import enum

from mooncake_core.store.protocol import ReplicateConfigMsg

__all__ = ["QueryTaskResponse", "ReplicaStatus", "ReplicateConfig", "SoftPinAction", "TaskStatus", "TaskType"]


class SoftPinAction(enum.IntEnum):
    """Soft-pin transition committed with the object (upstream names)."""

    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ReplicaStatus(enum.IntEnum):
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class TaskType(enum.IntEnum):
    """Kind of a copy/move task (the original's names and numbers)."""

    REPLICA_COPY = 0
    REPLICA_MOVE = 1


class TaskStatus(enum.IntEnum):
    """State of a copy/move task (the original's names and numbers: FAILED is 2)."""

    PENDING = 0
    PROCESSING = 1
    FAILED = 2
    SUCCESS = 3


class QueryTaskResponse:
    """What ``query_task`` answers (the original's attribute names, read-only).
    ``assigned_client`` is the id of the client that carries the task out."""

    __slots__ = ("_f",)

    def __init__(self, id: tuple[int, int] = (0, 0), type: int = TaskType.REPLICA_COPY,  # noqa: A002
                 status: int = TaskStatus.PENDING, created_at_ms_epoch: int = 0,
                 last_updated_at_ms_epoch: int = 0, assigned_client: str = "", message: str = "") -> None:
        self._f = (tuple(id), TaskType(type), TaskStatus(status), int(created_at_ms_epoch),
                   int(last_updated_at_ms_epoch), str(assigned_client), str(message))

    id = property(lambda self: self._f[0])
    type = property(lambda self: self._f[1])
    status = property(lambda self: self._f[2])
    created_at_ms_epoch = property(lambda self: self._f[3])
    last_updated_at_ms_epoch = property(lambda self: self._f[4])
    assigned_client = property(lambda self: self._f[5])
    message = property(lambda self: self._f[6])

    def __repr__(self) -> str:
        i, t, s, c, u, a, m = self._f
        return (f"QueryTaskResponse(id={i[0]}-{i[1]}, type={int(t)}, status={int(s)}, created_at={c}, "
                f"last_updated_at={u}, assigned_client={a}, message={m!r})")


class ReplicateConfig:
    """Replication settings of a put (upstream attribute names).

    ``__slots__`` makes a misspelt attribute (``cfg.replicas = 2``) an AttributeError
    instead of a silently ignored setting, as with the pybind11 original.
    """

    __slots__ = (
        "data_type",
        "dfs_replica_num",
        "group_ids",
        "nof_replica_num",
        "prefer_alloc_in_same_node",
        "preferred_nof_segments",
        "preferred_segment",
        "preferred_segments",
        "replica_num",
        "soft_pin_action",
        "_soft_pin_ttl_ms",
        "with_hard_pin",
    )

    def __init__(self) -> None:
        self.replica_num: int = 1
        self.nof_replica_num: int = 0
        self.dfs_replica_num: int = 0
        self.soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE
        self.soft_pin_ttl_ms: int | None = None
        self.with_hard_pin: bool = False
        self.preferred_segment: str = ""
        self.preferred_segments: list[str] = []
        self.preferred_nof_segments: list[str] = []
        self.prefer_alloc_in_same_node: bool = False
        self.data_type: int = 0
        self.group_ids: list[str] | None = None

    @property
    def soft_pin_ttl_ms(self) -> int | None:
        """Soft-pin TTL in ms (None: the master's default); only with ``SoftPinAction.ENABLE``."""
        return self._soft_pin_ttl_ms

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, value: int | None) -> None:
        # upstream binds this as optional<uint64>: anything else is a TypeError at assignment
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value < 1 << 64):
            raise TypeError(f"ReplicateConfig.soft_pin_ttl_ms: expected None or an int in [0, 2**64) "
                            f"milliseconds, got {value!r}")
        self._soft_pin_ttl_ms = value

    def refusal(self) -> str | None:
        """Why a put/upsert with this config gets INVALID_PARAMS (-600), as upstream answers
        (a return code, not an exception), or None."""
        if self._soft_pin_ttl_ms is not None and self.soft_pin_action != SoftPinAction.ENABLE:
            return (f"soft_pin_ttl_ms={self._soft_pin_ttl_ms} is valid only with SoftPinAction.ENABLE "
                    f"(soft_pin_action is {SoftPinAction(self.soft_pin_action).name})")
        return None

    # Older Mooncake releases spelled soft pinning as a boolean.
    @property
    def with_soft_pin(self) -> bool:
        return self.soft_pin_action == SoftPinAction.ENABLE

    @with_soft_pin.setter
    def with_soft_pin(self, value: bool) -> None:
        self.soft_pin_action = SoftPinAction.ENABLE if value else SoftPinAction.DISABLE

    def __repr__(self) -> str:
        return (f"ReplicateConfig: {{ replica_num: {self.replica_num}, soft_pin_action: "
                f"{SoftPinAction(self.soft_pin_action).name}, soft_pin_ttl_ms: {self.soft_pin_ttl_ms}, "
                f"with_hard_pin: {int(bool(self.with_hard_pin))}, preferred_segments: "
                f"{self._segments()} }}")

    __str__ = __repr__

    def _segments(self) -> list[str]:
        segs = list(self.preferred_segments or [])
        if self.preferred_segment and self.preferred_segment not in segs:
            segs.insert(0, self.preferred_segment)
        return segs

    def validate(self) -> None:
        """Raise TypeError/ValueError naming the bad field."""
        if isinstance(self.replica_num, bool) or not isinstance(self.replica_num, int):
            raise TypeError(f"ReplicateConfig.replica_num: expected int, got {type(self.replica_num).__name__}")
        if not 1 <= self.replica_num <= 64:
            raise ValueError(f"ReplicateConfig.replica_num: must be in 1..64, got {self.replica_num}")
        try:
            SoftPinAction(self.soft_pin_action)
        except ValueError:
            raise ValueError(f"ReplicateConfig.soft_pin_action: not a SoftPinAction: "
                             f"{self.soft_pin_action!r}") from None
        if not isinstance(self.preferred_segment, str):
            raise TypeError("ReplicateConfig.preferred_segment: expected str")
        if not isinstance(self.preferred_segments, (list, tuple)) or not all(
                isinstance(s, str) for s in self.preferred_segments):
            raise TypeError("ReplicateConfig.preferred_segments: expected a list of str")
        if self.group_ids is not None and (not isinstance(self.group_ids, (list, tuple)) or not all(
                isinstance(g, str) for g in self.group_ids)):
            raise TypeError("ReplicateConfig.group_ids: expected None or a list of str (one group id per key)")

    def to_msg(self) -> ReplicateConfigMsg:
        self.validate()
        return ReplicateConfigMsg(
            replica_num=int(self.replica_num),
            soft_pin=SoftPinAction(self.soft_pin_action) == SoftPinAction.ENABLE,
            soft_pin_ttl_ms=self.soft_pin_ttl_ms,
            with_hard_pin=bool(self.with_hard_pin),
            preferred_segments=self._segments(),
            group_ids=list(self.group_ids or ()),
        )


class BufferHandle(bytes):
    """An object read by ``get_buffer`` / ``batch_get_buffer``: the bytes (buffer protocol,
    ``bytes(h)``, ``memoryview(h)``) with upstream's ``BufferHandle`` accessors ``ptr()`` (the
    address of the data) and ``size()`` (its length), valid while the handle is alive."""

    __slots__ = ()

    def size(self) -> int:
        return len(self)

    def ptr(self) -> int:
        from mooncake_core.store.memory import bytes_addr

        return bytes_addr(self)

    @property
    def nbytes(self) -> int:
        return len(self)

    def tobytes(self) -> bytes:
        return bytes(self)
