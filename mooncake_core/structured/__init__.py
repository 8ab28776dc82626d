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

# the original's spellings of the same helpers
_choose_leaf_codec = choose_leaf_codec
_escape_key = escape_key
_CodecDecision = CodecDecision
_InferredLeaf = InferredLeaf
_InferredNode = InferredNode

__all__ = [
    "MISSING",
    "CodecDecision",
    "InferredLeaf",
    "InferredNode",
    "choose_leaf_codec",
    "escape_key",
    "infer_structure",
]
