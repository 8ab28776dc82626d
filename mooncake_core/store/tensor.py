"""Tensor (de)serialisation for ``put_tensor`` / ``get_tensor``.

Layout of a stored tensor object: a fixed little-endian header followed by the raw element
bytes (C-contiguous). A whole tensor (version 1)::

    magic b"MCT1" | u32 dtype code | u32 ndim | ndim x i64 shape | payload

A shard of a parallel split (version 2) also says what it holds of which global tensor, so a
reader with another split can find and cut the right bytes (``tensor_layout``)::

    magic b"MCT2" | u32 dtype code | u32 ndim | u32 naxes | ndim x i64 local shape
    | ndim x i64 global shape | naxes x (u8 kind, 3 pad, i32 rank, i32 size, i32 split_dim,
    i64 expert_id, i64 stage_id) | payload          (absent optional fields: INT64_MIN / -1)

Both versions are read; whole tensors are still written as version 1, so older readers keep
reading them.

Why not pickle/``torch.save``: a fixed header lets the payload be written straight from the
tensor's own memory and read straight into the destination (no extra copy of the payload in
Python), and a reader can validate size and dtype before trusting the bytes. torch is an
optional dependency: it is imported lazily and its absence gives a clear error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from mooncake_core.store.tensor_layout import AxisTag, ShardLayout

__all__ = [
    "HEADER_FIXED",
    "MAGIC",
    "MAGIC_V2",
    "MAX_HEADER",
    "TensorFormatError",
    "TensorHeader",
    "decode_header",
    "decode_tensor_header",
    "encode_header",
    "header_len",
    "require_torch",
    "tensor_from_buffer",
    "tensor_payload",
]

MAGIC = b"MCT1"
MAGIC_V2 = b"MCT2"
_FIXED = struct.Struct("<4sII")
_FIXED2 = struct.Struct("<4sIII")
_AXIS = struct.Struct("<B3xiiiqq")
HEADER_FIXED = _FIXED.size
MAX_NDIM = 64
MAX_AXES = 5
MAX_HEADER = _FIXED2.size + 16 * MAX_NDIM + _AXIS.size * MAX_AXES  # the longest header of either version
_NONE = -(1 << 63)
_KIND_CODES = {"tp": 1, "dp": 2, "ep": 3, "pp": 4, "writer": 5}
_CODE_KINDS = {v: k for k, v in _KIND_CODES.items()}

# dtype name <-> stable wire code (never renumber).
_DTYPE_CODES: dict[str, int] = {
    "float32": 1, "float64": 2, "float16": 3, "bfloat16": 4,
    "uint8": 5, "int8": 6, "int16": 7, "int32": 8, "int64": 9, "bool": 10,
    "float8_e4m3fn": 11, "float8_e5m2": 12, "complex64": 13, "complex128": 14,
    "uint16": 15, "uint32": 16, "uint64": 17,
}
_CODE_DTYPES = {v: k for k, v in _DTYPE_CODES.items()}
ITEMSIZE: dict[str, int] = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "uint8": 1, "int8": 1, "int16": 2,
    "int32": 4, "int64": 8, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8,
    "complex128": 16, "uint16": 2, "uint32": 4, "uint64": 8,
}


class TensorFormatError(ValueError):
    """The stored bytes are not a tensor written by ``put_tensor`` (or are truncated)."""


def require_torch() -> Any:
    """Import torch or raise an ImportError that says what to install."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is installed in CI
        raise ImportError(
            "put_tensor/get_tensor need PyTorch: pip install 'mooncake-core[torch]' (or torch)"
        ) from e
    return torch


def _dtype_name(torch: Any, dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPE_CODES:
        raise TypeError(f"put_tensor: dtype {dtype} is not supported (supported: {sorted(_DTYPE_CODES)})")
    return name


def _opt(v: int | None) -> int:
    return _NONE if v is None else v


def _unopt(v: int) -> int | None:
    return None if v == _NONE else v


def encode_header(dtype_name: str, shape: tuple[int, ...], layout: ShardLayout | None = None) -> bytes:
    """The header bytes for a tensor of ``dtype_name`` and ``shape`` (version 2 with
    ``layout``: ``shape`` must then be the layout's local shape)."""
    if len(shape) > MAX_NDIM:
        raise ValueError(f"put_tensor: ndim {len(shape)} exceeds {MAX_NDIM}")
    if layout is None:
        return _FIXED.pack(MAGIC, _DTYPE_CODES[dtype_name], len(shape)) + struct.pack(f"<{len(shape)}q", *shape)
    if len(layout.axes) > MAX_AXES:
        raise ValueError(f"a shard identity has at most {MAX_AXES} axes, got {len(layout.axes)}")
    if tuple(shape) != layout.local_shape():
        raise ValueError(f"shard shape {list(shape)} does not match its layout ({layout.describe()})")
    n = len(shape)
    out = [_FIXED2.pack(MAGIC_V2, _DTYPE_CODES[dtype_name], n, len(layout.axes)),
           struct.pack(f"<{n}q", *shape), struct.pack(f"<{n}q", *layout.global_shape)]
    out += [_AXIS.pack(_KIND_CODES[a.kind], a.rank, a.size, -1 if a.split_dim is None else a.split_dim,
                       _opt(a.expert_id), _opt(a.stage_id)) for a in layout.axes]
    return b"".join(out)


def tensor_payload(tensor: Any, layout: ShardLayout | None = None) -> tuple[bytes, memoryview, Any]:
    """Return ``(header, payload_view, keepalive)`` for a CPU tensor (a shard when ``layout``
    says what it holds of which global tensor).

    ``payload_view`` aliases the (contiguous) tensor memory; ``keepalive`` must stay
    referenced until the bytes are written.
    """
    torch = require_torch()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"put_tensor: expected a torch.Tensor, got {type(tensor).__name__}")
    name = _dtype_name(torch, tensor.dtype)
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    header = encode_header(name, tuple(int(s) for s in t.shape), layout)
    if t.numel() == 0:
        return header, memoryview(b""), t
    flat = t.reshape(-1).view(torch.uint8)
    arr = flat.numpy()
    return header, memoryview(arr).cast("B"), (t, flat, arr)


