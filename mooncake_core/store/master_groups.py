"""Object groups (the original's ``ReplicateConfig.group_ids``): objects put under one group
id live and go together.

* **Leases**: a read of one member leases every member -- a reader of part of a group (a
  model's layers, one request's KV blocks) keeps the rest from being evicted under it.
* **Eviction**: all or nothing -- a group is evicted only when none of its members is leased,
  and then every member goes, so a reader never finds half a group.

A put names its group with ``group_ids`` (one id per key of a batch; one for a single put);
a put of the key without one takes it out of its group. Pure: the master's state calls in
under its lock, and tells it when a key leaves the object table (``discard``), so the tables
never outgrow it.
"""

from __future__ import annotations

from collections.abc import Container

__all__ = ["ObjectGroups"]


class ObjectGroups:
    def __init__(self) -> None:
        self.of: dict[str, str] = {}  # key -> its group
        self.members: dict[str, set[str]] = {}  # group -> keys

    def __bool__(self) -> bool:
        return bool(self.of)

    def set(self, key: str, group: str) -> None:
        """``key`` was published in ``group`` ("" = in none)."""
        old = self.of.get(key)
        if old == group:
            return
        if old is not None:
            self._leave(key, old)
        if group:
            self.of[key] = group
            self.members.setdefault(group, set()).add(key)

    def discard(self, key: str) -> None:
        """``key`` left the object table (removed, evicted, its segment gone)."""
        group = self.of.get(key)
        if group is not None:
            self._leave(key, group)

    def _leave(self, key: str, group: str) -> None:
        del self.of[key]
        keys = self.members.get(group)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.members[group]

    def group_of(self, key: str, present: Container[str]) -> list[str] | None:
        """The members of ``key``'s group still in ``present`` (the object table), or None
        when ``key`` is in no group."""
        group = self.of.get(key)
        if group is None:
            return None
        keys = self.members.get(group, set())
        gone = [k for k in keys if k not in present]
        for k in gone:
            self._leave(k, group)
        return sorted(self.members.get(group, ()))
