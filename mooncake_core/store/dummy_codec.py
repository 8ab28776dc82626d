"""Values of forwarded store calls on the dummy <-> ``mooncake_client`` channel.

One ``Codec`` per connection and side. Plain values (str, int, lists, dicts, small bytes) are
msgpack; the rest are msgpack ext types (codes in dummy_wire.py):

* bulk bytes (a put's value, a get's answer) travel through the connection's *staging window*,
  a shared region the dummy created: the sender copies them there (or, on the service side, the
  store reads/writes there directly) and sends only ``(offset, length)``. Bytes that do not fit
  the window go inline -- slower, never refused;
* tensors travel as (dtype, shape, bytes), their bytes staged like any bulk bytes; a tensor the
  service built *over the dummy's own memory* (``get_tensor_into``) comes back as a view of that
  memory, so the dummy gets a tensor over its buffer, as a full client returns;
* ``ReplicateConfig`` as its fields; ``BufferHandle`` as its bytes.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import Any

import msgspec

from mooncake_core.store.dummy_wire import (EXT_BUFFER, EXT_CONFIG, EXT_STAGED, EXT_TASK, EXT_TENSOR, EXT_VIEW,
                                            Message)
from mooncake_core.store.types import BufferHandle, QueryTaskResponse, ReplicateConfig, SoftPinAction

__all__ = ["STAGE_MIN", "Codec", "Staged"]

#: below this many bytes, a value goes inline (a copy into the window and a frame cost the same)
STAGE_MIN = 64 * 1024
_REF = struct.Struct("<QQ")
_CONFIG_FIELDS = ("replica_num", "nof_replica_num", "dfs_replica_num", "soft_pin_action", "soft_pin_ttl_ms",
                  "with_hard_pin", "preferred_segment", "preferred_segments", "prefer_alloc_in_same_node",
                  "preferred_nof_segments", "group_ids", "data_type")


class Staged:
    """Bytes already copied into the window at ``offset`` (the sender's marker)."""

    __slots__ = ("length", "offset")

    def __init__(self, offset: int, length: int) -> None:
        self.offset = offset
        self.length = length


def _torch() -> Any:
    import torch

    return torch


def _is_tensor(obj: Any) -> bool:
    mod = type(obj).__module__
    return mod.startswith("torch") and type(obj).__name__ in ("Tensor", "Parameter")


class Codec:
    """Encoder/decoder of one connection side.

    ``window``: (address here, size) of the staging window, or None (everything inline).
    ``zero_copy_in``: decoded staged bytes are memoryviews of the window (the service: valid
    for the duration of the call) rather than copies (the dummy: answers outlive the call).
    ``to_dummy``: service side, maps a local address inside a dummy region back to the dummy's.
    """

    def __init__(self, window: tuple[int, int] | None, *, zero_copy_in: bool,
                 to_dummy: Callable[[int], int | None] | None = None) -> None:
        self.window = window
        self._zero_copy_in = zero_copy_in
        self._to_dummy = to_dummy
        self._used = 0
        self.enc = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        #: whole messages (the tagged union) and ext payloads (plain msgpack)
        self.dec = msgspec.msgpack.Decoder(Message, ext_hook=self._ext_hook)  # type: ignore[arg-type]
        self._raw = msgspec.msgpack.Decoder(ext_hook=self._ext_hook)

    # ------------------------------------------------------------ staging
    def reset(self) -> None:
        """Start a new message: the window is free again."""
        self._used = 0

    def stage(self, addr: int, n: int) -> Staged | None:
        """Copy ``n`` bytes at ``addr`` into the window; None when they do not fit."""
        w = self.window
        if w is None or n > w[1] - self._used:
            return None
        off = self._used
        ctypes.memmove(w[0] + off, addr, n)
        self._used = off + ((n + 63) & ~63)
        return Staged(off, n)

    def reserve(self, n: int) -> tuple[int, int] | None:
        """(offset, address) of ``n`` window bytes the caller fills itself; None if they do not fit."""
        w = self.window
        if w is None or n > w[1] - self._used:
            return None
        off = self._used
        self._used = off + ((n + 63) & ~63)
        return off, w[0] + off

    @property
    def free(self) -> int:
        return 0 if self.window is None else self.window[1] - self._used

    def stage_value(self, value: Any, minimum: int = STAGE_MIN) -> Any:
        """``value`` (bytes-like) as a Staged marker when at least ``minimum`` bytes and it
        fits; else unchanged."""
        if isinstance(value, (str, int, float, bool)) or value is None or _is_tensor(value):
            return value
        try:
            mv = memoryview(value)
        except TypeError:
            return value
        if mv.nbytes < max(minimum, 1) or not mv.c_contiguous:
            return value
        import numpy as np

        addr = np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, dtype=np.uint8).ctypes.data
        staged = self.stage(addr, mv.nbytes)
        return value if staged is None else staged

    def _bulk(self, data: Any) -> Any:
        """Bytes of a tensor / buffer to send: staged when large, else inline bytes."""
        mv = memoryview(data).cast("B")
        if mv.nbytes >= STAGE_MIN:
            s = self.stage_value(mv)
            if isinstance(s, Staged):
                return s
        return bytes(mv)

    def _window_bytes(self, off: int, n: int) -> Any:
        w = self.window
        if w is None or off + n > w[1]:
            raise ValueError(f"staged bytes {off}+{n} outside the staging window")
        if self._zero_copy_in:
            return memoryview((ctypes.c_char * n).from_address(w[0] + off)).cast("B")
        return ctypes.string_at(w[0] + off, n)

    # ------------------------------------------------------------ hooks
    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, Staged):
            return msgspec.msgpack.Ext(EXT_STAGED, _REF.pack(obj.offset, obj.length))
        if isinstance(obj, BufferHandle):
            return msgspec.msgpack.Ext(EXT_BUFFER, self.enc.encode(self._bulk(obj)))
        if isinstance(obj, ReplicateConfig):
            return msgspec.msgpack.Ext(EXT_CONFIG, self.enc.encode(
                {f: (int(v) if isinstance(v, SoftPinAction) else v)
                 for f in _CONFIG_FIELDS if (v := getattr(obj, f, None)) is not None}))
        if _is_tensor(obj):
            return self._enc_tensor(obj)
        if isinstance(obj, SoftPinAction):
            return int(obj)
        if isinstance(obj, QueryTaskResponse):
            return msgspec.msgpack.Ext(EXT_TASK, self.enc.encode(
                (list(obj.id), int(obj.type), int(obj.status), obj.created_at_ms_epoch,
                 obj.last_updated_at_ms_epoch, obj.assigned_client, obj.message)))
        try:
            return memoryview(obj).cast("B").tobytes()
        except TypeError:
            # msgspec's enc_hook protocol: NotImplementedError means "type not supported", and
            # msgspec turns it into the TypeError the caller sees
            raise NotImplementedError(f"cannot send a {type(obj).__name__} to mooncake_client") from None

    def _enc_tensor(self, t: Any) -> Any:
        dtype = str(t.dtype).removeprefix("torch.")
        shape = list(t.shape)
        if self._to_dummy is not None and t.device.type == "cpu" and t.is_contiguous():
            addr = self._to_dummy(t.data_ptr())
            if addr is not None:
                return msgspec.msgpack.Ext(EXT_VIEW, self.enc.encode((addr, t.numel() * t.element_size(), dtype,
                                                                      shape)))
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        torch = _torch()
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
        return msgspec.msgpack.Ext(EXT_TENSOR, self.enc.encode((dtype, shape, self._bulk(raw))))

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code == EXT_STAGED:
            off, n = _REF.unpack(data)
            return self._window_bytes(off, n)
        if code == EXT_BUFFER:
            raw = self._raw.decode(data)
            return BufferHandle(bytes(raw))
        if code == EXT_CONFIG:
            cfg = ReplicateConfig()
            for k, v in self._raw.decode(data).items():
                if k in _CONFIG_FIELDS:
                    setattr(cfg, k, SoftPinAction(v) if k == "soft_pin_action" else v)
            return cfg
        if code == EXT_TENSOR:
            torch = _torch()
            dtype, shape, raw = self._raw.decode(data)
            dt = getattr(torch, dtype)
            if not len(raw):
                return torch.empty(shape, dtype=dt)
            buf = raw if isinstance(raw, memoryview) and self._zero_copy_in else bytearray(raw)
            return torch.frombuffer(buf, dtype=dt).reshape(shape)
        if code == EXT_TASK:
            tid, kind, status, created, updated, client, message = self._raw.decode(data)
            return QueryTaskResponse(tuple(tid), kind, status, created, updated, client, message)
        if code == EXT_VIEW:
            torch = _torch()
            addr, nbytes, dtype, shape = self._raw.decode(data)
            dt = getattr(torch, dtype)
            if nbytes == 0:
                return torch.empty(shape, dtype=dt)
            arr = (ctypes.c_ubyte * nbytes).from_address(addr)
            return torch.frombuffer(arr, dtype=dt).reshape(shape)
        raise ValueError(f"unknown ext type {code} on the dummy channel (a newer peer?)")
