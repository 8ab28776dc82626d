"""The unified parallel tensor IO API (``*_tensor_with_parallelism*``), upstream names.

``ParallelApi`` is a delegate of ``MooncakeDistributedStore``, built on its object and tensor
delegates. Writes name a shard with
a ``TensorParallelism`` (or a ``writer_partition`` shorthand); reads say what to materialise
with a ``ReadTarget``. Key naming and validation live in the pure ``parallelism`` module.

Write rules (as upstream): no parallelism -> the full tensor at ``key``; one TP axis -> the
tensor *is* the shard (stored as ``{key}_tp_{rank}``, shared with ``*_with_tp``); several
axes including TP -> the tensor is the full one and the TP rank's uniform slice is stored;
axes without TP -> stored as given. A request upstream refuses returns -600 (logged).

Read rules: ``as_stored`` reads the named object; ``shard`` reads the named shard, or slices
it out of a full tensor stored at ``key``; ``full`` concatenates every TP rank's shard along
``split_dim`` (or, without parallelism, follows the writer-partition manifest, else reads
``key``). A miss or a refused request gives None.
"""

from __future__ import annotations

from typing import Any

import msgspec

from mooncake_core.store import tensor as _tensor
from mooncake_core.store.codes import INVALID
from mooncake_core.store.object_api import ObjectApi
from mooncake_core.store.offload import mem_view
from mooncake_core.store.parallelism import (
    READ_MODES,
    ParallelAxis,
    ParallelismError,
    ReadTarget,
    WriterManifest,
    WriterPartition,
    parallelism_key,
    parse_writer_partition,
    tp_axis,
    validate_axes,
    with_tp_rank,
    writer_manifest_key,
    writer_shard_key,
)
from mooncake_core.store.sharding import ShardError, uniform_shard_check
from mooncake_core.store.tensor_api import TensorApi, serialized_tensor_size
from mooncake_core.store.validate import check_config, check_int, check_key, check_keys, check_ptr_lists
from mooncake_core.utils.log import get_logger

__all__ = ["ParallelApi"]

log = get_logger("mooncake.store.parallel_api")

_REFUSED = (ParallelismError, ShardError)


def _slice(tensor: Any, axis: ParallelAxis) -> Any:
    n = uniform_shard_check(tuple(tensor.shape), axis.split_dim or 0, axis.size)
    return tensor.narrow(axis.split_dim or 0, axis.rank * n, n)


def _batch_arg(op: str, name: str, value: Any, n: int) -> list[Any]:
    if value is None:
        return [None] * n
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{op}: {name} must be a list (one entry per key) or None, got {type(value).__name__}")
    if len(value) != n:
        raise ValueError(f"{op}: {n} keys but {len(value)} {name}")
    return list(value)


