"""Scatter/gather socket I/O over numpy iovec arrays (``sendmsg`` / ``recvmsg`` via ctypes).

Why not ``socket.sendmsg`` / ``recvmsg_into``: they take one Python buffer object per iovec
entry, and for a batch of scattered 16 KiB blocks building those memoryviews (~0.6 us each
through ctypes) cost as much CPU as the kernel copy. Here an iovec array is an ``(n, 2)``
uint64 numpy array of ``(iov_base, iov_len)`` built with a few vectorised operations, and
one libc call moves up to IOV_MAX entries with the GIL released. Partial progress (kernel
timeout, signal, full send buffer) is handled by advancing within the array.

Blocking semantics match ``sockio``: the socket is in plain blocking mode with SO_RCVTIMEO /
SO_SNDTIMEO set, so every call is bounded; an expiry raises BlockingIOError (EAGAIN), which
``sockio.is_timeout`` recognises, and loops of partial progress check the caller's deadline.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket

import numpy as np

from mooncake_core.transfer.sockio import IOV_MAX, PeerClosed, _check_deadline

_libc = ctypes.CDLL(None, use_errno=True)


class _MsgHdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.c_void_p), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


_sendmsg = _libc.sendmsg
_sendmsg.argtypes = [ctypes.c_int, ctypes.POINTER(_MsgHdr), ctypes.c_int]
_sendmsg.restype = ctypes.c_ssize_t
_recvmsg = _libc.recvmsg
_recvmsg.argtypes = [ctypes.c_int, ctypes.POINTER(_MsgHdr), ctypes.c_int]
_recvmsg.restype = ctypes.c_ssize_t

_MSG_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0x4000)
_MSG_WAITALL = socket.MSG_WAITALL


def iov_array(addrs: np.ndarray, lens: np.ndarray, head: tuple[int, int] | None = None) -> np.ndarray:
    """An ``(n, 2)`` uint64 iovec array over parallel address / length arrays, optionally
    preceded by one ``head`` entry (e.g. a message header kept in a numpy buffer)."""
    k = 1 if head is not None else 0
    iov = np.empty((len(addrs) + k, 2), dtype=np.uint64)
    if head is not None:
        iov[0] = head
    iov[k:, 0] = addrs
    iov[k:, 1] = lens
    return iov


def _raise_errno(err: int, what: str) -> None:
    # OSError(errno, ...) becomes the matching subclass: BlockingIOError for EAGAIN (a kernel
    # timeout), ConnectionResetError, BrokenPipeError, ...
    raise OSError(err, f"{what}: {os.strerror(err)}")


def _advance(iov: np.ndarray, i: int, cnt: int, done: int) -> int:
    """Consume ``done`` bytes of entries ``i..i+cnt-1``; trim a partly done entry in place;
    return the index of the first entry with bytes left."""
    cum = np.cumsum(iov[i:i + cnt, 1])
    k = int(np.searchsorted(cum, done, side="right"))
    part = done - (int(cum[k - 1]) if k else 0)
    i += k
    if part:
        iov[i, 0] += np.uint64(part)
        iov[i, 1] -= np.uint64(part)
    return i


def _run(sock: socket.socket, iov: np.ndarray, deadline: float | None, send: bool) -> None:
    n = len(iov)
    if not n:
        return
    if iov.dtype != np.uint64 or not iov.flags.c_contiguous or iov.shape[1:] != (2,):
        raise ValueError("iov must be a C-contiguous (n, 2) uint64 array")
    fd = sock.fileno()
    if fd < 0:
        raise OSError(errno.EBADF, "socket is closed")
    hdr = _MsgHdr()
    href = ctypes.byref(hdr)
    base = iov.ctypes.data
    call, flags, what = (_sendmsg, _MSG_NOSIGNAL, "sendmsg") if send else (_recvmsg, _MSG_WAITALL, "recvmsg")
    i = 0
    while i < n and iov[i, 1] == 0:
        i += 1
    while i < n:
        cnt = min(IOV_MAX, n - i)
        hdr.msg_iov = base + 16 * i
        hdr.msg_iovlen = cnt
        r = call(fd, href, flags)
        if r < 0:
            err = ctypes.get_errno()
            if err == errno.EINTR:
                _check_deadline(deadline)
                continue
            _raise_errno(err, what)
        if r == 0 and not send:
            left = int(iov[i:, 1].sum())
            raise PeerClosed(f"connection closed with {left} bytes of a vectored transfer left")
        want = int(iov[i:i + cnt, 1].sum())
        if r == want:
            i += cnt
        else:
            i = _advance(iov, i, cnt, r)
        while i < n and iov[i, 1] == 0:  # empty entries never make progress on their own
            i += 1
        if i < n:
            _check_deadline(deadline)


def send_iov(sock: socket.socket, iov: np.ndarray, deadline: float | None = None) -> None:
    """Send every entry of ``iov`` in order (gather). ``iov`` may be modified."""
    _run(sock, iov, deadline, True)


def split_at(iov: np.ndarray, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """``iov`` cut after its first ``nbytes`` bytes: (head, tail) iovec arrays whose streams
    concatenate to that of ``iov`` (the entry holding the cut is split in two)."""
    cum = np.cumsum(iov[:, 1].astype(np.int64))
    k = int(np.searchsorted(cum, nbytes, side="left"))  # entry holding byte nbytes-1
    if k >= len(iov):
        return iov, iov[:0]
    done_before = int(cum[k - 1]) if k else 0
    head = iov[:k + 1].copy()
    tail = iov[k:].copy()
    take = nbytes - done_before
    head[k, 1] = np.uint64(take)
    tail[0, 0] += np.uint64(take)
    tail[0, 1] -= np.uint64(take)
    return head, tail


def recv_iov(sock: socket.socket, iov: np.ndarray, deadline: float | None = None, lowat: int = 0) -> None:
    """Fill every entry of ``iov`` in order (scatter), MSG_WAITALL per IOV_MAX entries.
    ``iov`` may be modified.

    ``lowat`` (``MC_TCP_RCVLOWAT``): for a message of at least twice that many bytes, all but
    its last ``lowat`` bytes are received with ``SO_RCVLOWAT = lowat``, so the kernel wakes
    this thread once that much has arrived instead of for every segment (a receiver that
    keeps up with the sender otherwise sleeps and wakes per 64 KiB skb on loopback). It can
    never wait for bytes that will not come: while the first part is received, at least
    ``lowat`` more bytes of the same message are still due from the sender; the last
    ``lowat`` bytes are received with the low-water mark back at 1. Every wait stays bounded
    by the socket's kernel timeout and ``deadline``."""
    if lowat <= 0 or not len(iov):
        _run(sock, iov, deadline, False)
        return
    total = int(iov[:, 1].sum())
    if total < 2 * lowat:
        _run(sock, iov, deadline, False)
        return
    head, tail = split_at(iov, total - lowat)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
    try:
        _run(sock, head, deadline, False)
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
    _run(sock, tail, deadline, False)
