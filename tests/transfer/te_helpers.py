"""Small helpers shared by the transfer tests (imported as a plain module)."""

from __future__ import annotations

import hashlib


def sha(arr) -> str:
    """sha256 hex of a numpy array / buffer's bytes."""
    return hashlib.sha256(bytes(memoryview(arr).cast("B"))).hexdigest()
