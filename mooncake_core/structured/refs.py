"""DataProto references: which stored objects hold which fields of a batch, and their handles.

Why: in an RL pipeline each stage (rollout, old log-probs, rewards, ...) writes its fields of
the same batch as one stored object; a consumer needs only a small routing record -- field name
-> (stage, member, section) and stage -> manifest key -- to fetch the fields it wants. That
record crosses process boundaries as a JSON-safe *handle* (a dict). The handle format (type
``mooncake_dataproto_ref``, version 1, kind ``bundle_stages``, its field names) is the original
Mooncake's, so handles produced by either side are read by the other. Pure logic: no store.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

__all__ = [
    "DATAPROTO_REF_HANDLE_TYPE",
    "DATAPROTO_REF_HANDLE_VERSION",
    "STORAGE_GROUP_ID",
    "MooncakeDataProtoRef",
    "RemoteBundleRef",
    "StructuredFieldLocation",
    "export_dataproto_ref",
    "import_dataproto_ref",
    "is_dataproto_ref_handle",
    "json_safe",
    "resolve_dataproto_ref",
]

DATAPROTO_REF_HANDLE_TYPE = "mooncake_dataproto_ref"
DATAPROTO_REF_HANDLE_VERSION = 1
#: optional in version 1 (readers ignore unknown fields), required in version 2
STORAGE_GROUP_ID = "storage_group_id"
_KIND = "bundle_stages"
_SECTIONS = ("batch", "non_tensor_batch")


@dataclass
class RemoteBundleRef:
    """One stored object: the key of its manifest, and the manifest once read (empty until then)."""

    manifest_key: str
    manifest: dict[str, Any]


@dataclass(frozen=True)
class StructuredFieldLocation:
    """Where a field lives: the stage's object, the member inside it, the DataProto section."""

    stage: str
    member: str
    section: Literal["batch", "non_tensor_batch"]


@dataclass
class MooncakeDataProtoRef:
    """The routing record of one batch (no data, no dtypes or shapes: those are in manifests)."""

    batch_size: int
    stage_refs: dict[str, RemoteBundleRef]
    field_index: dict[str, StructuredFieldLocation]
    meta_info: dict[str, Any]
    namespace: str = "default"
    partition: str = "default"
    global_indexes: list[int] | None = None
    encoded_non_tensor: dict[str, Any] = field(default_factory=dict)
    storage_group_id: str | None = field(default=None, repr=False)


