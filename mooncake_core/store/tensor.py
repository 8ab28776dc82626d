"""Tensor (de)serialisation for ``put_tensor`` / ``get_tensor``.

Layout of a stored tensor object: a fixed little-endian header followed by the raw element
bytes (C-contiguous)::

    magic b"MCT1" | u32 dtype code | u32 ndim | ndim x i64 shape | payload

Why not pickle/``torch.save``: a fixed header lets the payload be written straight from the
tensor's own memory and read straight into the destination (no extra copy of the payload in
Python), and a reader can validate size and dtype before trusting the bytes. torch is an
optional dependency: it is imported lazily and its absence gives a clear error.
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = [
    "HEADER_FIXED",
    "MAGIC",
    "TensorFormatError",
    "decode_header",
    "encode_header",
    "require_torch",
    "tensor_from_buffer",
    "tensor_payload",
]

MAGIC = b"MCT1"
_FIXED = struct.Struct("<4sII")
HEADER_FIXED = _FIXED.size
MAX_NDIM = 64

# dtype name <-> stable wire code (never renumber).
_DTYPE_CODES: dict[str, int] = {
    "float32": 1, "float64": 2, "float16": 3, "bfloat16": 4,
    "uint8": 5, "int8": 6, "int16": 7, "int32": 8, "int64": 9, "bool": 10,
    "float8_e4m3fn": 11, "float8_e5m2": 12, "complex64": 13, "complex128": 14,
    "uint16": 15, "uint32": 16, "uint64": 17,
}
_CODE_DTYPES = {v: k for k, v in _DTYPE_CODES.items()}


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


def encode_header(dtype_name: str, shape: tuple[int, ...]) -> bytes:
    """The header bytes for a tensor of ``dtype_name`` and ``shape``."""
    if len(shape) > MAX_NDIM:
        raise ValueError(f"put_tensor: ndim {len(shape)} exceeds {MAX_NDIM}")
    return _FIXED.pack(MAGIC, _DTYPE_CODES[dtype_name], len(shape)) + struct.pack(f"<{len(shape)}q", *shape)


def tensor_payload(tensor: Any) -> tuple[bytes, memoryview, Any]:
    """Return ``(header, payload_view, keepalive)`` for a CPU tensor.

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
    header = encode_header(name, tuple(int(s) for s in t.shape))
    if t.numel() == 0:
        return header, memoryview(b""), t
    flat = t.reshape(-1).view(torch.uint8)
    arr = flat.numpy()
    return header, memoryview(arr).cast("B"), (t, flat, arr)


def decode_header(buf: Any) -> tuple[str, tuple[int, ...], int]:
    """Parse the header at the start of ``buf``: ``(dtype_name, shape, header_len)``."""
    mv = memoryview(buf).cast("B")
    if len(mv) < HEADER_FIXED:
        raise TensorFormatError(f"tensor object too short ({len(mv)} bytes) for a header")
    magic, code, ndim = _FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise TensorFormatError(f"not a tensor object (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if code not in _CODE_DTYPES:
        raise TensorFormatError(f"unknown tensor dtype code {code}")
    if ndim > MAX_NDIM:
        raise TensorFormatError(f"tensor ndim {ndim} exceeds {MAX_NDIM}")
    hlen = HEADER_FIXED + 8 * ndim
    if len(mv) < hlen:
        raise TensorFormatError("tensor header truncated")
    shape = struct.unpack_from(f"<{ndim}q", mv, HEADER_FIXED)
    if any(s < 0 for s in shape):
        raise TensorFormatError(f"negative dimension in stored shape {shape}")
    return _CODE_DTYPES[code], tuple(shape), hlen


def tensor_from_buffer(buf: Any) -> Any:
    """Rebuild the tensor from a whole stored object. ``buf`` should be writable
    (bytearray / numpy array) so the tensor aliases it without a copy."""
    torch = require_torch()
    name, shape, hlen = decode_header(buf)
    dtype = getattr(torch, name)
    mv = memoryview(buf).cast("B")
    payload = mv[hlen:]
    itemsize = torch.empty((), dtype=dtype).element_size()
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
