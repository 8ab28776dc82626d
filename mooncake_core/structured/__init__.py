"""Structured objects: batches of rows (RL rollouts, DataProto-like data) stored field by field.

``mooncake.structured_object_store`` (the original's module name) resolves here through
:mod:`mooncake_core.compat`. The original's tests and users reach a few of its helpers by their
underscore names (``_choose_leaf_codec``, ``_escape_key``); they are re-exported under those
names as well, pointing at the same functions.
"""

from __future__ import annotations

from mooncake_core.structured.infer import (
    MISSING,
    CodecDecision,
    InferredLeaf,
    InferredNode,
    choose_leaf_codec,
    escape_key,
    infer_structure,
)
from mooncake_core.structured.refs import (
    DATAPROTO_REF_HANDLE_TYPE,
    DATAPROTO_REF_HANDLE_VERSION,
    STORAGE_GROUP_ID,
    MooncakeDataProtoRef,
    RemoteBundleRef,
    StructuredFieldLocation,
    export_dataproto_ref,
    import_dataproto_ref,
    is_dataproto_ref_handle,
)
from mooncake_core.structured.catalog import DataProtoCatalog

# the original's spellings of the same helpers
_choose_leaf_codec = choose_leaf_codec
_escape_key = escape_key
_CodecDecision = CodecDecision
_InferredLeaf = InferredLeaf
_InferredNode = InferredNode
export_ref = export_dataproto_ref
import_ref = import_dataproto_ref

__all__ = [
    "DATAPROTO_REF_HANDLE_TYPE",
    "DATAPROTO_REF_HANDLE_VERSION",
    "MISSING",
    "STORAGE_GROUP_ID",
    "DataProtoCatalog",
    "MooncakeDataProtoRef",
    "RemoteBundleRef",
    "StructuredFieldLocation",
    "export_dataproto_ref",
    "import_dataproto_ref",
    "is_dataproto_ref_handle",
    "CodecDecision",
    "InferredLeaf",
    "InferredNode",
    "choose_leaf_codec",
    "escape_key",
    "infer_structure",
]
