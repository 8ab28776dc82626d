"""The HTTP metadata server's key/value table (pure logic, no I/O).

Values are the raw PUT bodies (bytes), stored verbatim as Mooncake's server does. Budgets on
the number of keys and total bytes keep a misbehaving client from growing the server without
bound (Mooncake's ``MC_METADATA_MAX_KEYS`` / ``MC_METADATA_MAX_TOTAL_BYTES``). A generation
counter lets the persistence layer know whether the table changed since the last snapshot.
"""

from __future__ import annotations

import dataclasses
import enum


class PutResult(enum.Enum):
    STORED = "stored"
    KEY_BUDGET = "key budget exhausted"
    BYTE_BUDGET = "size budget exhausted"


@dataclasses.dataclass
class KVStore:
    max_keys: int = 65536
    max_total_bytes: int = 1 << 30
    data: dict[str, bytes] = dataclasses.field(default_factory=dict)
    total_bytes: int = 0
    generation: int = 0

    def __post_init__(self) -> None:
        self.total_bytes = sum(len(v) for v in self.data.values())

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def put(self, key: str, value: bytes) -> PutResult:
        old = self.data.get(key)
        if old is None and len(self.data) >= self.max_keys:
            return PutResult.KEY_BUDGET
        new_total = self.total_bytes - (len(old) if old is not None else 0) + len(value)
        if new_total > self.max_total_bytes:
            return PutResult.BYTE_BUDGET
        self.data[key] = bytes(value)
        self.total_bytes = new_total
        if old != value:
            self.generation += 1
        return PutResult.STORED

    def delete(self, key: str) -> bool:
        old = self.data.pop(key, None)
        if old is None:
            return False
        self.total_bytes -= len(old)
        self.generation += 1
        return True

    def keys(self, prefix: str = "") -> list[str]:
        return sorted(k for k in self.data if k.startswith(prefix))

    def snapshot(self) -> tuple[int, dict[str, bytes]]:
        """A copy of the table with its generation (values are immutable bytes)."""
        return self.generation, dict(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __contains__(self, key: object) -> bool:
        return key in self.data
