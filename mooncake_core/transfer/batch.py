"""Book-keeping of asynchronous batches (pure logic, no I/O).

A batch id is a small positive int handed to the user; its state says pending / done /
failed and when it times out. ``status_code`` maps to Mooncake's ``transfer_check_status``
convention: 1 done, 0 pending, -1 failed, -2 timed out.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

PENDING, DONE, FAILED = 0, 1, -1
TIMEOUT = -2


@dataclass
class BatchState:
    batch_id: int
    deadline: float
    nbytes: int
    state: int = PENDING
    error: str = ""
    done_event: threading.Event = field(default_factory=threading.Event)

    def finish(self, error: str | None) -> None:
        self.state = FAILED if error else DONE
        self.error = error or ""
        self.done_event.set()

    def status_code(self, now: float | None = None) -> int:
        if self.state != PENDING:
            return self.state
        if (now if now is not None else time.monotonic()) > self.deadline:
            return TIMEOUT
        return PENDING


class BatchTable:
    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._batches: dict[int, BatchState] = {}

    def new(self, deadline: float, nbytes: int) -> BatchState:
        with self._lock:
            b = BatchState(next(self._ids), deadline, nbytes)
            self._batches[b.batch_id] = b
            return b

    def get(self, batch_id: int) -> BatchState | None:
        with self._lock:
            return self._batches.get(batch_id)

    def pop(self, batch_id: int) -> BatchState | None:
        with self._lock:
            return self._batches.pop(batch_id, None)

    def __len__(self) -> int:
        return len(self._batches)