class ParallelApi:
    """``put/upsert/get_tensor_with_parallelism`` and their ``_from``/``_into``/batch forms."""

    def __init__(self, objects: ObjectApi, tensors: TensorApi) -> None:
        self.objects = objects
        self.tensors = tensors

    # ------------------------------------------------------------------ writes
    def _write_parallel(self, key: Any, tensor: Any, parallelism: Any, config: Any, writer_partition: Any,
                        *, upsert: bool, op: str) -> int:
        key = check_key(key, op)
        cfg = check_config(config, op)
        torch = _tensor.require_torch()
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{op}: expected a torch.Tensor, got {type(tensor).__name__}")
        try:
            if parallelism is not None and writer_partition is not None:
                raise ParallelismError(f"{op}: parallelism and writer_partition are mutually exclusive")
            if writer_partition is not None:
                return self._write_writer_shard(key, tensor, parse_writer_partition(writer_partition, op), cfg,
                                                upsert=upsert, op=op)
            if parallelism is None:
                return self.tensors.put_tensors([key], [tensor], cfg, upsert=upsert, op=op)[0]
            axes = validate_axes(parallelism, op)
            tp = tp_axis(axes)
            if tp is not None and len(axes) > 1:
                tensor = _slice(tensor, tp)  # multi-axis TP layouts take the full tensor
            return self.tensors.put_tensors([parallelism_key(key, axes)], [tensor], cfg,
                                     upsert=upsert, op=op)[0]
        except _REFUSED as e:
            log.warning("%s(%r): %s", op, key, e)
            return INVALID

    def _write_writer_shard(self, key: str, tensor: Any, w: WriterPartition, cfg: Any, *, upsert: bool,
                            op: str) -> int:
        shard = _slice(tensor, ParallelAxis("tp", w.rank, w.size, w.split_dim))
        manifest = msgspec.msgpack.encode(WriterManifest(w.size, w.split_dim, [int(s) for s in tensor.shape],
                                                         str(tensor.dtype).removeprefix("torch.")))
        rc = self.tensors.put_tensors([writer_shard_key(key, w)], [shard], cfg, upsert=upsert, op=op)[0]
        if rc != 0:
            return rc
        put = self.objects.upsert if upsert else self.objects.put
        return put(writer_manifest_key(key), manifest, cfg)

    def put_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: Any = None, config: Any = None,
                                    writer_partition: Any = None) -> int:
        return self._write_parallel(key, tensor, parallelism, config, writer_partition, upsert=False,
                                    op="put_tensor_with_parallelism")

    def upsert_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: Any = None, config: Any = None,
                                       writer_partition: Any = None) -> int:
        return self._write_parallel(key, tensor, parallelism, config, writer_partition, upsert=True,
                                    op="upsert_tensor_with_parallelism")

    def _tensor_at(self, ptr: Any, size: Any, op: str) -> Any:
        """The tensor serialized at ``ptr`` (aliasing it), or None if it is not one."""
        ptr = check_int(ptr, f"{op}: buffer_ptr", minimum=1)
        size = check_int(size, f"{op}: size")
        try:
            return _tensor.tensor_from_buffer(mem_view(ptr, serialized_tensor_size(ptr, size)))
        except _tensor.TensorFormatError as e:
            log.warning("%s: buffer %#x does not hold a tensor object: %s", op, ptr, e)
            return None

    def put_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism: Any = None,
                                         config: Any = None, writer_partition: Any = None) -> int:
        return self.batch_put_tensor_with_parallelism_from([key], [buffer_ptr], [size], [parallelism], config,
                                                           [writer_partition])[0]

    def upsert_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism: Any = None,
                                            config: Any = None, writer_partition: Any = None) -> int:
        return self.batch_upsert_tensor_with_parallelism_from([key], [buffer_ptr], [size], [parallelism], config,
                                                              [writer_partition])[0]

    def _batch_write(self, keys: Any, tensors: list[Any], parallelisms: Any, config: Any, writer_partitions: Any,
                     *, upsert: bool, op: str) -> list[int]:
        keys = check_keys(keys, op)
        if len(tensors) != len(keys):
            raise ValueError(f"{op}: {len(keys)} keys but {len(tensors)} tensors")
        pars = _batch_arg(op, "parallelisms", parallelisms, len(keys))
        wps = _batch_arg(op, "writer_partitions", writer_partitions, len(keys))
        return [INVALID if t is None else
                self._write_parallel(k, t, p, config, w, upsert=upsert, op=op)
                for k, t, p, w in zip(keys, tensors, pars, wps)]

    def batch_put_tensor_with_parallelism(self, keys: list[str], tensors_list: list[Any], parallelisms: Any = None,
                                          config: Any = None, writer_partitions: Any = None) -> list[int]:
        return self._batch_write(keys, _as_list("batch_put_tensor_with_parallelism", tensors_list), parallelisms,
                                 config, writer_partitions, upsert=False, op="batch_put_tensor_with_parallelism")

    def batch_upsert_tensor_with_parallelism(self, keys: list[str], tensors_list: list[Any],
                                             parallelisms: Any = None, config: Any = None,
                                             writer_partitions: Any = None) -> list[int]:
        return self._batch_write(keys, _as_list("batch_upsert_tensor_with_parallelism", tensors_list), parallelisms,
                                 config, writer_partitions, upsert=True, op="batch_upsert_tensor_with_parallelism")

    def _batch_write_from(self, keys: Any, buffer_ptrs: Any, sizes: Any, parallelisms: Any, config: Any,
                          writer_partitions: Any, *, upsert: bool, op: str) -> list[int]:
        keys = check_keys(keys, op)
        ptrs, sizes = check_ptr_lists(op, keys, buffer_ptrs, sizes)
        tensors = [self._tensor_at(p, n, op) for p, n in zip(ptrs, sizes)]
        return self._batch_write(keys, tensors, parallelisms, config, writer_partitions, upsert=upsert, op=op)

    def batch_put_tensor_with_parallelism_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                               parallelisms: Any = None, config: Any = None,
                                               writer_partitions: Any = None) -> list[int]:
        return self._batch_write_from(keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions,
                                      upsert=False, op="batch_put_tensor_with_parallelism_from")

    def batch_upsert_tensor_with_parallelism_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                                  parallelisms: Any = None, config: Any = None,
                                                  writer_partitions: Any = None) -> list[int]:
        return self._batch_write_from(keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions,
                                      upsert=True, op="batch_upsert_tensor_with_parallelism_from")

    # ------------------------------------------------------------------ reads
    def _plan_read(self, key: Any, target: Any, op: str) -> tuple[str | None, Any]:
        """``(primary_key, fallback)``: the object to read as stored (None if the result must
        be assembled) and a callable computing the tensor otherwise (or None)."""
        key = check_key(key, op)
        if target is None:
            target = ReadTarget()
        if not isinstance(target, ReadTarget):
            raise TypeError(f"{op}: target must be a ReadTarget or None, got {type(target).__name__}")
        mode = str(target.mode).lower()
        if mode not in READ_MODES:
            raise ValueError(f"{op}: ReadTarget.mode {target.mode!r} is not one of {list(READ_MODES)}")
        if target.parallelism is None:
            if mode == "as_stored":
                return key, None
            if mode == "shard":
                raise ParallelismError(f"{op}: mode 'shard' requires target.parallelism")
            return None, lambda: self._read_writer_full(key, op)
        axes = validate_axes(target.parallelism, op)
        tp = tp_axis(axes)
        if mode == "as_stored":
            return parallelism_key(key, axes), None
        if mode == "shard":
            def from_full() -> Any:
                full = self.tensors.get_tensor(key)
                return None if full is None or tp is None else _slice(full, tp).contiguous()
            return parallelism_key(key, axes), from_full
        if tp is None:
            raise ParallelismError(f"{op}: full reconstruction requires a TP axis")

        def gather() -> Any:
            names = [parallelism_key(key, with_tp_rank(axes, r)) for r in range(tp.size)]
            shards = self.tensors.batch_get_tensor(names)
            if all(s is not None for s in shards):
                return _tensor.require_torch().cat(shards, dim=tp.split_dim or 0)
            missing = [n for n, s in zip(names, shards) if s is None]
            log.info("%s(%r): shards %s missing; trying the full object", op, key, missing)
            return self.tensors.get_tensor(key)
        return None, gather

    def _read_writer_full(self, key: str, op: str) -> Any:
        raw = self.objects.get(writer_manifest_key(key))
        if not raw:
            return self.tensors.get_tensor(key)
        try:
            m = msgspec.msgpack.decode(raw, type=WriterManifest)
        except msgspec.DecodeError as e:
            log.warning("%s(%r): bad writer manifest: %s", op, key, e)
            return None
        names = [writer_shard_key(key, WriterPartition(r, m.size, m.split_dim)) for r in range(m.size)]
        shards = self.tensors.batch_get_tensor(names)
        if any(s is None for s in shards):
            log.warning("%s(%r): writer shards missing: %s", op, key,
                        [n for n, s in zip(names, shards) if s is None])
            return None
        full = _tensor.require_torch().cat(shards, dim=m.split_dim)
        if list(full.shape) != m.shape:
            log.warning("%s(%r): rebuilt shape %s differs from the manifest's %s", op, key, list(full.shape), m.shape)
            return None
        return full

    def get_tensor_with_parallelism(self, key: str, target: Any = None) -> Any:
        op = "get_tensor_with_parallelism"
        try:
            primary, fallback = self._plan_read(key, target, op)
            if primary is not None:
                t = self.tensors.get_tensor(primary)
                if t is not None or fallback is None:
                    return t
            return fallback()
        except _REFUSED as e:
            log.warning("%s(%r): %s", op, key, e)
            return None

    def get_tensor_with_parallelism_into(self, key: str, buffer_ptr: int, size: int, target: Any = None) -> Any:
        op = "get_tensor_with_parallelism_into"
        ptr = check_int(buffer_ptr, f"{op}: buffer_ptr", minimum=1)
        size = check_int(size, f"{op}: size")
        try:
            primary, fallback = self._plan_read(key, target, op)
            if primary is not None:
                t = self.tensors.get_tensor_into(primary, ptr, size)
                if t is not None or fallback is None:
                    return t
            t = fallback()
        except _REFUSED as e:
            log.warning("%s(%r): %s", op, key, e)
            return None
        if t is None:
            return None
        header, payload, keep = _tensor.tensor_payload(t)
        need = len(header) + len(payload)
        if need > size:
            log.warning("%s(%r): buffer of %d bytes is smaller than the tensor object (%d bytes)", op, key, size, need)
            return None
        dst = mem_view(ptr, need)
        dst[:len(header)] = header
        dst[len(header):] = payload
        del keep
        return _tensor.tensor_from_buffer(dst)

    def batch_get_tensor_with_parallelism(self, keys: list[str], targets: Any = None) -> list[Any]:
        op = "batch_get_tensor_with_parallelism"
        keys = check_keys(keys, op)
        if targets is None:
            return self.tensors.batch_get_tensor(keys)
        return [self.get_tensor_with_parallelism(k, t) for k, t in zip(keys, _batch_arg(op, "targets", targets,
                                                                                      len(keys)))]

    def batch_get_tensor_with_parallelism_into(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                               targets: Any = None) -> list[Any]:
        op = "batch_get_tensor_with_parallelism_into"
        keys = check_keys(keys, op)
        ptrs, sizes = check_ptr_lists(op, keys, buffer_ptrs, sizes)
        if targets is None:
            return self.tensors.batch_get_tensor_into(keys, ptrs, sizes)
        ts = _batch_arg(op, "targets", targets, len(keys))
        return [self.get_tensor_with_parallelism_into(k, p, n, t) for k, p, n, t in zip(keys, ptrs, sizes, ts)]


def _as_list(op: str, tensors_list: Any) -> list[Any]:
    if not isinstance(tensors_list, (list, tuple)):
        raise TypeError(f"{op}: tensors_list must be a list of tensors, got {type(tensors_list).__name__}")
    return list(tensors_list)
