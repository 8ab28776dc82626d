"""Parse human size strings ("1 GB", "512MiB", 4096) the way Mooncake's config does.

Why here: the store's ``setup`` and the master/CLI flags accept sizes as strings; a bad
value (e.g. "50%") must be rejected with a message naming the offending value.
"""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024, "kb": 1024, "kib": 1024,
    "m": 1024**2, "mb": 1024**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1024**3, "gib": 1024**3,
    "t": 1024**4, "tb": 1024**4, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | float | str, *, name: str = "size") -> int:
    """Return a byte count for ``value``; raise ValueError naming ``name`` on bad input.

    Units are binary (Mooncake treats "1 GB" as 1 GiB). Negative values, percentages and
    unknown units are rejected.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a size (int or string like '1 GB'), got bool {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name}: size must be >= 0, got {value}")
        return value
    if isinstance(value, float):
        if value < 0 or value != value:
            raise ValueError(f"{name}: size must be >= 0, got {value}")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"{name}: expected a size (int or string like '1 GB'), got {type(value).__name__}")
    m = _SIZE_RE.match(value)
    if not m:
        raise ValueError(f"{name}: cannot parse size {value!r} (expected e.g. 4096, '512MB', '1 GB')")
    number, unit = m.groups()
    mult = _UNITS.get(unit.lower())
    if mult is None:
        raise ValueError(f"{name}: unknown unit {unit!r} in {value!r} (use B, KB, MB, GB, TB)")
    return int(float(number) * mult)


def format_size(n: float) -> str:
    """Human-readable binary size, for logs and progress lines."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
