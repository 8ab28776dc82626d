"""Notice when the machine starves the run: a thread that sleeps 50 ms at a time and records
every span in which it woke up more than half a second late.

Why: on a shared 2-core box every process of a run (clients, masters, etcd, the harness)
can be left without CPU for seconds at once; operations then take long although nothing
hung. Those spans are reported and left out of the hang accounting (checker.Timeline.stalls).
"""

from __future__ import annotations

import threading
import time

TICK_S = 0.05
LATE_S = 0.5


class StallWatch:
    def __init__(self) -> None:
        self.spans: list[tuple[int, int]] = []  # (start, end) ns, CLOCK_MONOTONIC
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)

    def start(self) -> "StallWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)

    def _run(self) -> None:
        while True:
            t = time.monotonic_ns()
            if self._stop.wait(TICK_S):
                return
            now = time.monotonic_ns()
            if now - t > (TICK_S + LATE_S) * 1e9:
                self.spans.append((t + int(TICK_S * 1e9), now))

    def summary(self) -> dict:
        lens = [(b - a) / 1e9 for a, b in self.spans]
        return {"n": len(lens), "total_s": round(sum(lens), 2), "longest_s": round(max(lens, default=0.0), 2)}
