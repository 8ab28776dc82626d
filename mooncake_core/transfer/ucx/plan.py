"""Pure planning of a UCX transfer over one or several NICs (rails): slices, windows, pairing.

Why windows: a rail learns about completion only from an endpoint flush, which covers every
operation posted before it. Posting a batch in windows of a few MiB, each closed by its own
flush, tells which bytes are done -- so a NIC that stops can be taken out and only its
unfinished windows moved to the other NICs, within the same deadline -- and lets NICs pull
windows from one queue, so a faster NIC carries more.
"""

from __future__ import annotations

import numpy as np

__all__ = ["pair", "pieces", "rail_groups", "slice_blocks", "split_blocks", "windows"]


def rail_groups(net_devices: str) -> list[str]:
    """``UCX_NET_DEVICES`` text -> one entry per NIC (ports of one device stay together):
    "mlx5_0:1,mlx5_0:2,mlx5_1:1" -> ["mlx5_0:1,mlx5_0:2", "mlx5_1:1"]; "" -> [""] (one rail:
    every device, UCX's own choice)."""
    names = [n for n in net_devices.split(",") if n]
    if len(names) <= 1:
        return [net_devices]
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(n.split(":", 1)[0], []).append(n)
    if len(groups) == 1:
        return [net_devices]
    return [",".join(v) for v in groups.values()]


def rail_name(group: str) -> str:
    """The device a rail is known by to peers ("mlx5_0:1,mlx5_0:2" -> "mlx5_0"; "" -> "all")."""
    return group.split(",", 1)[0].split(":", 1)[0] or "all"


def pair(name: str, index: int, remote: list[str]) -> int:
    """Which of the peer's rails our rail ``index`` (device ``name``) talks to: the one on the
    same device name when the peer has it (hosts cabled NIC to NIC), else by position."""
    if name in remote:
        return remote.index(name)
    return index % len(remote)


def slice_blocks(local: np.ndarray, remote: np.ndarray, length: np.ndarray, region: np.ndarray,
                 slice_bytes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cut blocks longer than ``slice_bytes`` into slices (order kept; int64 arrays)."""
    if slice_bytes <= 0:
        raise ValueError(f"slice_bytes must be > 0, got {slice_bytes}")
    pieces = np.maximum(1, -(-length // slice_bytes))
    if (pieces == 1).all():
        return local, remote, length, region
    rep = np.repeat(np.arange(len(length)), pieces)
    first = np.repeat(np.cumsum(pieces) - pieces, pieces)
    off = (np.arange(len(rep)) - first) * slice_bytes
    n = np.minimum(length[rep] - off, slice_bytes)
    return local[rep] + off, remote[rep] + off, n, region[rep]


def windows(length: np.ndarray, window_bytes: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) index ranges of at most ``window_bytes`` (a longer block alone)."""
    out: list[tuple[int, int]] = []
    n = len(length)
    if n == 0:
        return out
    ends = np.cumsum(length)
    start = 0
    base = 0
    while start < n:
        end = int(np.searchsorted(ends, base + window_bytes, side="right"))
        end = max(end, start + 1)
        out.append((start, end))
        base = int(ends[end - 1])
        start = end
    return out


def pieces(length: int, n: int, align: int = 4096) -> list[tuple[int, int]]:
    """``length`` bytes cut into at most ``n`` contiguous (offset, length) pieces of near-equal
    size, every cut on an ``align`` boundary (whole pages per worker); fewer pieces when the
    bytes do not fill ``n`` aligned ones."""
    if n <= 1 or length <= align:
        return [(0, length)]
    step = -(-length // n)
    step = -(-step // align) * align
    out = []
    off = 0
    while off < length:
        out.append((off, min(step, length - off)))
        off += step
    return out


def split_blocks(length: np.ndarray, n: int) -> list[tuple[int, int]]:
    """Blocks ``[start, end)`` index ranges for ``n`` workers, contiguous, carrying near-equal
    bytes (a block is never cut: slice long ones first); fewer ranges when there are fewer
    blocks. Every block is in exactly one range."""
    count = len(length)
    if n <= 1 or count <= 1:
        return [(0, count)]
    ends = np.cumsum(length)
    total = int(ends[-1])
    cuts = [0]
    for k in range(1, n):
        c = int(np.searchsorted(ends, total * k / n, side="left")) + 1
        c = min(max(c, cuts[-1] + 1), count)
        cuts.append(c)
    cuts.append(count)
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]
