"""One migration as one batched read: LMDeploy's assignment -> merged (local, remote, length) arrays.

Pure logic (numpy, no LMDeploy or socket import), unit-tested in tests/lmdeploy/test_lmdeploy_plan.py.

LMDeploy's ``CacheEngine.migrate`` (0.18, ``cache_engine/migration.py``) turns the decode's block
pairs into ``AssignmentInstruct(mr_key, target_offset, source_offset, length)`` entries: one per
layer per block for the packed ``(num_layers, num_blocks, block_bytes)`` pool. Its naming is from
the prefill's point of view: ``target_offset`` is inside the *remote* (prefill) region,
``source_offset`` inside the *local* (decode) region, and the decode READS remote -> local
(LMDeploy's own Mooncake backend does ``transfer_sync_read(remote, local + source_offset,
remote + target_offset, length)`` once per entry). We keep that meaning and:

* check every entry against the registered regions on both sides before any byte moves, so a bad
  assignment is refused whole with the offending entry named (never half-applied);
* refuse entries whose local destinations overlap (two sources for one byte is an LMDeploy-side
  bug that would otherwise silently keep whichever landed last);
* merge entries that are contiguous on *both* sides into one range: a prompt whose blocks were
  allocated in order on both engines becomes one range per layer, and when the whole layer is
  migrated (benchmarks, long prompts) consecutive layers merge as well.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np


class RegionInfo(NamedTuple):
    """One registered memory region as LMDeploy's endpoint info describes it (``mr_info`` entry)."""

    addr: int
    length: int
    offset: int = 0


class PlanError(ValueError):
    """An assignment that cannot be executed as given (named entry, expected vs got)."""


@dataclass(frozen=True)
class TransferPlan:
    """Merged ranges of one migration: read ``length[i]`` bytes at ``remote[i]`` into ``local[i]``."""

    local: np.ndarray
    remote: np.ndarray
    length: np.ndarray
    entries: int  # assignment entries before merging (for logs and benchmarks)

    @property
    def nbytes(self) -> int:
        return int(self.length.sum()) if len(self.length) else 0

    def __len__(self) -> int:
        return len(self.length)


_FIELDS = ("mr_key", "target_offset", "source_offset", "length")


def _field(task: Any, name: str) -> int:
    v = task[name] if isinstance(task, Mapping) else getattr(task, name)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise PlanError(f"assignment entry field {name!r} must be an integer, got {v!r}")
    return int(v)


def _entries_checked(items: list[Any]) -> np.ndarray:
    """Entry by entry, for the exact error (the fast path below found something unusual)."""
    for i, t in enumerate(items):
        try:
            row = [_field(t, f) for f in _FIELDS]
        except (KeyError, AttributeError) as e:
            raise PlanError(f"assignment entry {i} lacks field {e}") from None
        except PlanError as e:
            raise PlanError(f"assignment entry {i}: {e}") from None
        if any(not -(1 << 63) <= v < 1 << 63 for v in row):
            raise PlanError(f"assignment entry {i}: offset or length does not fit in 64 bits: {row}")
    raise PlanError("assignment entries are not plain integers")  # pragma: no cover - the loop raises


def _entries(batch: Iterable[Any]) -> np.ndarray:
    """(mr_key, target_offset, source_offset, length) rows as an int64 array.

    A migration is one entry per layer per block (8,192 for 32 layers x 256 blocks): the fields
    are read with one C-level getter per entry into one flat list of ints and typed by numpy,
    not checked one by one. (A flat list, not a list of per-entry tuples: 8,192 live tuples
    set off ~8 young-generation garbage collections per migration; ints are not tracked.)"""
    items = batch if isinstance(batch, list) else list(batch)
    if not items:
        return np.zeros((0, 4), dtype=np.int64)
    get = operator.itemgetter(*_FIELDS) if isinstance(items[0], Mapping) else operator.attrgetter(*_FIELDS)
    try:
        arr = np.array(list(itertools.chain.from_iterable(map(get, items))))
        arr = arr.reshape(len(items), 4) if arr.size == 4 * len(items) else None
    except (KeyError, AttributeError, TypeError, ValueError, OverflowError):
        arr = None
    if arr is None or arr.ndim != 2 or arr.shape[1] != 4 or arr.dtype.kind not in "iu" or \
            (arr.dtype.kind == "u" and int(arr.max()) >= 1 << 63):
        _entries_checked(items)
    return arr.astype(np.int64, copy=False)


