"""``DataProtoCatalog``: logical rows (partition, key) -> where each of their fields is stored.

Why: an RL controller addresses samples by key ("prompt-17") while stages write fields in
batches, each batch one stored object (a single-stage DataProto handle). The catalog records,
per key, free-form tags (status, step, ...) and for each field the (fragment, row) that holds
it, so a later read of any keys and fields resolves to the fewest fragments, grouped so that
fields read from the same rows travel together. It holds metadata only: the data and its
lifetime stay with the store. A fragment's handle is kept while any (key, field) refers to it.

Same interface and results as the original Mooncake's ``mooncake.dataproto_catalog``. Not
thread-safe: one owner serialises calls (as the original requires). Pure logic.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mooncake_core.structured.refs import export_dataproto_ref, import_dataproto_ref

__all__ = ["DataProtoCatalog"]

Location = tuple[str, int]  # (fragment id = the stage's manifest key, row in that fragment)


@dataclass
class _Entry:
    tag: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, Location] = field(default_factory=dict)


@dataclass(frozen=True)
class _Fragment:
    fragment_id: str
    handle: dict[str, Any]
    fields: tuple[str, ...]


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _names(values: Any, what: str) -> tuple[str, ...]:
    if isinstance(values, str):
        raise ValueError(f"{what} must be a sequence of non-empty strings, got the string {values!r}")
    names = tuple(values)
    if not names or any(not isinstance(v, str) or not v for v in names):
        raise ValueError(f"{what} must be non-empty strings, got {list(names)!r}")
    if len(names) != len(set(names)):
        dupes = sorted({v for v in names if names.count(v) > 1})
        raise ValueError(f"{what} must be unique, repeated: {dupes}")
    return names


def _tags(tags: Sequence[Mapping[str, Any]] | None, count: int) -> list[dict[str, Any]] | None:
    if tags is None:
        return None
    if len(tags) != count:
        raise ValueError(f"tags must have the same length as keys ({len(tags)} tags for {count} keys)")
    if any(not isinstance(t, Mapping) for t in tags):
        raise TypeError("tags must be mappings (one dict per key)")
    return [copy.deepcopy(dict(t)) for t in tags]


def _fragment(handle: Mapping[str, Any], rows: int) -> _Fragment:
    ref = import_dataproto_ref(handle)
    if ref.batch_size != rows:
        raise ValueError(f"DataProto batch size {ref.batch_size!r} does not match {rows} logical keys")
    if len(ref.stage_refs) != 1:
        raise ValueError(f"catalog fragments must contain exactly one DataProto stage, got {sorted(ref.stage_refs)}")
    (stage_ref,) = ref.stage_refs.values()
    fields = tuple(ref.field_index)
    if not fields:
        raise ValueError("DataProto catalog fragments cannot be empty (the handle names no fields)")
    return _Fragment(_text(stage_ref.manifest_key, "manifest_key"), export_dataproto_ref(ref), fields)


def _field_union(entries: Mapping[str, _Entry], keys: Sequence[str]) -> list[str]:
    """The fields of ``keys``, each once, in first-seen order."""
    return list(dict.fromkeys(name for k in keys for name in entries[k].fields))


class DataProtoCatalog:
    """Tags and field locations of logical keys, per partition."""

    def __init__(self) -> None:
        self._partitions: dict[str, dict[str, _Entry]] = {}
        self._handles: dict[str, dict[str, Any]] = {}
        self._refs: dict[str, int] = {}  # fragment id -> (key, field) locations pointing at it

    # ---- writes ----------------------------------------------------------------------------
    def update(self, partition: str, keys: Sequence[str], *, tags: Sequence[Mapping[str, Any]] | None = None,
               handle: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Merge ``tags`` (one mapping per key) into the keys' tags and/or publish every field of
        a single-stage ``handle`` whose rows are ``keys`` in order. Everything is checked before
        anything changes. Returns the keys, their merged tags and the union of their fields."""
        partition = _text(partition, "partition")
        keys = _names(keys, "keys")
        new_tags = _tags(tags, len(keys))
        frag = _fragment(handle, len(keys)) if handle is not None else None
        if new_tags is None and frag is None:
            raise ValueError("catalog update requires tags or a DataProto handle")
        if frag is not None and self._handles.get(frag.fragment_id, frag.handle) != frag.handle:
            raise ValueError(f"DataProto fragment id collision: {frag.fragment_id!r} is already published "
                             f"with a different handle")
        entries = self._partitions.setdefault(partition, {})
        if frag is not None:
            self._handles.setdefault(frag.fragment_id, frag.handle)
            self._refs.setdefault(frag.fragment_id, 0)
        merged = []
        for row, key in enumerate(keys):
            entry = entries.setdefault(key, _Entry())
            if new_tags is not None:
                entry.tag.update(new_tags[row])
            merged.append(copy.deepcopy(entry.tag))
            if frag is not None:
                for name in frag.fields:
                    self._point(entry, name, (frag.fragment_id, row))
        return {"keys": list(keys), "tags": merged, "fields": _field_union(entries, keys)}

    def _point(self, entry: _Entry, name: str, location: Location) -> None:
        old = entry.fields.get(name)
        entry.fields[name] = location
        if old is not None and old[0] == location[0]:
            return  # same fragment (perhaps another row): the reference count is unchanged
        if old is not None:
            self._release(old[0])
        self._refs[location[0]] += 1

    def remove(self, partition: str, keys: Sequence[str]) -> None:
        """Forget ``keys`` (their writers are done); fragments no key refers to are dropped.
        Metadata only: the stored objects' lifetime stays with the store."""
        partition = _text(partition, "partition")
        keys = _names(keys, "keys")
        entries = self._partitions.get(partition)
        if entries is None:
            return
        for key in keys:
            entry = entries.pop(key, None)
            if entry is not None:
                for fragment_id, _row in entry.fields.values():
                    self._release(fragment_id)
        if not entries:
            del self._partitions[partition]

    def _release(self, fragment_id: str) -> None:
        self._refs[fragment_id] -= 1
        if self._refs[fragment_id] == 0:
            del self._refs[fragment_id]
            del self._handles[fragment_id]

    # ---- reads -----------------------------------------------------------------------------
    def resolve(self, partition: str, keys: Sequence[str], fields: Sequence[str] | None = None) -> dict[str, Any]:
        """The read plan for ``fields`` (all the keys' fields when None) of ``keys``, in order:
        ``field_groups`` lists fields that share the same (fragment, row) for every key with
        those locations, ``handles`` the fragments' handles. ValueError for an unknown key or a
        field some key does not have yet."""
        partition = _text(partition, "partition")
        keys = _names(keys, "keys")
        entries = self._partitions.get(partition, {})
        missing = [k for k in keys if k not in entries]
        if missing:
            raise ValueError(f"keys were not found in partition {partition!r}: {missing}")
        selected = list(_names(fields, "field names")) if fields is not None else _field_union(entries, keys)
        if not selected:
            raise ValueError(f"requested keys do not contain any fields yet: {list(keys)}")
        for key in keys:
            absent = [f for f in selected if f not in entries[key].fields]
            if absent:
                raise ValueError(f"fields are not ready for key {key!r}: {absent}")
        groups: dict[tuple[Location, ...], list[str]] = {}
        for name in selected:
            groups.setdefault(tuple(entries[k].fields[name] for k in keys), []).append(name)
        used = {fragment_id for locations in groups for fragment_id, _row in locations}
        return {
            "keys": list(keys),
            "tags": [copy.deepcopy(entries[k].tag) for k in keys],
            "fields": selected,
            "field_groups": [{"fields": names, "locations": list(locs)} for locs, names in groups.items()],
            "handles": {f: copy.deepcopy(self._handles[f]) for f in used},
        }

    def list(self, partition: str | None = None) -> dict[str, dict[str, Any]]:
        """Tags by partition and key (one partition, or all)."""
        if partition is not None:
            names = [p for p in (_text(partition, "partition"),) if p in self._partitions]
        else:
            names = list(self._partitions)
        return {p: {k: copy.deepcopy(e.tag) for k, e in self._partitions[p].items()} for p in names}
