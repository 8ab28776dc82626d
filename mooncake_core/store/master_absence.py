"""What the master keeps for clients that may come back and re-report (pure, no I/O).

Why a module of its own: after a master change every owner re-reports its objects, and a
client expired for silence (paused, cut off) re-mounts and re-reports when it returns. Two
things must then not come back through those reports (both found by bench/robustness/chaos.py):

* removal notices an expired client had not received yet -- kept (``Absences.expired``) and
  handed over when it returns (``back``), so its reports leave those objects out;
* keys removed while such a report can still arrive -- a *tombstone* (``bury``) refuses a
  later report of a version not newer than the removal (``stamp``), so a value removed after
  one owner's report and before another's, or while its owner was away, stays removed.

Both are bounded in time: an absence lasts 2 x client_ttl (a client gone longer is new), and
tombstones are only made while a window is open -- 2 x client_ttl after the last report or
after an expiry -- and each expires with the window it was made in.
"""

from __future__ import annotations

from collections import deque

Notices = list[tuple[str, int]]


class Absences:
    """Expired clients' missed notices and the tombstones of removals during re-reports."""

    def __init__(self, client_ttl_s: float) -> None:
        self.ttl = client_ttl_s
        #: client id -> (expiry time, removal notices it missed, their "all before" stamp)
        self.departed: dict[str, tuple[float, Notices, int]] = {}
        self.tombstones: dict[str, tuple[int, float]] = {}  # key -> (removal stamp, until)
        self._order: deque[tuple[float, str]] = deque()  # (until, key), until ascending
        self._window_until = 0.0

    def open_window(self, now: float) -> None:
        """Someone may re-report until 2 x client_ttl from now: remember removals till then."""
        self._window_until = max(self._window_until, now + 2 * self.ttl)

    def expired(self, client_id: str, now: float, missed: Notices, all_before: int) -> None:
        """A client with a segment (or undelivered notices) expired: it may come back."""
        self.departed[client_id] = (now, missed, all_before)
        self.open_window(now)

    def back(self, client_id: str, now: float) -> tuple[Notices, int] | None:
        """A client heard from again: the notices it missed, if it had expired (its reports
        follow its re-mount, so the window stays open for them)."""
        gone = self.departed.pop(client_id, None)
        if gone is None:
            return None
        self.open_window(now)
        return gone[1], gone[2]

    def bury(self, key: str, stamp: int, now: float) -> None:
        """``key`` was removed at version ``stamp``: refuse older re-reports while a window is open."""
        if now < self._window_until:
            until = max(self._window_until, now + 2 * self.ttl)
            self.tombstones[key] = (stamp, until)
            self._order.append((until, key))

    def stamp(self, key: str) -> int:
        """The removal stamp a report of ``key`` must beat (0: none)."""
        t = self.tombstones.get(key)
        return t[0] if t is not None else 0

    def prune(self, now: float) -> None:
        for cid in [k for k, v in self.departed.items() if now - v[0] > 2 * self.ttl]:
            del self.departed[cid]
        while self._order and self._order[0][0] <= now:
            _, key = self._order.popleft()
            t = self.tombstones.get(key)
            if t is not None and t[1] <= now:  # not buried again since
                del self.tombstones[key]
