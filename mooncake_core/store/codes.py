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
RPC_FAIL = int(ErrorCode.RPC_FAIL)
NO_HANDLE = int(ErrorCode.NO_AVAILABLE_HANDLE)


class _FalsyCode(int):
    """A negative return code that is falsy.

    ``is_exist`` answers 1 / 0 / -1 (upstream); code that uses the answer as a truth value
    would count the error -1 as "exists". This int keeps the value -1 (``== -1``, ``< 0``,
    JSON ``-1``) but is False in a boolean context, so such code sees a miss.
    """

    __slots__ = ()

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return int.__repr__(self)


#: what ``is_exist`` / ``batch_is_exist`` return when the answer is unknown (master unreachable,
#: store not set up): -1, and falsy.
EXIST_ERROR = _FalsyCode(-1)
