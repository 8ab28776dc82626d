"""Atomic file replacement: write to a temporary name in the same directory, then rename.

Readers (a restarting metadata server, a store client reading an SSD-tier file) must never
see a half-written file; ``os.replace`` within one directory is atomic on POSIX.
"""

from __future__ import annotations

import os
import tempfile


def atomic_write(path: str, data: bytes | bytearray | memoryview, *, durable: bool = False, prefix: str = ".tmp-",
                 suffix: str = "") -> int:
    """Replace ``path`` with ``data`` atomically (creating parent directories); return bytes written.

    ``durable``: fsync the file before the rename and the directory after it, so the new
    content survives a power loss (worth it for small metadata snapshots, not for bulk
    offload data where the master's bookkeeping is the source of truth). The directory
    fsync is best effort -- not every filesystem supports it. On any error the temporary
    file is removed and the old ``path`` is left untouched.
    """
    mv = memoryview(data)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(mv)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        try:
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass  # directory fsync is best effort (not supported everywhere)
    return mv.nbytes
