"""Error codes shared with the original Mooncake (the integer values users' code checks)."""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    SEGMENT_NOT_FOUND = -101
    NO_AVAILABLE_HANDLE = -200
    INVALID_PARAMS = -600
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706
    LEASE_EXPIRED = -707
    TRANSFER_FAIL = -800
    RPC_FAIL = -900
    TASK_NOT_FOUND = -1400
    TASK_PENDING_LIMIT_EXCEEDED = -1401


class MooncakeError(Exception):
    """An error carrying a Mooncake error code, raised inside the library and turned into
    the integer return code at the public API boundary."""

    def __init__(self, code: int, message: str):
        super().__init__(f"[{int(code)}] {message}")
        self.code = int(code)
        self.message = message