def _bases(keys: np.ndarray, table: Mapping[str, RegionInfo], side: str) -> tuple[np.ndarray, np.ndarray]:
    """Base address and length of each entry's region (``table`` is keyed by ``str(mr_key)``)."""
    base = np.empty(len(keys), dtype=np.int64)
    size = np.empty(len(keys), dtype=np.int64)
    for key in np.unique(keys):
        region = table.get(str(int(key)))
        if region is None:
            raise PlanError(f"memory region mr_key={int(key)} is not registered on the {side} side "
                            f"(registered: {sorted(table) or 'none'})")
        sel = keys == key
        base[sel] = region.addr
        size[sel] = region.length
    return base, size


def build_plan(batch: Iterable[Any], local: Mapping[str, RegionInfo], remote: Mapping[str, RegionInfo],
               *, peer: str = "remote") -> TransferPlan:
    """Validate ``batch`` (``AssignmentInstruct`` objects or dicts) and merge it into ranges.

    ``local`` / ``remote`` map ``str(mr_key)`` to the registered region on each side. Raises
    ``PlanError`` naming the first bad entry; ``peer`` appears in messages about remote regions.
    """
    e = _entries(batch)
    n_in = len(e)
    if n_in == 0:
        empty = np.zeros(0, dtype=np.int64)
        return TransferPlan(empty, empty, empty, 0)
    keys, tgt, src, length = e[:, 0], e[:, 1], e[:, 2], e[:, 3]
    bad = np.flatnonzero((tgt < 0) | (src < 0) | (length < 0))
    if len(bad):
        i = int(bad[0])
        raise PlanError(f"assignment entry {i}: negative offset or length "
                        f"(target_offset={int(tgt[i])}, source_offset={int(src[i])}, length={int(length[i])})")
    lbase, lsize = _bases(keys, local, "local")
    rbase, rsize = _bases(keys, remote, f"remote ({peer})")
    for side, off, size in (("local", src, lsize), (f"remote ({peer})", tgt, rsize)):
        over = np.flatnonzero(off + length > size)
        if len(over):
            i = int(over[0])
            raise PlanError(f"assignment entry {i}: {int(length[i])} bytes at offset {int(off[i])} of mr_key="
                            f"{int(keys[i])} run past the end of the {side} region ({int(size[i])} bytes)")
    keep = length > 0
    la, ra, ln = (lbase + src)[keep], (rbase + tgt)[keep], length[keep]
    order = np.argsort(la, kind="stable")
    la, ra, ln = la[order], ra[order], ln[order]
    if len(la) > 1:
        clash = np.flatnonzero(la[1:] < la[:-1] + ln[:-1])
        if len(clash):
            i = int(clash[0])
            raise PlanError(f"assignment writes local bytes {int(la[i + 1]):#x}.. twice (two entries overlap "
                            "in the destination); refusing an ambiguous migration")
    # a new range starts wherever the previous one does not continue on both sides
    starts = np.ones(len(la), dtype=bool)
    if len(la) > 1:
        starts[1:] = (la[1:] != la[:-1] + ln[:-1]) | (ra[1:] != ra[:-1] + ln[:-1])
    idx = np.flatnonzero(starts)
    merged_len = np.add.reduceat(ln, idx) if len(idx) else ln
    return TransferPlan(local=la[idx], remote=ra[idx], length=merged_len.astype(np.int64), entries=n_in)
