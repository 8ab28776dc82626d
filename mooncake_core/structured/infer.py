"""How a column of per-row Python values is stored: codec choice and structure expansion.

Why: RL pipelines hand batches of rows between stages whose non-tensor fields are arbitrary
Python values (token lists, strings, nested dicts of tensors, images). Pickling each row is
slow and opaque; instead each column is looked at once and given the tightest codec that
holds every row (a ragged tensor, one typed buffer plus offsets, a UTF-8 blob, ...), and a
column of dicts or short lists of containers is expanded into one column per key / position
so each leaf can get its own codec. Pure logic: no store, no I/O.

The names, codec strings and decisions follow the original Mooncake's structured-object store
(``mooncake.structured_object_store``), so code and tests written against it see the same
choices. Two sentinels matter: ``None`` is a value the row holds; :data:`MISSING` marks a dict
key or list position the row does not have at all. They decode differently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

try:  # torch is optional: without it no column is a tensor column
    import torch as _torch
except Exception:  # pragma: no cover - torch-less installs
    _torch = None  # type: ignore[assignment]

__all__ = [
    "MAX_DEPTH",
    "MAX_LIST_LEN",
    "MAX_STRUCT_KEYS",
    "MISSING",
    "CodecDecision",
    "InferredLeaf",
    "InferredNode",
    "choose_leaf_codec",
    "escape_key",
    "infer_structure",
    "non_null",
]

#: a dict column with more distinct keys than this is kept whole (msgpack), not expanded
MAX_STRUCT_KEYS = 64
#: a list column longer than this (in any row) is kept whole, not expanded per position
MAX_LIST_LEN = 8
#: nesting deeper than this is refused (a cycle or a pathological value)
MAX_DEPTH = 32

#: the codec names (the original's strings; they are also written into manifests)
RAGGED_TENSOR = "ragged_tensor"
TYPED_RAGGED = "typed_ragged"
NDARRAY = "ndarray"
BYTES_RAGGED = "bytes_ragged"
UTF8_RAGGED = "utf8_ragged"
MSGPACK_RAGGED = "msgpack_ragged"
MEDIA_LIST_RAGGED = "media_list_ragged"
MEDIA_BYTES = "media_bytes"


class _Missing:
    """A dict key (or list position) absent from a row -- not the same as a ``None`` value."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<MISSING>"

    def __reduce__(self) -> str:  # one instance, also across pickling
        return "MISSING"


MISSING = _Missing()


@dataclass
class CodecDecision:
    """The codec chosen for a column; ``accepted`` False means no codec holds every row
    (``codec`` then names the one that was closest, ``reason`` says why it does not fit)."""

    accepted: bool
    codec: str
    reason: str
    normalized_type: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferredLeaf:
    """A column that is stored with one codec: its path from the root and its per-row values."""

    path: str
    values: list[Any]
    decision: CodecDecision


@dataclass
class InferredNode:
    """An expanded container column. ``children`` are the dict keys (sorted) or the list
    positions; ``lengths`` the per-row list lengths (lists only); ``row_mask`` which rows hold
    a container at all (False: the row is None or MISSING here)."""

    path: str
    node_type: str
    children: list[Any]
    lengths: list[int] | None = None
    row_mask: list[bool] | None = None


def non_null(values: list[Any]) -> list[Any]:
    """The rows that hold a value (neither None nor MISSING)."""
    return [v for v in values if v is not None and not isinstance(v, _Missing)]


def _is_pil_image(value: Any) -> bool:
    module = getattr(type(value), "__module__", "") or ""
    return module.startswith("PIL.") and hasattr(value, "save")


def _is_bytes_like(value: Any) -> bool:
    return isinstance(value, (bytes, bytearray, memoryview))


def _is_media_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(_is_pil_image(v) or _is_bytes_like(v) for v in value)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.number))


def _common_numeric_dtype(rows: list[Any]) -> np.dtype[Any] | None:
    """The dtype every row (a sequence) promotes to, if it is numeric; None otherwise."""
    try:
        dtype = np.result_type(*[np.asarray(v).dtype for v in rows])
    except (TypeError, ValueError, OverflowError):
        return None
    return dtype if np.issubdtype(dtype, np.number) else None


