"""Mooncake's integer return codes as the store client uses them (plain ints: they are
returned to users and compared on hot paths; the names are ``errors.ErrorCode``'s)."""

from __future__ import annotations

from mooncake_core.errors import ErrorCode

OK = 0
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
EXISTS = int(ErrorCode.OBJECT_ALREADY_EXISTS)
INVALID = int(ErrorCode.INVALID_PARAMS)
LEASE_EXPIRED = int(ErrorCode.LEASE_EXPIRED)
TRANSFER_FAIL = int(ErrorCode.TRANSFER_FAIL)
INTERNAL = int(ErrorCode.INTERNAL_ERROR)
NO_HANDLE = int(ErrorCode.NO_AVAILABLE_HANDLE)
