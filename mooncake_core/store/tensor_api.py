"""Tensor methods on caller-owned buffers, batch upserts and tensor-parallel (TP) variants.

``TensorApiMixin`` is a base class of ``MooncakeDistributedStore`` (upstream method names,
argument order, defaults and return conventions):

* ``get_tensor_into`` / ``batch_get_tensor_into``: read a stored tensor object straight into
  a preallocated buffer and return a tensor that *aliases* that buffer (None on a miss or a
  too-small buffer) -- what inference frameworks with preallocated pools need.
* ``put_tensor_from`` / ``upsert_tensor_from`` (+ batch): store a buffer that already holds a
  serialized tensor object (header + elements, the layout ``get_tensor_into`` leaves behind);
  the header is validated first (-600 if it is not one).
* ``*_with_tp*``: a tensor split along ``split_dim`` into ``tp_size`` uniform shards stored as
  ``{key}_tp_{rank}`` for every rank (see ``sharding.py``); a read fetches one rank's shard.

The stored layout is ``tensor.py``'s (``MCT1`` header + raw C-contiguous elements), so these
objects interoperate with ``put_tensor``/``get_tensor``. Writes go from the tensor's own
memory (two parts: header, elements) and reads land directly in the destination.
"""

from __future__ import annotations

from typing import Any

import mooncake_core.store.client as _cl
from mooncake_core.errors import ErrorCode
from mooncake_core.store import tensor as _tensor
from mooncake_core.store.offload import mem_view
from mooncake_core.store.sharding import ShardError, tp_key_name, uniform_shard_check
from mooncake_core.utils.log import get_logger

__all__ = ["TensorApiMixin"]

log = get_logger("mooncake.store.tensor_api")

OK = 0
_INVALID = int(ErrorCode.INVALID_PARAMS)
_ITEMSIZE = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "uint8": 1, "int8": 1, "int16": 2,
    "int32": 4, "int64": 8, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8,
    "complex128": 16, "uint16": 2, "uint32": 4, "uint64": 8,
}
_MAX_HEADER = _tensor.HEADER_FIXED + 8 * _tensor.MAX_NDIM


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
    tp_rank = _cl._check_int(tp_rank, f"{op}: tp_rank")
    tp_size = _cl._check_int(tp_size, f"{op}: tp_size", minimum=-(1 << 31))
    if isinstance(split_dim, bool) or not isinstance(split_dim, int):
        raise TypeError(f"{op}: split_dim must be int, got {type(split_dim).__name__}")
    return tp_rank, tp_size, split_dim


