"""When to busy-poll: the back-off policy of ``mooncake_core.utils.busypoll``, without sockets.

A poll that finds nothing makes the next 1, 3, 7, ... 63 waits block at once (polling takes the
core a peer on a loaded box needs); a poll that finds data resets that. That alone left a
single client's back-to-back calls stuck: once both ends of a connection had backed off, each
answer paid a scheduler wake-up at each end (~40-80 us on a VM), which made the next request or
reply late for the other end's poll too, so neither end's rare poll hit again (issue 18: single
puts at 40-80 us or 100-200 us depending on where the master's back-off had been left).

Recovery: the caller reports how long each wait it did *not* poll took until data came
(``skipped``). A run of ``recover_after`` such waits that each ended within ``recover_s`` --
twice the poll window by default, the slack being the wake-up that a blocking wait includes --
shows that the peer is answering back-to-back and a poll would have paid: the back-off ends and
the next wait polls. The cost stays bounded where the gaps sit just above the poll window (such
waits look near, the polls still miss): at most one poll in ``recover_after + 1`` waits. An idle
process still never polls: polls only follow traffic.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["MAX_MISSES", "RECOVER_AFTER", "RECOVER_FACTOR", "PollBackoff"]

#: misses in a row counted at most: the longest back-off skips 2**6 - 1 = 63 waits
MAX_MISSES = 6
#: skipped waits in a row that must each end within the recovery window to end a back-off
RECOVER_AFTER = 3
#: the default recovery window as a multiple of the poll window (the slack covers the wake-up
#: of the blocking wait, which a polling one would not have paid)
RECOVER_FACTOR = 2.0

_B = TypeVar("_B", bound="PollBackoff")


class PollBackoff:
    """Polling budget with back-off and recovery (module docstring). One instance per
    connection or loop, used by one thread at a time. ``spin`` 0 never polls; ``recover_s``
    0 never recovers early (only a hit ends a back-off)."""

    __slots__ = ("_misses", "_near", "_skip", "recover_after", "recover_s", "spin")

    def __init__(self, spin: float, recover_s: float = 0.0, recover_after: int = RECOVER_AFTER) -> None:
        if spin < 0 or recover_s < 0 or recover_after < 1:
            raise ValueError(f"PollBackoff: spin {spin!r} and recover_s {recover_s!r} must be >= 0, "
                             f"recover_after {recover_after!r} >= 1")
        self.spin = spin
        self.recover_s = recover_s
        self.recover_after = recover_after
        self._skip = 0
        self._misses = 0
        self._near = 0

    @classmethod
    def recovering(cls: type[_B], spin: float) -> _B:
        """A back-off that recovers after ``RECOVER_AFTER`` waits within ``RECOVER_FACTOR``
        poll windows (what the master RPC uses at both ends)."""
        return cls(spin, spin * RECOVER_FACTOR)

    @property
    def backed_off(self) -> int:
        """Waits left that will not poll (0: the next wait polls, if ``spin``)."""
        return self._skip

    def should_poll(self) -> bool:
        """Whether to poll for this wait (consumes one skipped wait after misses). When it
        says no, the caller blocks and may report the wait with ``skipped``."""
        if not self.spin:
            return False
        if self._skip:
            self._skip -= 1
            return False
        return True

    def record(self, hit: bool) -> None:
        """The outcome of a poll: data came in time (hit) or not (miss: back off)."""
        self._near = 0
        if hit:
            self._misses = 0
        else:
            self._misses = min(self._misses + 1, MAX_MISSES)
            self._skip = (1 << self._misses) - 1

    def skipped(self, waited: float) -> None:
        """A wait that did not poll ended after ``waited`` seconds (a blocking wait, so this
        includes the wake-up): ``recover_after`` in a row within ``recover_s`` end the
        back-off; a longer one restarts the count."""
        if self.recover_s and waited <= self.recover_s:
            self._near += 1
            if self._near >= self.recover_after:
                self._near = 0
                self._skip = 0
        else:
            self._near = 0