def choose_leaf_codec(values: list[Any]) -> CodecDecision:
    """The codec for one column, looking at its non-null rows (first match wins):

    all tensors of one dtype -> ``ragged_tensor`` (mixed dtypes: refused); lists of images /
    bytes -> ``media_list_ragged``; numeric ndarrays or numeric sequences -> ``typed_ragged``;
    numeric scalars -> ``ndarray``; bytes -> ``bytes_ragged``; images -> ``media_bytes``;
    str -> ``utf8_ragged``; dicts / lists / tuples -> ``msgpack_ragged``. Anything else, or
    no non-null row at all, is refused (the caller then falls back to a generic encoding).
    """
    rows = non_null(values)
    if not rows:
        return CodecDecision(False, MSGPACK_RAGGED, "all rows are null", "msgpack")
    if _torch is not None and all(isinstance(v, _torch.Tensor) for v in rows):
        dtypes = sorted({str(v.dtype) for v in rows})
        if len(dtypes) != 1:
            return CodecDecision(False, RAGGED_TENSOR, f"mixed tensor dtype: {dtypes}", "torch.Tensor")
        return CodecDecision(True, RAGGED_TENSOR, "all non-null rows are Tensor", "torch.Tensor",
                             {"dtype": dtypes[0]})
    if all(_is_media_list(v) for v in rows):
        return CodecDecision(True, MEDIA_LIST_RAGGED, "all rows are media lists", "media list")
    if all(isinstance(v, np.ndarray) for v in rows):
        if all(np.issubdtype(v.dtype, np.number) for v in rows):
            return CodecDecision(True, TYPED_RAGGED, "all rows are numeric ndarray", "numeric sequence",
                                 {"recursive_source": "ndarray"})
        return CodecDecision(False, MSGPACK_RAGGED, "object ndarray rows", "python object")
    if all(isinstance(v, (list, tuple)) for v in rows):
        dtype = _common_numeric_dtype(rows)
        if dtype is not None:
            return CodecDecision(True, TYPED_RAGGED, "all rows are numeric sequences", "numeric sequence",
                                 {"dtype": str(dtype)})
    if all(_is_scalar(v) for v in rows):
        try:
            scalar_dtype = np.result_type(*rows)
        except (TypeError, ValueError, OverflowError):
            return CodecDecision(False, NDARRAY, "scalars without a common numpy dtype", "numeric scalar")
        if not (np.issubdtype(scalar_dtype, np.number) or np.issubdtype(scalar_dtype, np.bool_)):
            return CodecDecision(False, NDARRAY, f"scalars promote to {scalar_dtype}, not a number",
                                 "numeric scalar")
        return CodecDecision(True, NDARRAY, "all rows are numeric scalar", "numeric scalar",
                             {"dtype": str(scalar_dtype)})
    if all(_is_bytes_like(v) for v in rows):
        return CodecDecision(True, BYTES_RAGGED, "all rows are bytes-like", "bytes-like")
    if all(_is_pil_image(v) for v in rows):
        return CodecDecision(True, MEDIA_BYTES, "all rows are media", "media")
    if all(isinstance(v, str) for v in rows):
        return CodecDecision(True, UTF8_RAGGED, "all rows are str", "str")
    if all(isinstance(v, (dict, list, tuple)) for v in rows):
        return CodecDecision(True, MSGPACK_RAGGED, "all rows are msgpack-like", "msgpack")
    return CodecDecision(False, MSGPACK_RAGGED, "no codec matched", "python object")


def escape_key(key: str) -> str:
    """A dict key as one path component: ``\\``, ``.`` and ``[`` are backslash-escaped, so
    ``a.b`` the key never reads as ``a`` then ``b``."""
    return key.replace("\\", "\\\\").replace(".", "\\.").replace("[", "\\[")


def _dict_keys(values: list[Any]) -> list[str] | None:
    rows = non_null(values)
    if not rows or not all(isinstance(v, dict) for v in rows):
        return None
    keys = {k for v in rows for k in v}
    if len(keys) > MAX_STRUCT_KEYS or not all(isinstance(k, str) for k in keys):
        return None
    return sorted(keys)


def _list_shape(values: list[Any]) -> tuple[int, list[int]] | None:
    rows = non_null(values)
    if not rows or not all(isinstance(v, (list, tuple)) for v in rows):
        return None
    longest = max(len(v) for v in rows)
    if longest > MAX_LIST_LEN:
        return None
    if not all(item is None or isinstance(item, (dict, list, tuple)) for v in rows for item in v):
        return None  # a list of scalars/strings is one leaf (typed_ragged, msgpack), not columns
    return longest, [len(v) if isinstance(v, (list, tuple)) else 0 for v in values]


def infer_structure(path: str, values: list[Any], leaves: list[InferredLeaf], nodes: list[InferredNode],
                    *, _depth: int = 0) -> None:
    """Expand the column ``values`` at ``path`` into ``nodes`` (containers) and ``leaves``
    (stored columns), appending to both. A dict column gives one child per key (``path.key``),
    a list column of containers one per position (``path[i]``); rows without the container
    are None in the children, rows without the key / position are MISSING. ValueError past
    :data:`MAX_DEPTH` levels."""
    if _depth > MAX_DEPTH:
        raise ValueError(f"structure at {path!r} is nested deeper than {MAX_DEPTH} levels")
    keys = _dict_keys(values)
    if keys is not None:
        nodes.append(InferredNode(path, "dict", list(keys), row_mask=[isinstance(v, dict) for v in values]))
        for key in keys:
            child = [v.get(key, MISSING) if isinstance(v, dict) else None for v in values]
            infer_structure(f"{path}.{escape_key(key)}", child, leaves, nodes, _depth=_depth + 1)
        return
    shape = _list_shape(values)
    if shape is not None:
        longest, lengths = shape
        is_list = [isinstance(v, (list, tuple)) for v in values]
        nodes.append(InferredNode(path, "list", list(range(longest)), lengths, row_mask=is_list))
        for i in range(longest):
            child = [(v[i] if i < len(v) else MISSING) if is_list[r] else None for r, v in enumerate(values)]
            infer_structure(f"{path}[{i}]", child, leaves, nodes, _depth=_depth + 1)
        return
    leaves.append(InferredLeaf(path, values, choose_leaf_codec(values)))
