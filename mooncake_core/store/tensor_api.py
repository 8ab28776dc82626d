"""Tensor methods on caller-owned buffers, batch upserts and tensor-parallel (TP) variants.

``TensorApi`` is a delegate of ``MooncakeDistributedStore`` (upstream method names,
argument order, defaults and return conventions; typed against ``StoreInternals``):

* ``get_tensor_into`` / ``batch_get_tensor_into``: read a stored tensor object straight into
  a preallocated buffer and return a tensor that *aliases* that buffer (None on a miss or a
  too-small buffer) -- what inference frameworks with preallocated pools need.
* ``put_tensor_from`` / ``upsert_tensor_from`` (+ batch): store a buffer that already holds a
  serialized tensor object (header + elements, the layout ``get_tensor_into`` leaves behind);
  the header is validated first (-600 if it is not one).
* ``put/pub_tensor_with_tp*``: a tensor split along ``split_dim`` into ``tp_size`` uniform
  shards stored as ``{key}_tp_{rank}`` for every rank (see ``sharding.py``), each header
  saying what it holds; the reads (``get_tensor_with_tp*``) are ``ParallelApi``'s, which can
  cut a shard of another TP size from them.

The stored layout is ``tensor.py``'s (header + raw C-contiguous elements), so these
objects interoperate with ``put_tensor``/``get_tensor``. Writes go from the tensor's own
memory (two parts: header, elements) and reads land directly in the destination.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mooncake_core.errors import ErrorCode
from mooncake_core.store import tensor as _tensor
from mooncake_core.store.codes import INVALID, OK
from mooncake_core.store.internals import StoreInternals
from mooncake_core.store.memory import buffer_addr, bytes_addr
from mooncake_core.store.object_api import ObjectApi
from mooncake_core.store.offload import mem_view
from mooncake_core.store.types import ReplicateConfig
from mooncake_core.store.validate import check_config, check_int, check_key, check_keys, check_ptr_lists
from mooncake_core.store.sharding import ShardError, tp_key_name, uniform_shard_check
from mooncake_core.store.tensor_layout import AxisTag, ShardLayout
from mooncake_core.utils.log import get_logger

__all__ = ["TensorApi", "serialized_tensor_size"]

log = get_logger("mooncake.store.tensor_api")

_ITEMSIZE = _tensor.ITEMSIZE
_MAX_HEADER = _tensor.MAX_HEADER


def serialized_tensor_size(addr: int, size: int) -> int:
    """Bytes of the serialized tensor object at ``[addr, addr+size)`` (header + elements).

    Raises TensorFormatError if the buffer does not start with a valid header or is too
    short for the elements the header announces.
    """
    name, shape, hlen = _tensor.decode_header(mem_view(addr, min(size, _MAX_HEADER)))
    numel = 1
    for s in shape:
        numel *= s
    need = hlen + numel * _ITEMSIZE[name]
    if size < need:
        raise _tensor.TensorFormatError(f"buffer of {size} bytes is shorter than the tensor object "
                                        f"({name}{list(shape)}: {need} bytes)")
    return need


def _check_tp(op: str, tp_rank: Any, tp_size: Any, split_dim: Any = 0) -> tuple[int, int, int]:
    tp_rank = check_int(tp_rank, f"{op}: tp_rank")
    tp_size = check_int(tp_size, f"{op}: tp_size", minimum=-(1 << 31))
    if isinstance(split_dim, bool) or not isinstance(split_dim, int):
        raise TypeError(f"{op}: split_dim must be int, got {type(split_dim).__name__}")
    return tp_rank, tp_size, split_dim


class TensorApi:
    """Tensor methods of the store client: whole tensors, ``_into``/``_from`` on caller-owned
    buffers, batch upserts, tensor-parallel shards."""

    def __init__(self, core: StoreInternals, objects: ObjectApi) -> None:
        self.core = core
        self.objects = objects

    # ------------------------------------------------------------------ internals
    def _tensor_reads(self, keys: list[str], ptrs: list[int], sizes: list[int], op: str) -> list[Any]:
        """Read each key into its buffer; a tensor aliasing the buffer, or None."""
        dests: list[Any] = [[ps] for ps in zip(ptrs, sizes)]
        rcs = self.core.call_list(lambda: self.core.read_batch(keys, dests, op), len(keys))
        out: list[Any] = []
        for key, ptr, rc in zip(keys, ptrs, rcs):
            if rc < 0:
                if rc != int(ErrorCode.OBJECT_NOT_FOUND):
                    log.warning("%s(%r): read failed with %d", op, key, rc)
                out.append(None)
                continue
            try:
                out.append(_tensor.tensor_from_buffer(mem_view(ptr, rc)))
            except _tensor.TensorFormatError as e:
                log.warning("%s(%r): the object is not a tensor: %s", op, key, e)
                out.append(None)
        return out

    def put_tensors(self, keys: list[str], tensors: list[Any], cfg: Any, *, upsert: bool, op: str,
                    layouts: list[ShardLayout | None] | None = None) -> list[int]:
        """One batched put/upsert of tensors, each written from its own memory; ``layouts[i]``
        (a shard's place in its global tensor) goes into tensor i's header."""
        if len(set(keys)) != len(keys):
            raise ValueError(f"{op}: duplicate keys in one batch")
        if not keys:
            return []
        parts: list[list[tuple[int, int]]] = []
        keep: list[Any] = []
        for i, t in enumerate(tensors):
            header, payload, k = _tensor.tensor_payload(t, None if layouts is None else layouts[i])
            p = [(bytes_addr(header), len(header))]
            if len(payload):
                p.append((buffer_addr(payload, op)[0], len(payload)))
            parts.append(p)
            keep.append((header, payload, k))
        if upsert:
            self.core.forget(keys)
        return self.core.call_list(lambda: self.core.put_many(keys, parts, cfg, upsert=upsert, op=op),
                               len(keys), keep)

    def _put_tensor_buffers(self, keys: list[str], ptrs: list[int], sizes: list[int], *, upsert: bool,
                            op: str) -> list[int]:
        """Store buffers holding serialized tensor objects; all-or-nothing validation as upstream
        (one invalid buffer -> -600 for every key, nothing written)."""
        if len(set(keys)) != len(keys):
            raise ValueError(f"{op}: duplicate keys in one batch")
        if not keys:
            return []
        exact: list[int] = []
        for i, (k, p, n) in enumerate(zip(keys, ptrs, sizes)):
            try:
                exact.append(serialized_tensor_size(p, n))
            except _tensor.TensorFormatError as e:
                log.warning("%s: buffer %d (key %r) does not hold a tensor object: %s", op, i, k, e)
                return [INVALID] * len(keys)
        if upsert:
            self.core.forget(keys)
        return self.core.call_list(lambda: self.core.put_many(keys, [[(p, n)] for p, n in zip(ptrs, exact)],
                                                      ReplicateConfig(), upsert=upsert, op=op), len(keys))

    @staticmethod
    def _shards(tensor: Any, tp_size: int, split_dim: int) -> list[Any]:
        """Uniform shards along ``split_dim``; raises ShardError (-600) / TypeError."""
        torch = _tensor.require_torch()
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        n = uniform_shard_check(tuple(tensor.shape), split_dim, tp_size)
        # narrow() of a contiguous tensor along dim 0 stays a view (no copy); other dims
        # are made contiguous by tensor_payload, as they must be to be stored
        return [tensor.narrow(split_dim, r * n, n) for r in range(tp_size)]

    def _put_tp(self, base_keys: list[str], tensors: list[Any], cfg: Any, tp_size: int, split_dim: int,
                op: str, *, upsert: bool = False) -> list[int]:
        """Store every rank's shard of each tensor in one batch; per base key: 0 or the
        first failing shard's code (-600 for a split upstream would refuse)."""
        out = [OK] * len(base_keys)
        keys: list[str] = []
        shards: list[Any] = []
        layouts: list[ShardLayout | None] = []
        owner: list[int] = []
        for i, (k, t) in enumerate(zip(base_keys, tensors)):
            try:
                parts = self._shards(t, tp_size, split_dim)
            except ShardError as e:
                log.warning("%s(%r): %s", op, k, e)
                out[i] = INVALID
                continue
            shape = tuple(int(n) for n in t.shape)
            for r, s in enumerate(parts):
                keys.append(tp_key_name(k, r))
                shards.append(s)
                layouts.append(ShardLayout(shape, (AxisTag("tp", r, tp_size, split_dim),)))
                owner.append(i)
        rcs = self.put_tensors(keys, shards, cfg, upsert=upsert, op=op, layouts=layouts)
        for i, rc in zip(owner, rcs):
            if rc != OK and out[i] == OK:
                out[i] = rc
        return out

    # ------------------------------------------------------------------ whole tensors
    def put_tensor(self, key: str, tensor: Any) -> int:
        return self.pub_tensor(key, tensor)

    def pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        return self._tensor_put(key, tensor, config, upsert=False, op="put_tensor")

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        return self._tensor_put(key, tensor, None, upsert=True, op="upsert_tensor")

    def upsert_pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        return self._tensor_put(key, tensor, config, upsert=True, op="upsert_pub_tensor")

    def _tensor_put(self, key: str, tensor: Any, config: Any, *, upsert: bool, op: str) -> int:
        key = check_key(key, op)
        cfg = check_config(config, op)
        header, payload, keep = _tensor.tensor_payload(tensor)
        # two parts, header + the tensor's own memory: written without a staging copy
        parts = [(bytes_addr(header), len(header))]
        if len(payload):
            parts.append((buffer_addr(payload, op)[0], len(payload)))
        if upsert:
            self.core.forget([key])
        return self.core.call(lambda: self.core.put_many([key], [parts], cfg, upsert=upsert, op=op)[0],
                          (header, payload, keep))

    def get_tensor(self, key: str) -> Any:
        got = self.get_tensor_and_header(key)
        return None if got is None else got[0]

    def get_tensor_and_header(self, key: str) -> tuple[Any, _tensor.TensorHeader] | None:
        """The stored tensor ``key`` and its header (what it holds of which global tensor)."""
        key = check_key(key, "get_tensor")
        _tensor.require_torch()
        size = self.objects.get_size(key)
        if size < 0:
            return None
        buf = np.empty(size, dtype=np.uint8)
        rc = self.core.call(lambda: self.core.read_batch([key], [[(int(buf.ctypes.data), size)]], "get_tensor")[0])
        if rc < 0:
            return None
        return _tensor.tensor_from_buffer(buf[:rc]), _tensor.decode_tensor_header(buf[:rc])

    def batch_put_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        keys = check_keys(keys, "batch_put_tensor")
        if not isinstance(tensors_list, (list, tuple)) or len(tensors_list) != len(keys):
            raise ValueError("batch_put_tensor: tensors_list must be a list as long as keys")
        return [self.put_tensor(k, t) for k, t in zip(keys, tensors_list)]

    def batch_pub_tensor(self, keys: list[str], tensors_list: list[Any],
                         config: ReplicateConfig | None = None) -> list[int]:
        keys = check_keys(keys, "batch_pub_tensor")
        if not isinstance(tensors_list, (list, tuple)) or len(tensors_list) != len(keys):
            raise ValueError("batch_pub_tensor: tensors_list must be a list as long as keys")
        return [self.pub_tensor(k, t, config) for k, t in zip(keys, tensors_list)]

    def batch_get_tensor(self, keys: list[str]) -> list[Any]:
        keys = check_keys(keys, "batch_get_tensor")
        return [self.get_tensor(k) for k in keys]

    def put_tensor_with_tp(self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> int:
        return self.pub_tensor_with_tp(key, tensor, None, tp_rank, tp_size, split_dim)

    # ------------------------------------------------------------------ into / from
    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        key = check_key(key, "get_tensor_into")
        buffer_ptr = check_int(buffer_ptr, "get_tensor_into: buffer_ptr", minimum=1)
        size = check_int(size, "get_tensor_into: size")
        _tensor.require_torch()
        return self._tensor_reads([key], [buffer_ptr], [size], "get_tensor_into")[0]

    def batch_get_tensor_into(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[Any]:
        keys = check_keys(keys, "batch_get_tensor_into")
        if (isinstance(buffer_ptrs, (list, tuple)) and isinstance(sizes, (list, tuple))
                and not len(keys) == len(buffer_ptrs) == len(sizes)):
            # upstream answers this one with INVALID_PARAMS per key, not an exception
            log.error("batch_get_tensor_into: %d keys, %d buffer_ptrs, %d sizes (must match): every key gets -600",
                      len(keys), len(buffer_ptrs), len(sizes))
            return [INVALID] * len(keys)
        ptrs, sizes = check_ptr_lists("batch_get_tensor_into", keys, buffer_ptrs, sizes)
        _tensor.require_torch()
        return self._tensor_reads(keys, ptrs, sizes, "batch_get_tensor_into") if keys else []

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        key = check_key(key, "put_tensor_from")
        ptr = check_int(buffer_ptr, "put_tensor_from: buffer_ptr", minimum=1)
        size = check_int(size, "put_tensor_from: size")
        return self._put_tensor_buffers([key], [ptr], [size], upsert=False, op="put_tensor_from")[0]

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        key = check_key(key, "upsert_tensor_from")
        ptr = check_int(buffer_ptr, "upsert_tensor_from: buffer_ptr", minimum=1)
        size = check_int(size, "upsert_tensor_from: size")
        return self._put_tensor_buffers([key], [ptr], [size], upsert=True, op="upsert_tensor_from")[0]

    def batch_put_tensor_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]:
        keys = check_keys(keys, "batch_put_tensor_from")
        ptrs, sizes = check_ptr_lists("batch_put_tensor_from", keys, buffer_ptrs, sizes)
        return self._put_tensor_buffers(keys, ptrs, sizes, upsert=False, op="batch_put_tensor_from")

    def batch_upsert_tensor_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]:
        keys = check_keys(keys, "batch_upsert_tensor_from")
        ptrs, sizes = check_ptr_lists("batch_upsert_tensor_from", keys, buffer_ptrs, sizes)
        return self._put_tensor_buffers(keys, ptrs, sizes, upsert=True, op="batch_upsert_tensor_from")

    # ------------------------------------------------------------------ batch upserts
    def batch_upsert_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        return self.batch_upsert_pub_tensor(keys, tensors_list)

    def batch_upsert_pub_tensor(self, keys: list[str], tensors_list: list[Any], config: Any = None) -> list[int]:
        keys = check_keys(keys, "batch_upsert_tensor")
        tensors = _tensor_list("batch_upsert_tensor", keys, tensors_list)
        cfg = check_config(config, "batch_upsert_tensor")
        return self.put_tensors(keys, tensors, cfg, upsert=True, op="batch_upsert_tensor")

    # ------------------------------------------------------------------ tensor parallelism
    def pub_tensor_with_tp(self, key: str, tensor: Any, config: Any = None, tp_rank: int = 0,
                           tp_size: int = 1, split_dim: int = 0) -> int:
        key = check_key(key, "pub_tensor_with_tp")
        _, tp_size, split_dim = _check_tp("pub_tensor_with_tp", tp_rank, tp_size, split_dim)
        cfg = check_config(config, "pub_tensor_with_tp")
        if tp_size <= 1:
            return self.pub_tensor(key, tensor, cfg)
        return self._put_tp([key], [tensor], cfg, tp_size, split_dim, "pub_tensor_with_tp")[0]

    def batch_put_tensor_with_tp(self, base_keys: list[str], tensors_list: list[Any], tp_rank: int = 0,
                                 tp_size: int = 1, split_dim: int = 0) -> list[int]:
        return self.batch_pub_tensor_with_tp(base_keys, tensors_list, None, tp_rank, tp_size, split_dim)

    def batch_pub_tensor_with_tp(self, base_keys: list[str], tensors_list: list[Any], config: Any = None,
                                 tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> list[int]:
        op = "batch_pub_tensor_with_tp"
        base_keys = check_keys(base_keys, op)
        tensors = _tensor_list(op, base_keys, tensors_list)
        _, tp_size, split_dim = _check_tp(op, tp_rank, tp_size, split_dim)
        cfg = check_config(config, op)
        if tp_size <= 1:
            return self.put_tensors(base_keys, tensors, cfg, upsert=False, op=op)
        return self._put_tp(base_keys, tensors, cfg, tp_size, split_dim, op)

    def put_tensor_with_tp_from(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0,
                                tp_size: int = 1, split_dim: int = 0) -> int:
        return self.batch_put_tensor_with_tp_from([key], [buffer_ptr], [size], tp_rank, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp_from(self, base_keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                      tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> list[int]:
        op = "batch_put_tensor_with_tp_from"
        base_keys = check_keys(base_keys, op)
        ptrs, sizes = check_ptr_lists(op, base_keys, buffer_ptrs, sizes)
        _, tp_size, split_dim = _check_tp(op, tp_rank, tp_size, split_dim)
        if tp_size <= 1:
            return self._put_tensor_buffers(base_keys, ptrs, sizes, upsert=False, op=op)
        out = [OK] * len(base_keys)
        idx: list[int] = []
        tensors: list[Any] = []
        for i, (k, p, n) in enumerate(zip(base_keys, ptrs, sizes)):
            try:
                need = serialized_tensor_size(p, n)
                tensors.append(_tensor.tensor_from_buffer(mem_view(p, need)))  # aliases the buffer
                idx.append(i)
            except _tensor.TensorFormatError as e:
                log.warning("%s: buffer %d (key %r) does not hold a tensor object: %s", op, i, k, e)
                out[i] = INVALID
        if idx:
            rcs = self._put_tp([base_keys[i] for i in idx], tensors, ReplicateConfig(), tp_size,
                               split_dim, op)
            for i, rc in zip(idx, rcs):
                out[i] = rc
        return out


def _tensor_list(op: str, keys: list[str], tensors_list: Any) -> list[Any]:
    if not isinstance(tensors_list, (list, tuple)):
        raise TypeError(f"{op}: tensors_list must be a list of tensors, got {type(tensors_list).__name__}")
    if len(tensors_list) != len(keys):
        raise ValueError(f"{op}: {len(keys)} keys but {len(tensors_list)} tensors")
    return list(tensors_list)
