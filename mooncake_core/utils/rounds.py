"""Repeated timings reported as users read them: the first (cold) round apart, then the median
of the warm ones (pure).

Why: the first touch of fresh memory pays page faults, the first transfer to a peer opens
connections and maps its memory; a 4 MiB first-touch ``get`` reads 0.04-0.2 GB/s where the
steady figure is ~20x that. Printing that single first figure as "the" throughput misleads, so
the demos time several rounds and print the warm median with the cold round beside it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Rounds:
    """Seconds of each round, in the order they ran (at least one)."""

    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.seconds:
            raise ValueError("Rounds: no round was timed")

    @property
    def first(self) -> float:
        return self.seconds[0]

    @property
    def warm(self) -> float:
        """Median of the rounds after the first (the first itself when only one ran)."""
        rest = self.seconds[1:] or self.seconds
        return statistics.median(rest)

    def rate(self, nbytes: int) -> str:
        """``'<warm> GB/s (median of N warm rounds; first <cold> GB/s)'``."""
        warm_n = max(len(self.seconds) - 1, 1)
        warm = f"{_gbps(nbytes, self.warm):.2f} GB/s"
        if len(self.seconds) == 1:
            return f"{warm} (1 round)"
        return f"{warm} (median of {warm_n} warm rounds; first {_gbps(nbytes, self.first):.2f} GB/s)"


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / max(seconds, 1e-9) / 1e9
