"""A put the master asks to repeat: wait while reservations and quarantine are taken back.

Why: reservations (the ranges a client's next put will be written into) and quarantined
ranges (freed once no late write can land in them) are an optimisation; the space they hold
must never make a put fail. When a put needs it, the master takes back what it may at once
and, for what still has to wait (a holder's young reservation, a quarantine waiting for its
owner's heartbeats), answers -200 with a wait (``master_space.SpaceReclaiming``) instead of
evicting anyone's object. The put then asks again after that wait, for at most
``SPACE_WAIT_S`` -- longer than the master's ``reservation_reclaim_s`` plus two heartbeats, the
longest such space can be held -- and only then reports -200.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store.master_space import reclaim_wait

__all__ = ["SPACE_WAIT_S", "SpaceWait", "start_put"]

#: how long one put waits in all for space being taken back (see the module docstring)
SPACE_WAIT_S = 5.0

T = TypeVar("T")


class SpaceWait:
    """The patience of one put (or one batch): ``pause`` sleeps the wait the master asked
    for and says True, or says False once ``SPACE_WAIT_S`` would be exceeded."""

    def __init__(self) -> None:
        self.deadline = time.monotonic() + SPACE_WAIT_S

    def pause(self, wait_s: float | None) -> bool:
        if wait_s is None or wait_s <= 0 or time.monotonic() + wait_s > self.deadline:
            return False
        time.sleep(wait_s)
        return True


def start_put(call: Callable[[], T]) -> T:
    """``call()`` (a put_start); asked again while the master answers that the space is being
    reclaimed (see the module docstring). Raises the last MooncakeError otherwise."""
    patience: SpaceWait | None = None
    while True:
        try:
            return call()
        except MooncakeError as e:
            if e.code != ErrorCode.NO_AVAILABLE_HANDLE:
                raise
            patience = patience or SpaceWait()
            if not patience.pause(reclaim_wait(e.message)):
                raise