class TensorApiMixin:
    """Tensor ``_into``/``_from``, batch upsert and TP methods of the store client."""

    # ------------------------------------------------------------------ internals
    def _tensor_reads(self, keys: list[str], ptrs: list[int], sizes: list[int], op: str) -> list[Any]:
        """Read each key into its buffer; a tensor aliasing the buffer, or None."""
        dests: list[Any] = [[ps] for ps in zip(ptrs, sizes)]
        rcs = self._call_list(lambda: self._read_batch(keys, dests, op), len(keys))  # type: ignore[attr-defined]
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

    def _put_tensors(self, keys: list[str], tensors: list[Any], cfg: Any, *, upsert: bool, op: str) -> list[int]:
        """One batched put/upsert of tensors, each written from its own memory."""
        if len(set(keys)) != len(keys):
            raise ValueError(f"{op}: duplicate keys in one batch")
        if not keys:
            return []
        parts: list[list[tuple[int, int]]] = []
        keep: list[Any] = []
        for t in tensors:
            header, payload, k = _tensor.tensor_payload(t)
            p = [(_cl._bytes_addr(header), len(header))]
            if len(payload):
                p.append((_cl._buffer_addr(payload, op)[0], len(payload)))
            parts.append(p)
            keep.append((header, payload, k))
        if upsert:
            self._forget(keys)  # type: ignore[attr-defined]
        return self._call_list(lambda: self._put_many(keys, parts, cfg, upsert=upsert, op=op),  # type: ignore[attr-defined]
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
                return [_INVALID] * len(keys)
        if upsert:
            self._forget(keys)  # type: ignore[attr-defined]
        return self._call_list(lambda: self._put_many(keys, [[(p, n)] for p, n in zip(ptrs, exact)],  # type: ignore[attr-defined]
                                                      _cl.ReplicateConfig(), upsert=upsert, op=op), len(keys))

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
        owner: list[int] = []
        for i, (k, t) in enumerate(zip(base_keys, tensors)):
            try:
                parts = self._shards(t, tp_size, split_dim)
            except ShardError as e:
                log.warning("%s(%r): %s", op, k, e)
                out[i] = _INVALID
                continue
            for r, s in enumerate(parts):
                keys.append(tp_key_name(k, r))
                shards.append(s)
                owner.append(i)
        rcs = self._put_tensors(keys, shards, cfg, upsert=upsert, op=op)
        for i, rc in zip(owner, rcs):
            if rc != OK and out[i] == OK:
                out[i] = rc
        return out

    # ------------------------------------------------------------------ into / from
    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        """Read the tensor object ``key`` into ``[buffer_ptr, buffer_ptr+size)`` and return a
        tensor aliasing the element bytes there; None if missing, too big for the buffer
        (logged), or not a tensor. The buffer must outlive the returned tensor."""
        key = _cl._check_key(key, "get_tensor_into")
        buffer_ptr = _cl._check_int(buffer_ptr, "get_tensor_into: buffer_ptr", minimum=1)
        size = _cl._check_int(size, "get_tensor_into: size")
        _tensor.require_torch()
        return self._tensor_reads([key], [buffer_ptr], [size], "get_tensor_into")[0]

    def batch_get_tensor_into(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[Any]:
        """``get_tensor_into`` for many keys in one master round trip; one tensor/None per key."""
        keys = _cl._check_keys(keys, "batch_get_tensor_into")
        ptrs, sizes = self._check_ptr_lists("batch_get_tensor_into", keys, buffer_ptrs, sizes)  # type: ignore[attr-defined]
        _tensor.require_torch()
        return self._tensor_reads(keys, ptrs, sizes, "batch_get_tensor_into") if keys else []

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Store the serialized tensor object held at ``buffer_ptr`` (e.g. what
        ``get_tensor_into`` read). 0, -600 if the buffer does not hold one, or a store code."""
        key = _cl._check_key(key, "put_tensor_from")
        ptr = _cl._check_int(buffer_ptr, "put_tensor_from: buffer_ptr", minimum=1)
        size = _cl._check_int(size, "put_tensor_from: size")
        return self._put_tensor_buffers([key], [ptr], [size], upsert=False, op="put_tensor_from")[0]

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """``put_tensor_from`` that replaces an existing object."""
        key = _cl._check_key(key, "upsert_tensor_from")
        ptr = _cl._check_int(buffer_ptr, "upsert_tensor_from: buffer_ptr", minimum=1)
        size = _cl._check_int(size, "upsert_tensor_from: size")
        return self._put_tensor_buffers([key], [ptr], [size], upsert=True, op="upsert_tensor_from")[0]

    def batch_put_tensor_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]:
        """Batch ``put_tensor_from``; any invalid buffer fails the whole batch with -600."""
        keys = _cl._check_keys(keys, "batch_put_tensor_from")
        ptrs, sizes = self._check_ptr_lists("batch_put_tensor_from", keys, buffer_ptrs, sizes)  # type: ignore[attr-defined]
        return self._put_tensor_buffers(keys, ptrs, sizes, upsert=False, op="batch_put_tensor_from")

    def batch_upsert_tensor_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]:
        """Batch ``upsert_tensor_from``."""
        keys = _cl._check_keys(keys, "batch_upsert_tensor_from")
        ptrs, sizes = self._check_ptr_lists("batch_upsert_tensor_from", keys, buffer_ptrs, sizes)  # type: ignore[attr-defined]
        return self._put_tensor_buffers(keys, ptrs, sizes, upsert=True, op="batch_upsert_tensor_from")

    # ------------------------------------------------------------------ batch upserts
    def batch_upsert_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        """Insert or replace many tensors in one master round trip; one code per key."""
        return self.batch_upsert_pub_tensor(keys, tensors_list)

    def batch_upsert_pub_tensor(self, keys: list[str], tensors_list: list[Any], config: Any = None) -> list[int]:
        """``batch_upsert_tensor`` with a ReplicateConfig."""
        keys = _cl._check_keys(keys, "batch_upsert_tensor")
        tensors = _tensor_list("batch_upsert_tensor", keys, tensors_list)
        cfg = _cl._check_config(config, "batch_upsert_tensor")
        return self._put_tensors(keys, tensors, cfg, upsert=True, op="batch_upsert_tensor")

    # ------------------------------------------------------------------ tensor parallelism
    def pub_tensor_with_tp(self, key: str, tensor: Any, config: Any = None, tp_rank: int = 0,
                           tp_size: int = 1, split_dim: int = 0) -> int:
        """Split ``tensor`` into ``tp_size`` uniform shards along ``split_dim`` and store all
        of them as ``{key}_tp_{rank}`` with ``config``. 0, -600 for an uneven split or a bad
        ``split_dim``, or a store code. (``tp_rank`` is accepted for upstream compatibility.)"""
        key = _cl._check_key(key, "pub_tensor_with_tp")
        _, tp_size, split_dim = _check_tp("pub_tensor_with_tp", tp_rank, tp_size, split_dim)
        cfg = _cl._check_config(config, "pub_tensor_with_tp")
        if tp_size <= 1:
            return self.pub_tensor(key, tensor, cfg)  # type: ignore[attr-defined]
        return self._put_tp([key], [tensor], cfg, tp_size, split_dim, "pub_tensor_with_tp")[0]

    def batch_put_tensor_with_tp(self, base_keys: list[str], tensors_list: list[Any], tp_rank: int = 0,
                                 tp_size: int = 1, split_dim: int = 0) -> list[int]:
        """``put_tensor_with_tp`` for many tensors in one batch; one code per base key."""
        return self.batch_pub_tensor_with_tp(base_keys, tensors_list, None, tp_rank, tp_size, split_dim)

    def batch_pub_tensor_with_tp(self, base_keys: list[str], tensors_list: list[Any], config: Any = None,
                                 tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> list[int]:
        """``pub_tensor_with_tp`` for many tensors in one batch; one code per base key."""
        op = "batch_pub_tensor_with_tp"
        base_keys = _cl._check_keys(base_keys, op)
        tensors = _tensor_list(op, base_keys, tensors_list)
        _, tp_size, split_dim = _check_tp(op, tp_rank, tp_size, split_dim)
        cfg = _cl._check_config(config, op)
        if tp_size <= 1:
            return self._put_tensors(base_keys, tensors, cfg, upsert=False, op=op)
        return self._put_tp(base_keys, tensors, cfg, tp_size, split_dim, op)

    def batch_get_tensor_with_tp(self, base_keys: list[str], tp_rank: int = 0, tp_size: int = 1) -> list[Any]:
        """Rank ``tp_rank``'s shard of each base key (the whole tensor when tp_size <= 1);
        None per miss."""
        base_keys = _cl._check_keys(base_keys, "batch_get_tensor_with_tp")
        tp_rank, tp_size, _ = _check_tp("batch_get_tensor_with_tp", tp_rank, tp_size)
        keys = base_keys if tp_size <= 1 else [tp_key_name(k, tp_rank) for k in base_keys]
        return self.batch_get_tensor(keys)  # type: ignore[attr-defined]

    def put_tensor_with_tp_from(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0,
                                tp_size: int = 1, split_dim: int = 0) -> int:
        """Like ``put_tensor_with_tp`` for a *full* tensor held serialized at ``buffer_ptr``
        (header + elements): its shards are stored as ``{key}_tp_{rank}``."""
        return self.batch_put_tensor_with_tp_from([key], [buffer_ptr], [size], tp_rank, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp_from(self, base_keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                      tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> list[int]:
        """Batch ``put_tensor_with_tp_from``; a buffer that is not a tensor object gets -600
        (the others are still stored)."""
        op = "batch_put_tensor_with_tp_from"
        base_keys = _cl._check_keys(base_keys, op)
        ptrs, sizes = self._check_ptr_lists(op, base_keys, buffer_ptrs, sizes)  # type: ignore[attr-defined]
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
                out[i] = _INVALID
        if idx:
            rcs = self._put_tp([base_keys[i] for i in idx], tensors, _cl.ReplicateConfig(), tp_size,
                               split_dim, op)
            for i, rc in zip(idx, rcs):
                out[i] = rc
        return out

    def get_tensor_with_tp_into(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0,
                                tp_size: int = 1, split_dim: int = 0) -> Any:
        """``get_tensor_into`` of rank ``tp_rank``'s shard (``{key}_tp_{tp_rank}``), or of
        ``key`` itself when tp_size <= 1."""
        key = _cl._check_key(key, "get_tensor_with_tp_into")
        tp_rank, tp_size, _ = _check_tp("get_tensor_with_tp_into", tp_rank, tp_size, split_dim)
        return self.get_tensor_into(key if tp_size <= 1 else tp_key_name(key, tp_rank), buffer_ptr, size)

    def batch_get_tensor_with_tp_into(self, base_keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                      tp_rank: int = 0, tp_size: int = 1) -> list[Any]:
        """``batch_get_tensor_into`` of rank ``tp_rank``'s shards."""
        base_keys = _cl._check_keys(base_keys, "batch_get_tensor_with_tp_into")
        tp_rank, tp_size, _ = _check_tp("batch_get_tensor_with_tp_into", tp_rank, tp_size)
        keys = base_keys if tp_size <= 1 else [tp_key_name(k, tp_rank) for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)


def _tensor_list(op: str, keys: list[str], tensors_list: Any) -> list[Any]:
    if not isinstance(tensors_list, (list, tuple)):
        raise TypeError(f"{op}: tensors_list must be a list of tensors, got {type(tensors_list).__name__}")
    if len(tensors_list) != len(keys):
        raise ValueError(f"{op}: {len(keys)} keys but {len(tensors_list)} tensors")
    return list(tensors_list)
