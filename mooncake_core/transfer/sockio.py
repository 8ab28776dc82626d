"""Blocking socket helpers for exact-length, zero-copy I/O.

``recv_into_exact`` fills a memoryview (possibly over registered memory) without building
Python bytes; ``sendmsg_all`` sends a vector of buffers with ``sendmsg`` (one syscall for
header + payload, or for a whole batch) and copes with partial sends.
"""

from __future__ import annotations

import socket
import struct
import time

from mooncake_core.utils.busypoll import Poller, env_busy_poll_s, poll_recv_into  # noqa: F401 (re-exported)

IOV_MAX = 1024

#: default of MC_TCP_BUSY_POLL_US (see ``busy_poll_s``)
DEFAULT_BUSY_POLL_US = 50  # the default of MC_TCP_BUSY_POLL_US (envs.py)


def busy_poll_s() -> float:
    """Seconds to poll a socket without sleeping while a reply / the next request is due
    (``MC_TCP_BUSY_POLL_US``, default 50; 0 disables). The initiator polls this long after
    sending a small request; a target polls twice as long after serving one. Why and how it
    backs off: ``mooncake_core.utils.busypoll``."""
    return env_busy_poll_s("MC_TCP_BUSY_POLL_US")


class PeerClosed(ConnectionError):
    pass


def set_kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """Bound every blocking send/recv on ``sock`` by ``seconds`` using SO_RCVTIMEO/SO_SNDTIMEO.

    Why not ``settimeout``: Python then polls before every call (an extra syscall and GIL
    round trip per message, ~4 us on the 4 KiB path). A kernel timeout keeps the socket in
    plain blocking mode; an expiry surfaces as BlockingIOError (EAGAIN), which callers treat
    as a timeout.
    """
    sock.settimeout(None)
    sec = int(seconds)
    usec = int((seconds - sec) * 1e6)
    if sec == 0 and usec == 0:
        usec = 1000
    tv = struct.pack("ll", sec, usec)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def set_buffers(sock: socket.socket, sndbuf: int, rcvbuf: int) -> None:
    """SO_SNDBUF / SO_RCVBUF of a data connection (``MC_TCP_SNDBUF`` / ``MC_TCP_RCVBUF``);
    0 leaves the kernel's autotuning in charge. The kernel doubles the value and caps it at
    ``net.core.wmem_max`` / ``rmem_max``; a fixed size turns autotuning off for that side."""
    if sndbuf > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    if rcvbuf > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)


def is_timeout(e: BaseException) -> bool:
    return isinstance(e, (socket.timeout, BlockingIOError))


def _check_deadline(deadline: float | None) -> None:
    # each blocking call is bounded by the kernel timeout; loops of partial progress are
    # bounded by the caller's deadline, so the total never runs past it
    if deadline is not None and time.monotonic() > deadline:
        raise socket.timeout("deadline exceeded while the peer was making partial progress")


def recv_into_exact(sock: socket.socket, view: memoryview, deadline: float | None = None) -> None:
    n = len(view)
    got = sock.recv_into(view, n)
    while got < n:
        if got == 0 and n:
            raise PeerClosed(f"connection closed after 0 of {n} bytes")
        _check_deadline(deadline)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise PeerClosed(f"connection closed after {got} of {n} bytes")
        got += k


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    if n:
        recv_into_exact(sock, memoryview(buf))
    return buf


def drain(sock: socket.socket, n: int, scratch: memoryview) -> None:
    """Read and discard n bytes into a scratch buffer (never into registered memory)."""
    while n > 0:
        k = sock.recv_into(scratch, min(n, len(scratch)))
        if k == 0:
            raise PeerClosed(f"connection closed with {n} bytes left to drain")
        n -= k


def sendmsg_all(sock: socket.socket, bufs: list, deadline: float | None = None) -> None:
    """Send every buffer in order; vectored, handles partial sends and IOV_MAX."""
    if len(bufs) <= IOV_MAX:  # fast path: one syscall sends everything (the common case)
        total = 0
        for b in bufs:
            total += len(b)
        sent = sock.sendmsg(bufs)
        if sent == total:
            return
        # partial send: fall through with the remainder
        views = []
        for b in bufs:
            v = memoryview(b).cast("B") if not isinstance(b, memoryview) else b
            if sent >= len(v):
                sent -= len(v)
                continue
            views.append(v[sent:])
            sent = 0
    else:
        views = [memoryview(b) if not isinstance(b, memoryview) else b for b in bufs]
    views = [v for v in views if len(v)]
    first = True
    while views:
        if not first:
            _check_deadline(deadline)
        first = False
        chunk = views[:IOV_MAX]
        sent = sock.sendmsg(chunk)
        # drop fully sent views, trim the partially sent one
        i = 0
        while i < len(chunk) and sent >= len(chunk[i]):
            sent -= len(chunk[i])
            i += 1
        views = views[i:]
        if sent and views:
            views[0] = views[0][sent:]


def send_rest(sock: socket.socket, bufs: list, sent: int, deadline: float | None = None) -> None:
    """Finish a vectored send after ``sendmsg`` sent only ``sent`` bytes of ``bufs``."""
    rest = []
    for b in bufs:
        v = b if isinstance(b, memoryview) else memoryview(b)
        if sent >= len(v):
            sent -= len(v)
            continue
        rest.append(v[sent:])
        sent = 0
    if rest:
        sendmsg_all(sock, rest, deadline)

