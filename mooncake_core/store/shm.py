"""Shared memory between a dummy client and ``mooncake_client``: memfd regions by address.

Why memfd + ``mmap`` through libc rather than Python's ``mmap`` object: the store moves bytes
between raw addresses, and a Python ``mmap`` cannot be closed while a ctypes view of it is
alive; with libc the owner maps and unmaps explicitly. A memfd has no name to clean up: when
both processes are gone (or the dummy was SIGKILLed), the kernel frees it.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import socket
from dataclasses import dataclass

__all__ = ["Region", "create_region", "map_fd", "recv_with_fds", "send_with_fd", "unmap"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


@dataclass
class Region:
    """A mapped memfd: ``addr`` in this process, ``size`` bytes asked for (the mapping is whole
    pages), ``fd`` kept open so the region can be passed again (to a restarted service)."""
    addr: int
    size: int
    fd: int

    def close(self) -> None:
        unmap(self.addr, self.size)
        os.close(self.fd)


def map_fd(fd: int, size: int) -> int:
    """Map ``size`` bytes of ``fd`` shared, read-write; the address. OSError on failure."""
    addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if addr in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {size} bytes of shared memory failed: {os.strerror(err)}")
    return int(addr)


def unmap(addr: int, size: int) -> None:
    _libc.munmap(addr, size)


def create_region(size: int, name: str = "mooncake-dummy") -> Region:
    """A fresh memfd of ``size`` bytes (rounded up to pages), mapped here."""
    if size <= 0:
        raise ValueError(f"shared region size must be positive, got {size}")
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE)
        return Region(map_fd(fd, size), size, fd)
    except BaseException:
        os.close(fd)
        raise


def send_with_fd(sock: socket.socket, data: bytes, fd: int) -> None:
    """Send ``data`` with ``fd`` attached to its first byte (SCM_RIGHTS)."""
    sent = socket.send_fds(sock, [data], [fd])
    if sent < len(data):
        sock.sendall(data[sent:])


def recv_with_fds(sock: socket.socket, n: int) -> tuple[bytes, list[int]]:
    """Up to ``n`` bytes and any descriptors that came with them (empty bytes: peer closed)."""
    data, fds, _flags, _addr = socket.recv_fds(sock, n, 4)
    return data, list(fds)