def json_safe(value: Any) -> Any:
    """``value`` with numpy scalars / arrays and tuples made plain JSON values; TypeError for
    anything JSON cannot hold (a handle must survive ``json.dumps`` and any transport)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    raise TypeError(f"DataProto ref handles hold only JSON-safe values, got {type(value).__name__}")


def is_dataproto_ref_handle(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("type") == DATAPROTO_REF_HANDLE_TYPE


def export_dataproto_ref(ref: MooncakeDataProtoRef) -> dict[str, Any]:
    """The JSON-safe handle of ``ref`` (manifest keys only, never manifest contents)."""
    if not isinstance(ref, MooncakeDataProtoRef):
        raise TypeError(f"expected MooncakeDataProtoRef, got {type(ref).__name__}")
    handle: dict[str, Any] = {
        "type": DATAPROTO_REF_HANDLE_TYPE,
        "version": DATAPROTO_REF_HANDLE_VERSION,
        "kind": _KIND,
        "batch_size": int(ref.batch_size),
        "namespace": ref.namespace,
        "partition": ref.partition,
        "global_indexes": json_safe(ref.global_indexes),
        "stage_refs": {stage: {"manifest_key": r.manifest_key} for stage, r in ref.stage_refs.items()},
        "field_index": {name: {"stage": loc.stage, "member": loc.member, "section": loc.section}
                        for name, loc in ref.field_index.items()},
        "meta_info": json_safe(ref.meta_info),
        "encoded_non_tensor": json_safe(ref.encoded_non_tensor),
    }
    if ref.storage_group_id is not None:
        handle[STORAGE_GROUP_ID] = ref.storage_group_id
    json.dumps(handle, ensure_ascii=False)  # proves the handle is transportable
    return handle


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"DataProto ref handle {what} must be a mapping, got {type(value).__name__}")
    return value


def _nonempty(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _global_indexes(value: Any) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in value):
        raise ValueError("DataProto ref handle global_indexes must be a list of integers or null")
    return list(value)


def import_dataproto_ref(handle: Mapping[str, Any]) -> MooncakeDataProtoRef:
    """The ref a handle describes; ValueError naming what is wrong with a malformed handle."""
    if not is_dataproto_ref_handle(handle):
        raise ValueError(f"not a Mooncake DataProto ref handle (expected type {DATAPROTO_REF_HANDLE_TYPE!r})")
    try:
        version = int(handle.get("version", -1))
    except (TypeError, ValueError):
        version = -1
    if version not in (DATAPROTO_REF_HANDLE_VERSION, 2):
        raise ValueError(f"unsupported DataProto ref handle version: {handle.get('version')!r} (known: 1, 2)")
    if handle.get("kind") != _KIND:
        raise ValueError(f"unsupported DataProto ref handle kind: {handle.get('kind')!r} (expected {_KIND!r})")
    stage_refs: dict[str, RemoteBundleRef] = {}
    for stage, raw in _mapping(handle.get("stage_refs"), "stage_refs").items():
        key = _mapping(raw, f"stage_refs[{stage!r}]").get("manifest_key")
        if not (_nonempty(stage) and isinstance(key, str) and key):
            raise ValueError(f"DataProto ref handle stage {stage!r}: stage names and manifest_key values must be "
                             f"non-empty strings")
        stage_refs[stage] = RemoteBundleRef(manifest_key=key, manifest={})
    field_index: dict[str, StructuredFieldLocation] = {}
    for name, raw in _mapping(handle.get("field_index"), "field_index").items():
        loc = _mapping(raw, f"field_index[{name!r}]")
        section = loc.get("section")
        if section not in _SECTIONS:
            raise ValueError(f"invalid DataProto field section for {name!r}: {section!r} (expected one of {_SECTIONS})")
        where, member = loc.get("stage"), loc.get("member")
        if not (_nonempty(name) and isinstance(where, str) and where and isinstance(member, str) and member):
            raise ValueError(f"DataProto ref handle field {name!r}: name, stage and member must be non-empty strings")
        if where not in stage_refs:
            raise ValueError(f"DataProto ref handle field {name!r} references unknown stage {where!r}")
        field_index[name] = StructuredFieldLocation(stage=where, member=member, section=section)
    group = handle.get(STORAGE_GROUP_ID)
    if (version == 2 and group is None) or (group is not None and not _nonempty(group)):
        raise ValueError(f"DataProto ref handle has an invalid {STORAGE_GROUP_ID}: {group!r}")
    try:
        batch_size = int(handle["batch_size"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"DataProto ref handle batch_size must be an integer, got {handle.get('batch_size')!r}") \
            from None
    return MooncakeDataProtoRef(
        batch_size=batch_size,
        stage_refs=stage_refs,
        field_index=field_index,
        meta_info=dict(_mapping(handle.get("meta_info", {}), "meta_info")),
        namespace=str(handle.get("namespace", "default")),
        partition=str(handle.get("partition", "default")),
        global_indexes=_global_indexes(handle.get("global_indexes")),
        encoded_non_tensor=dict(_mapping(handle.get("encoded_non_tensor", {}), "encoded_non_tensor")),
        storage_group_id=group,
    )


def resolve_dataproto_ref(ref: MooncakeDataProtoRef | Mapping[str, Any]) -> MooncakeDataProtoRef:
    """A ref, given a ref or its handle."""
    if isinstance(ref, MooncakeDataProtoRef):
        return ref
    if is_dataproto_ref_handle(ref):
        return import_dataproto_ref(ref)
    raise TypeError(f"expected MooncakeDataProtoRef or a DataProto handle, got {type(ref).__name__}")
