"""Whether a failed transfer hit a peer that did not answer (shared by the write and read paths)."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["unresponsive"]


def unresponsive(engine: Any, t0: float) -> bool:
    """A transfer started at ``t0`` (monotonic) that failed after at least half the engine's
    timeout hit an unresponsive peer (stopped, cut off), not a quick refusal: retrying it
    costs another full timeout, so the callers do not ask that peer again in the same call."""
    return time.monotonic() - t0 >= 0.5 * float(getattr(engine, "timeout", 30.0) or 30.0)
