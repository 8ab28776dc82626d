"""Client side of the SSD tier: spill an object from this client's segment memory to a file
under ``root_fs_dir`` and read such files back.

Why on the client: the master never touches payload bytes (docs/store.md). When it wants to
evict an object whose owner is alive it sends an ``OffloadTask`` in that owner's heartbeat
reply; the owner writes the bytes from its own memory to ``root_fs_dir/<hash-of-key>`` and
reports ``offload_done`` — only then does the master free the memory range. Files are written
to a temporary name and renamed, so a reader never sees a half-written file. The disk tier's
capacity/LRU is the master's bookkeeping; this module only writes, reads and deletes files.
"""

from __future__ import annotations

import ctypes
import hashlib
import os

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.utils.fileio import atomic_write

__all__ = ["OffloadFiles", "mem_view", "offload_relpath"]


def offload_relpath(key: str) -> str:
    """Stable file path (relative to ``root_fs_dir``) for ``key``: ``ab/<sha256>``.

    Hashing keeps arbitrary keys ("a/../b", very long ones) safe as file names; the two-char
    fan-out directory keeps directories small.
    """
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{digest[:2]}/{digest}"


def mem_view(addr: int, size: int) -> memoryview:
    """A writable byte view of raw process memory ``[addr, addr+size)`` (no copy)."""
    if size == 0:
        return memoryview(bytearray(0))
    return memoryview((ctypes.c_char * size).from_address(addr)).cast("B")


class OffloadFiles:
    """Files of the SSD tier under one root directory."""

    def __init__(self, root_dir: str):
        if not root_dir:
            raise ValueError("SSD tier: root_fs_dir is empty")
        self.root = os.path.abspath(root_dir)
        os.makedirs(self.root, exist_ok=True)

    def abspath(self, relpath: str) -> str:
        """Resolve a master-reported relative path; refuse paths escaping the root."""
        full = os.path.abspath(os.path.join(self.root, relpath))
        if os.path.commonpath([full, self.root]) != self.root:
            raise MooncakeError(ErrorCode.INVALID_PARAMS, f"SSD tier: path {relpath!r} escapes {self.root}")
        return full

    def write_from(self, relpath: str, addr: int, size: int) -> int:
        """Write ``size`` bytes at ``addr`` to ``relpath`` atomically; return bytes written."""
        return atomic_write(self.abspath(relpath), mem_view(addr, size))

    def write_bytes(self, relpath: str, data: bytes | memoryview) -> int:
        """Like ``write_from`` for data already in a Python buffer."""
        return atomic_write(self.abspath(relpath), data)

    def read_into(self, relpath: str, dest: memoryview, size: int) -> int:
        """Read the whole file (which must be exactly ``size`` bytes) into ``dest``."""
        full = self.abspath(relpath)
        try:
            with open(full, "rb", buffering=0) as f:
                actual = os.fstat(f.fileno()).st_size
                if actual != size:
                    raise MooncakeError(ErrorCode.OBJECT_NOT_FOUND,
                                        f"SSD tier: {relpath} has {actual} bytes, expected {size}")
                if len(dest) < size:
                    raise MooncakeError(ErrorCode.INVALID_PARAMS,
                                        f"SSD tier: destination of {len(dest)} bytes < object size {size}")
                got = 0
                while got < size:
                    n = f.readinto(dest[got:size])
                    if not n:
                        raise MooncakeError(ErrorCode.OBJECT_NOT_FOUND, f"SSD tier: {relpath} truncated")
                    got += n
        except FileNotFoundError:
            raise MooncakeError(ErrorCode.OBJECT_NOT_FOUND, f"SSD tier: file {relpath} is gone") from None
        return size

    def delete(self, relpath: str) -> bool:
        try:
            os.unlink(self.abspath(relpath))
            return True
        except FileNotFoundError:
            return False
