"""Busy polling that backs off when it does not pay (shared by the TE tcp path and the store
master RPC).

Why poll at all: on a VM a thread blocked in recv/epoll needs 40-80 us (more from a deep idle
state) to be woken, which dominated small request/reply round trips whose real work is
10-20 us. Polling the socket for a few tens of microseconds after sending a request (or, on
the serving side, after answering one) keeps the thread on its core.

Why back off: polling only wins while a core is free for the peer. On a loaded box the poller
takes the core the peer needs to answer (measured here with one core busy: 4 KiB round trips
went from ~15 us to ~180 us). So a poll that finds nothing makes the next 1, 3, 7, ... 63
waits block at once; a poll that finds data resets that. Idle processes never poll: polling
only follows traffic.
"""

from __future__ import annotations

import socket
import time

__all__ = ["POLL_MAX_REQUEST", "Poller", "env_busy_poll_s", "poll_recv", "poll_recv_into"]

#: requests larger than this many bytes (batches) are neither polled for nor counted, on
#: either side: their answer (or, for the server, the client's next request) takes longer
#: than a poll -- each key is handled -- and the misses backed the pollers of both ends off
#: for the single calls that followed: after a fill by put_batch a single put paid a
#: wake-up at each end until both happened to poll at once again (issue 18: put p50 at
#: 1M objects 165-220 us instead of 40-80 in half the runs)
POLL_MAX_REQUEST = 1024


def env_busy_poll_s(name: str) -> float:
    """Seconds of polling from the environment variable ``name`` (microseconds >= 0; declared
    with its default in ``mooncake_core/envs.py``; a bad value is a ValueError naming it)."""
    from mooncake_core import envs

    return int(envs.get(name)) / 1e6


class Poller:
    """Polling budget with back-off (see module docstring). One instance per connection or
    loop, used by one thread at a time. ``spin`` 0 never polls."""

    __slots__ = ("_misses", "_skip", "spin")

    def __init__(self, spin: float):
        self.spin = spin
        self._skip = 0
        self._misses = 0

    def should_poll(self) -> bool:
        """Whether to poll for this wait (consumes one skipped wait after misses)."""
        if not self.spin:
            return False
        if self._skip:
            self._skip -= 1
            return False
        return True

    def record(self, hit: bool) -> None:
        """The outcome of a poll: data came in time (hit) or not (miss: back off). A hit
        clears the back-off entirely (the waits still to be skipped included)."""
        if hit:
            self._misses = 0
            self._skip = 0
        else:
            self._misses = min(self._misses + 1, 6)
            self._skip = (1 << self._misses) - 1

    def recv_into(self, sock: socket.socket, view: memoryview, n: int) -> int | None:
        """Like ``poll_recv_into``; None when not polling now or nothing came in time."""
        if not self.should_poll():
            return None
        got = poll_recv_into(sock, view, n, self.spin)
        self.record(got is not None)
        return got

    def recv(self, sock: socket.socket, n: int) -> bytes | None:
        """Like ``poll_recv``; None when not polling now or nothing came in time."""
        if not self.should_poll():
            return None
        got = poll_recv(sock, n, self.spin)
        self.record(got is not None)
        return got


def poll_recv_into(sock: socket.socket, view: memoryview, n: int, spin: float,
                   _dontwait: int = socket.MSG_DONTWAIT, _clock=time.perf_counter) -> int | None:
    """``recv_into`` with MSG_DONTWAIT, retried for up to ``spin`` seconds; None when nothing
    came in that time (the caller then blocks as usual)."""
    end = _clock() + spin
    while True:
        try:
            return sock.recv_into(view, n, _dontwait)
        except (BlockingIOError, InterruptedError):
            if _clock() >= end:
                return None


def poll_recv(sock: socket.socket, n: int, spin: float,
              _dontwait: int = socket.MSG_DONTWAIT, _clock=time.perf_counter) -> bytes | None:
    """``recv`` with MSG_DONTWAIT, retried for up to ``spin`` seconds; None when nothing came
    in that time (b'' is end of stream, as for ``recv``)."""
    end = _clock() + spin
    while True:
        try:
            return sock.recv(n, _dontwait)
        except (BlockingIOError, InterruptedError):
            if _clock() >= end:
                return None