@dataclass(frozen=True)
class TensorHeader:
    dtype: str
    shape: tuple[int, ...]  # of the stored elements (a shard's local shape)
    header_len: int
    layout: ShardLayout | None  # None: a whole tensor (version 1)

    @property
    def payload_len(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * ITEMSIZE[self.dtype]


def header_len(ndim: int, naxes: int) -> int:
    """Length of the header of a tensor of ``ndim`` dimensions (version 2 when ``naxes``)."""
    return HEADER_FIXED + 8 * ndim if naxes == 0 else _FIXED2.size + 16 * ndim + _AXIS.size * naxes


def decode_tensor_header(buf: Any) -> TensorHeader:
    """Parse the header (either version) at the start of ``buf``."""
    mv = memoryview(buf).cast("B")
    if len(mv) < HEADER_FIXED:
        raise TensorFormatError(f"tensor object too short ({len(mv)} bytes) for a header")
    magic = bytes(mv[:4])
    if magic not in (MAGIC, MAGIC_V2):
        raise TensorFormatError(f"not a tensor object (magic {magic!r}, expected {MAGIC!r} or {MAGIC_V2!r})")
    v2 = magic == MAGIC_V2
    if v2:
        if len(mv) < _FIXED2.size:
            raise TensorFormatError("tensor header truncated")
        _, code, ndim, naxes = _FIXED2.unpack_from(mv, 0)
    else:
        _, code, ndim = _FIXED.unpack_from(mv, 0)
        naxes = 0
    if code not in _CODE_DTYPES:
        raise TensorFormatError(f"unknown tensor dtype code {code}")
    if ndim > MAX_NDIM:
        raise TensorFormatError(f"tensor ndim {ndim} exceeds {MAX_NDIM}")
    if naxes > MAX_AXES:
        raise TensorFormatError(f"tensor header names {naxes} axes (at most {MAX_AXES})")
    base = _FIXED2.size if v2 else HEADER_FIXED
    hlen = base + 8 * ndim + (8 * ndim + _AXIS.size * naxes if v2 else 0)
    if len(mv) < hlen:
        raise TensorFormatError("tensor header truncated")
    shape = struct.unpack_from(f"<{ndim}q", mv, base)
    if any(s < 0 for s in shape):
        raise TensorFormatError(f"negative dimension in stored shape {shape}")
    layout = None
    if v2:
        gshape = struct.unpack_from(f"<{ndim}q", mv, base + 8 * ndim)
        axes = []
        for i in range(naxes):
            kind, rank, size, sd, eid, sid = _AXIS.unpack_from(mv, base + 16 * ndim + _AXIS.size * i)
            if kind not in _CODE_KINDS:
                raise TensorFormatError(f"unknown axis kind code {kind} in a tensor header")
            axes.append(AxisTag(_CODE_KINDS[kind], rank, size, None if sd < 0 else sd, _unopt(eid), _unopt(sid)))
        layout = ShardLayout(tuple(gshape), tuple(axes))
        try:
            local = layout.local_shape()
        except ValueError as e:
            raise TensorFormatError(f"inconsistent shard layout in a tensor header: {e}") from None
        if local != tuple(shape):
            raise TensorFormatError(f"shard shape {list(shape)} does not match its layout ({layout.describe()})")
    return TensorHeader(_CODE_DTYPES[code], tuple(shape), hlen, layout)


def decode_header(buf: Any) -> tuple[str, tuple[int, ...], int]:
    """Parse the header at the start of ``buf``: ``(dtype_name, shape, header_len)``."""
    h = decode_tensor_header(buf)
    return h.dtype, h.shape, h.header_len


def tensor_from_buffer(buf: Any) -> Any:
    """Rebuild the tensor from a whole stored object. ``buf`` should be writable
    (bytearray / numpy array) so the tensor aliases it without a copy."""
    torch = require_torch()
    name, shape, hlen = decode_header(buf)
    dtype = getattr(torch, name)
    mv = memoryview(buf).cast("B")
    payload = mv[hlen:]
    itemsize = ITEMSIZE[name]
    numel = 1
    for s in shape:
        numel *= s
    if len(payload) != numel * itemsize:
        raise TensorFormatError(
            f"tensor payload is {len(payload)} bytes, expected {numel * itemsize} for {name}{list(shape)}"
        )
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    if payload.readonly:
        payload = memoryview(bytearray(payload))
    raw = torch.frombuffer(payload, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)
