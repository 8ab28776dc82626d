"""The unified parallel tensor IO API (``*_tensor_with_parallelism*``), upstream names.

``ParallelApi`` is a delegate of ``MooncakeDistributedStore``, built on its object, tensor
and byte-range delegates. Writes name a shard with a ``TensorParallelism`` (or a
``writer_partition`` shorthand); reads say what to materialise with a ``ReadTarget``. Key
naming and validation live in the pure ``parallelism`` module, the geometry of shards in the
pure ``tensor_layout`` module.

Write rules (as upstream): no parallelism -> the full tensor at ``key``; one TP axis -> the
tensor *is* the shard (stored as ``{key}_tp_{rank}``, shared with ``*_with_tp``); several
axes including TP -> the tensor is the full one and the TP rank's uniform slice is stored
(plus the group's ``__parallelism_manifest``); axes without TP -> stored as given. Every
shard's header records what it holds of which global tensor. A request upstream refuses
returns -600 (logged).

Read rules: ``as_stored`` reads the named object. ``shard`` reads the named object when its
header says it is exactly the requested shard; otherwise (the key was written with another
split, as writer partitions, or whole) it finds the stored split and reads, with ranged
reads, only the bytes of the stored shards that overlap the requested one. ``full`` reads all
of them (or the whole object). Each object read is checked against the split in the same
batch; a read that cannot be answered exactly -- a non-uniform target, shards of different
writes mixed -- is refused (logged with the key and both splits) and gives None, as a miss does.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import numpy as np

from mooncake_core.errors import ErrorCode
from mooncake_core.store import tensor as _tensor
from mooncake_core.store.codes import INVALID
from mooncake_core.store.object_api import ObjectApi
from mooncake_core.store.offload import mem_view
from mooncake_core.store.parallelism import (
    READ_MODES,
    ParallelAxis,
    ParallelismError,
    ParallelManifest,
    ReadTarget,
    WriterManifest,
    WriterPartition,
    axis_tags,
    parallelism_key,
    parallelism_manifest_key,
    parse_writer_partition,
    tp_axis,
    validate_axes,
    writer_manifest_key,
    writer_shard_key,
)
from mooncake_core.store.range_api import RangeApi
from mooncake_core.store.sharding import ShardError, tp_key_name, uniform_shard_check
from mooncake_core.store.tensor_api import TensorApi, serialized_tensor_size
from mooncake_core.store.tensor_layout import (
    AxisTag,
    Box,
    LayoutError,
    ShardLayout,
    StoredSplit,
    check_split,
    full_box,
    plan_assembly,
    shard_box,
)
from mooncake_core.store.validate import check_config, check_int, check_key, check_keys, check_ptr_lists
from mooncake_core.utils.log import get_logger

__all__ = ["ParallelApi"]

log = get_logger("mooncake.store.parallel_api")

_REFUSED = (ParallelismError, ShardError, LayoutError)
_M = TypeVar("_M", ParallelManifest, WriterManifest)


@dataclass(frozen=True)
class _Request:
    """A validated read: ``mode`` of ``key``, for the shard ``axes`` (None: none named)."""

    key: str
    mode: str
    axes: list[ParallelAxis] | None
    stored_dim: bool = False  # cut along the stored split's dim (the TP axis' split_dim only a fallback)


@dataclass(frozen=True)
class _Stored:
    """How a key is stored: the split, the object of each rank, where their elements start."""

    split: StoredSplit
    names: list[str]
    data_offset: int


def _with_tp(axes: list[ParallelAxis], rank: int, size: int, split_dim: int) -> list[ParallelAxis]:
    """The same identity for another TP rank/size (to name a stored split's shards)."""
    out = [copy.copy(a) for a in axes]
    for a in out:
        if a.kind == "tp":
            a.rank, a.size, a.split_dim = rank, size, split_dim
    return out


def _decode_manifest(raw: bytes, typ: type[_M], key: str) -> _M:
    try:
        return msgspec.msgpack.decode(raw, type=typ)
    except msgspec.DecodeError as e:
        raise LayoutError(f"{key!r}: unreadable {typ.__name__}: {e}") from None


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

    def __init__(self, objects: ObjectApi, tensors: TensorApi, ranges: RangeApi) -> None:
        self.objects = objects
        self.tensors = tensors
        self.ranges = ranges

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
            shape = tuple(int(n) for n in tensor.shape)
            if tp is None:  # scope axes only: the tensor as given, tagged
                layout = ShardLayout(shape, axis_tags(axes))
            elif len(axes) == 1:  # the tensor is the shard
                sd = tp.split_dim or 0
                if not 0 <= sd < len(shape):
                    raise ParallelismError(f"{op}: split_dim {sd} is out of range for a shard of shape {list(shape)}")
                layout = ShardLayout(tuple(n * tp.size if d == sd else n for d, n in enumerate(shape)),
                                     axis_tags(axes))
            else:  # multi-axis TP layouts take the full tensor
                layout = ShardLayout(shape, axis_tags(axes))
                tensor = _slice(tensor, tp)
            rc = self.tensors.put_tensors([parallelism_key(key, axes)], [tensor], cfg, upsert=upsert, op=op,
                                          layouts=[layout])[0]
            if rc != 0 or tp is None or len(axes) == 1:
                return rc
            manifest = msgspec.msgpack.encode(ParallelManifest(tp.size, tp.split_dim or 0, list(shape),
                                                               str(tensor.dtype).removeprefix("torch.")))
            put = self.objects.upsert if upsert else self.objects.put
            return put(parallelism_manifest_key(key, axes), manifest, cfg)
        except _REFUSED as e:
            log.warning("%s(%r): %s", op, key, e)
            return INVALID

    def _write_writer_shard(self, key: str, tensor: Any, w: WriterPartition, cfg: Any, *, upsert: bool,
                            op: str) -> int:
        shard = _slice(tensor, ParallelAxis("tp", w.rank, w.size, w.split_dim))
        manifest = msgspec.msgpack.encode(WriterManifest(w.size, w.split_dim, [int(s) for s in tensor.shape],
                                                         str(tensor.dtype).removeprefix("torch.")))
        layout = ShardLayout(tuple(int(n) for n in tensor.shape), (AxisTag("writer", w.rank, w.size, w.split_dim),))
        rc = self.tensors.put_tensors([writer_shard_key(key, w)], [shard], cfg, upsert=upsert, op=op,
                                      layouts=[layout])[0]
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
    def _request(self, key: Any, target: Any, op: str) -> _Request:
        """Validate a read: what to materialise of which key."""
        key = check_key(key, op)
        if target is None:
            target = ReadTarget()
        if not isinstance(target, ReadTarget):
            raise TypeError(f"{op}: target must be a ReadTarget or None, got {type(target).__name__}")
        mode = str(target.mode).lower()
        if mode not in READ_MODES:
            raise ValueError(f"{op}: ReadTarget.mode {target.mode!r} is not one of {list(READ_MODES)}")
        if target.parallelism is None:
            if mode == "shard":
                raise ParallelismError(f"{op}: mode 'shard' requires target.parallelism")
            return _Request(key, mode, None)
        axes = validate_axes(target.parallelism, op)
        if mode == "full" and tp_axis(axes) is None:
            raise ParallelismError(f"{op}: full reconstruction requires a TP axis")
        return _Request(key, mode, axes)

    def _read_header(self, key: str, op: str) -> _tensor.TensorHeader | None:
        """The header of object ``key`` (None if there is none); reads only the header bytes."""
        size = self.objects.get_size(key)
        if size < 0:
            return None
        scratch = np.empty(min(size, _tensor.MAX_HEADER), np.uint8)
        rc = self.ranges.read_pieces([(key, int(scratch.ctypes.data), 0, len(scratch))], op)[0]
        if rc < 0:
            return None
        try:
            return _tensor.decode_tensor_header(scratch[:rc])
        except _tensor.TensorFormatError as e:
            raise LayoutError(f"{key!r} is not a tensor object: {e}") from None

    def _discover(self, req: _Request, op: str) -> _Stored | None:
        """Find how ``req.key`` is stored: the split and the object of each of its ranks."""
        key, axes = req.key, req.axes
        tp = None if axes is None else tp_axis(axes)
        if axes is not None and len(axes) > 1:
            if tp is None:
                return None
            raw = self.objects.get(parallelism_manifest_key(key, axes))
            if raw:
                m = _decode_manifest(raw, ParallelManifest, key)
                split = StoredSplit(tuple(m.shape), m.dtype, m.split_dim, m.size)
                names = [parallelism_key(key, _with_tp(axes, r, m.size, m.split_dim)) for r in range(m.size)]
                return _Stored(split, names, _tensor.header_len(len(m.shape), len(axes)))
            return self._discover_full(key, op)
        if axes is None:
            full = self._discover_full(key, op)
            if full is not None:
                return full
        h = self._read_header(tp_key_name(key, 0), op)
        if h is not None:
            a = None if h.layout is None else h.layout.split_axis()
            if h.layout is None or a is None or a.kind != "tp" or a.split_dim is None:
                raise LayoutError(f"{key!r}: shard {tp_key_name(key, 0)!r} carries no layout metadata (written "
                                  "by an older mooncake-core), so the split it was written with is unknown; read it "
                                  "with the split it was written with or ReadTarget('as_stored'), or write it again")
            split = StoredSplit(h.layout.global_shape, h.dtype, a.split_dim, a.size)
            return _Stored(split, [tp_key_name(key, r) for r in range(a.size)], h.header_len)
        raw = self.objects.get(writer_manifest_key(key))
        if raw:
            w = _decode_manifest(raw, WriterManifest, key)
            split = StoredSplit(tuple(w.shape), w.dtype, w.split_dim, w.size, kind="writer")
            names = [writer_shard_key(key, WriterPartition(r, w.size, w.split_dim)) for r in range(w.size)]
            return _Stored(split, names, _tensor.header_len(len(w.shape), 1))
        return None if axes is None else self._discover_full(key, op)

    def _discover_full(self, key: str, op: str) -> _Stored | None:
        """``key`` itself holding the whole tensor."""
        h = self._read_header(key, op)
        if h is None:
            return None
        if h.layout is not None and h.layout.split_axis() is not None:
            raise LayoutError(f"{key!r} holds a shard ({h.layout.describe()}), not a full tensor")
        return _Stored(StoredSplit(h.shape, h.dtype, None, 1), [key], h.header_len)

    def _target_box(self, req: _Request, stored: _Stored) -> tuple[Box, Any]:
        """The box of the global tensor the request wants, and the result's shape."""
        g = stored.split.global_shape
        if req.mode == "full":
            return full_box(g), g
        tp = tp_axis(req.axes or [])
        assert tp is not None
        sd = tp.split_dim
        if sd is None or (req.stored_dim and stored.split.split_dim is not None):
            sd = stored.split.split_dim
        if sd is None:  # a whole stored tensor and a request that names no dim
            sd = 0
        try:
            box = shard_box(g, sd, tp.rank, tp.size)
        except LayoutError as e:
            raise LayoutError(f"{req.key!r}: cannot cut TP rank {tp.rank} of {tp.size} along dim {sd} from the "
                              f"stored {stored.split.describe()}: {e}") from None
        return box, tuple(e for _, e in box)

    def _assemble(self, req: _Request, stored: _Stored, dest_addr: int, capacity: int, op: str) -> int:
        """Read the requested view of ``stored`` into ``[dest_addr, +capacity)`` as a tensor
        object (header + elements); returns its length, or 0 on a miss / a too small buffer."""
        split = stored.split
        box, shape = self._target_box(req, stored)
        itemsize = _tensor.ITEMSIZE[split.dtype]
        header = _tensor.encode_header(split.dtype, tuple(shape))
        nbytes = itemsize * int(np.prod(shape, dtype=np.int64))
        if len(header) + nbytes > capacity:
            log.warning("%s(%r): buffer of %d bytes is smaller than the tensor object (%d bytes)", op, req.key,
                        capacity, len(header) + nbytes)
            return 0
        pieces = plan_assembly(req.key, split, box, itemsize, [stored.data_offset] * split.count)
        used = sorted({p.source for p in pieces}) if pieces else list(range(min(1, split.count)))
        # every object read is checked against the split: its header comes in the same batch
        scratch = np.empty((len(used), stored.data_offset), np.uint8)
        reads = [(stored.names[s], int(scratch[i].ctypes.data), 0, stored.data_offset) for i, s in enumerate(used)]
        base = dest_addr + len(header)
        reads += [(stored.names[p.source], base + p.dst_off, p.src_off, p.size) for p in pieces]
        rcs = self.ranges.read_pieces(reads, op)
        bad = [(reads[i][0], rc) for i, rc in enumerate(rcs) if rc < 0]
        if bad:
            missing = sorted({k for k, rc in bad if rc == int(ErrorCode.OBJECT_NOT_FOUND)})
            if missing:
                log.warning("%s(%r): stored shards missing: %s (%s)", op, req.key, missing, split.describe())
            else:
                log.warning("%s(%r): reading the stored shards failed: %s", op, req.key, bad[:4])
            return 0
        found = []
        for i, s in enumerate(used):
            try:
                h = _tensor.decode_tensor_header(scratch[i])
            except _tensor.TensorFormatError as e:
                raise LayoutError(f"{req.key!r}: {stored.names[s]!r} is not a shard of {split.describe()}: {e}") \
                    from None
            if h.header_len != stored.data_offset:
                raise LayoutError(f"{req.key!r}: {stored.names[s]!r} has a {h.header_len}-byte header, the other "
                                  f"shards of {split.describe()} {stored.data_offset}")
            found.append((s, stored.names[s], h.dtype, h.shape, h.layout))
        check_split(req.key, split, found)
        mem_view(dest_addr, len(header))[:] = header
        return len(header) + nbytes

    def _exact(self, req: _Request, t: Any, h: _tensor.TensorHeader | None) -> bool:
        """Whether the object read under the request's own name is the requested view."""
        tp = tp_axis(req.axes or [])
        if tp is None:
            return True
        if h is None or h.layout is None:  # written before layouts: trusted as before
            return True
        a = h.layout.split_axis()
        return a is not None and a.kind == "tp" and a.rank == tp.rank and a.size == tp.size and (
            req.stored_dim or tp.split_dim is None or a.split_dim == tp.split_dim)

    def _read(self, req: _Request, dest: tuple[int, int] | None, op: str) -> Any:
        """The read itself: ``dest`` = the caller's (ptr, size), or None for a fresh buffer."""
        if req.mode in ("as_stored", "shard") and (req.mode == "as_stored" or req.axes is not None):
            name = req.key if req.axes is None else parallelism_key(req.key, req.axes)
            got = self._read_object(name, dest, op)
            if got is not None:
                t, h = got
                if req.mode == "as_stored" or self._exact(req, t, h):
                    return t
            if req.mode == "as_stored" or tp_axis(req.axes or []) is None:
                return None
        stored = self._discover(req, op)
        if stored is None:
            log.info("%s(%r): nothing stored for %s", op, req.key, req.mode)
            return None
        if dest is not None:
            n = self._assemble(req, stored, dest[0], dest[1], op)
            return _tensor.tensor_from_buffer(mem_view(dest[0], n)) if n else None
        _, shape = self._target_box(req, stored)
        need = _tensor.header_len(len(shape), 0) + \
            _tensor.ITEMSIZE[stored.split.dtype] * int(np.prod(shape, dtype=np.int64))
        buf = np.empty(need, np.uint8)  # the returned tensor aliases (and keeps alive) this buffer
        n = self._assemble(req, stored, int(buf.ctypes.data), need, op)
        return _tensor.tensor_from_buffer(buf[:n]) if n else None

    def _read_object(self, name: str, dest: tuple[int, int] | None, op: str) -> tuple[Any, Any] | None:
        """One whole tensor object and its header, or None if absent."""
        if dest is None:
            return self.tensors.get_tensor_and_header(name)
        t = self.tensors.get_tensor_into(name, dest[0], dest[1])
        if t is None:
            return None
        return t, _tensor.decode_tensor_header(mem_view(dest[0], min(dest[1], _tensor.MAX_HEADER)))

    def get_tensor_with_parallelism(self, key: str, target: Any = None) -> Any:
        op = "get_tensor_with_parallelism"
        try:
            return self._read(self._request(key, target, op), None, op)
        except _REFUSED as e:
            log.warning("%s(%r): %s", op, key, e)
            return None

    def get_tensor_with_parallelism_into(self, key: str, buffer_ptr: int, size: int, target: Any = None) -> Any:
        op = "get_tensor_with_parallelism_into"
        ptr = check_int(buffer_ptr, f"{op}: buffer_ptr", minimum=1)
        size = check_int(size, f"{op}: size")
        try:
            return self._read(self._request(key, target, op), (ptr, size), op)
        except _REFUSED as e:
            log.warning("%s(%r): %s", op, key, e)
            return None

    # ------------------------------------------------------------------ TP wrappers (reads)
    def _tp_request(self, key: Any, tp_rank: Any, tp_size: Any, split_dim: Any, op: str) -> _Request | None:
        """``*_with_tp`` reads lower to a ``shard`` read (None: ``tp_size <= 1``, the key itself).
        The wrappers cut along the dimension the key was *stored* split on, whatever
        ``split_dim`` says, as upstream's wrappers (which ignore it) read -- ``split_dim`` only
        matters for a key stored whole; the TP size and rank are honoured even when the key
        was written with another TP size."""
        key = check_key(key, op)
        tp_rank = check_int(tp_rank, f"{op}: tp_rank")
        tp_size = check_int(tp_size, f"{op}: tp_size", minimum=-(1 << 31))
        if split_dim is not None and (isinstance(split_dim, bool) or not isinstance(split_dim, int)):
            raise TypeError(f"{op}: split_dim must be int, got {type(split_dim).__name__}")
        if tp_size <= 1:
            return None
        if not 0 <= tp_rank < tp_size:
            raise ParallelismError(f"{op}: tp_rank {tp_rank} is out of range for tp_size {tp_size}")
        return _Request(key, "shard", [ParallelAxis("tp", tp_rank, tp_size, split_dim)], stored_dim=True)

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int | None = 0) -> Any:
        op = "get_tensor_with_tp"
        try:
            req = self._tp_request(key, tp_rank, tp_size, split_dim, op)
            return self.tensors.get_tensor(key) if req is None else self._read(req, None, op)
        except _REFUSED as e:
            log.warning("%s(%r): %s", op, key, e)
            return None

    def batch_get_tensor_with_tp(self, base_keys: list[str], tp_rank: int = 0, tp_size: int = 1) -> list[Any]:
        base_keys = check_keys(base_keys, "batch_get_tensor_with_tp")
        return [self.get_tensor_with_tp(k, tp_rank, tp_size, None) for k in base_keys]

    def get_tensor_with_tp_into(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int | None = 0) -> Any:
        op = "get_tensor_with_tp_into"
        ptr = check_int(buffer_ptr, f"{op}: buffer_ptr", minimum=1)
        size = check_int(size, f"{op}: size")
        try:
            req = self._tp_request(key, tp_rank, tp_size, split_dim, op)
            return self.tensors.get_tensor_into(key, ptr, size) if req is None else self._read(req, (ptr, size), op)
        except _REFUSED as e:
            log.warning("%s(%r): %s", op, key, e)
            return None

    def batch_get_tensor_with_tp_into(self, base_keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                      tp_rank: int = 0, tp_size: int = 1) -> list[Any]:
        op = "batch_get_tensor_with_tp_into"
        base_keys = check_keys(base_keys, op)
        ptrs, sizes = check_ptr_lists(op, base_keys, buffer_ptrs, sizes)
        return [self.get_tensor_with_tp_into(k, p, n, tp_rank, tp_size, None)
                for k, p, n in zip(base_keys, ptrs, sizes)]

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
