"""Notifications delivered with transfers (Mooncake's ``TransferNotify``) and the inbox of
those received; public through ``mooncake_core.engine``."""

from __future__ import annotations

import threading

__all__ = ["NotifyInbox", "TransferNotify"]


class TransferNotify:
    """A notification delivered with a transfer (Mooncake's ``TransferNotify(name, msg)``)."""

    def __init__(self, name: str = "", msg: str = ""):
        self.name = name
        self.msg = msg

    def __repr__(self) -> str:
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TransferNotify) and (self.name, self.msg) == (other.name, other.msg)


class NotifyInbox:
    """Notifications received by the rpc server until the user drains them."""

    def __init__(self) -> None:
        self._items: list[TransferNotify] = []
        self._lock = threading.Lock()

    def put(self, name: str, msg: str) -> None:
        with self._lock:
            self._items.append(TransferNotify(name, msg))

    def drain(self) -> list[TransferNotify]:
        with self._lock:
            out, self._items = self._items, []
        return out
