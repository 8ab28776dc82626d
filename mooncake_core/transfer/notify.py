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
    """Notifications received by the rpc server until the user drains them.

    ``wait`` lets an event loop sleep until something happened (a notification came in, or
    ``poke`` was called: an asynchronous batch finished) instead of polling. Why: a vLLM engine
    holding KV for a decode steps without work only to poll the connector; on a small box
    those busy steps (one per TP worker plus the engine core) starved every other process of
    CPU -- the decode that was to read the KV included -- until the lease ran out (issue 19)."""

    def __init__(self) -> None:
        self._items: list[TransferNotify] = []
        self._cond = threading.Condition(threading.Lock())
        self._events = 0  # notifications + pokes so far

    def put(self, name: str, msg: str) -> None:
        with self._cond:
            self._items.append(TransferNotify(name, msg))
            self._events += 1
            self._cond.notify_all()

    def poke(self) -> None:
        """Wake ``wait`` without a notification (a batch finished)."""
        with self._cond:
            self._events += 1
            self._cond.notify_all()

    def drain(self) -> list[TransferNotify]:
        with self._cond:
            out, self._items = self._items, []
        return out

    def events(self) -> int:
        """How many notifications and pokes came in so far (pass it to ``wait``)."""
        with self._cond:
            return self._events

    def wait(self, since: int, timeout: float) -> bool:
        """Block until the event count exceeds ``since`` (True) or ``timeout`` seconds pass
        (False). Notifications waiting undrained count as happened."""
        with self._cond:
            return self._cond.wait_for(lambda: self._events > since or bool(self._items), max(0.0, timeout))
