"""The whole-object API of the store client: bytes, zero-copy buffers, existence/size/removal.

Upstream method names, argument order, defaults and return conventions. Argument errors
raise TypeError/ValueError naming the argument (before anything is sent); runtime failures
come back as Mooncake's integer codes through ``StoreInternals.call`` / ``call_list``.
Documented on the public façade, ``MooncakeDistributedStore`` (client.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mooncake_core.errors import MooncakeError
from mooncake_core.store.codes import EXIST_ERROR, INTERNAL, INVALID, NOT_FOUND, OK
from mooncake_core.store.internals import StoreInternals
from mooncake_core.store.memory import buffer_addr, bytes_addr, bytes_addrs
from mooncake_core.store.owned import OwnedEntry
from mooncake_core.store.protocol import ReplicaDesc
from mooncake_core.store.types import BufferHandle, ReplicateConfig
from mooncake_core.store.validate import (check_config, check_int, check_key, check_keys, check_multi,
                                          check_ptr_lists, unique_keys)
from mooncake_core.utils import bounded_regex
from mooncake_core.utils.log import get_logger

__all__ = ["ObjectApi"]

#: longest remove_by_regex may spend matching the pattern against this client's own keys
REGEX_BUDGET_S = 1.0

log = get_logger("mooncake.store.client")



class ObjectApi:
    """put/get/upsert of bytes and buffers, replica descriptors, exist/size/remove (each
    public method is documented on ``MooncakeDistributedStore``)."""

    def __init__(self, core: StoreInternals) -> None:
        self.core = core

    # ------------------------------------------------------------------ bytes
    def _unstageable(self, op: str, key: str, size: int) -> bool:
        """Upstream stages a bytes value through the client's local buffer (``setup``'s
        local_buffer_size) and answers INVALID_PARAMS when there is none: so a client set up
        with ``local_buffer_size=0`` cannot put bytes values here either. (We need no staging:
        a non-zero local buffer is not a cap on the value size, where upstream's is.)"""
        if self.core.ready and self.core.local_buffer_size == 0 and size > 0:
            log.warning("%s(%r): no local buffer to stage the %d-byte value (local_buffer_size=0 in setup); use "
                        "put_from/batch_put_from on a registered buffer, or set a local_buffer_size", op, key, size)
            return True
        return False

    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        key = check_key(key, "put")
        cfg = check_config(config, "put")
        addr, size, keep = buffer_addr(value, "put: value")
        if self._unstageable("put", key, size):
            return INVALID
        return self.core.call(lambda: self.core.put_many([key], [[(addr, size)]], cfg, upsert=False, op="put")[0], keep)

    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        key = check_key(key, "upsert")
        cfg = check_config(config, "upsert")
        addr, size, keep = buffer_addr(value, "upsert: value")
        if self._unstageable("upsert", key, size):
            return INVALID
        self.core.forget([key])
        return self.core.call(lambda: self.core.put_many([key], [[(addr, size)]], cfg, upsert=True, op="upsert")[0],
                              keep)

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        return self._parts(key, parts, config, upsert=False, op="put_parts")

    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        return self._parts(key, parts, config, upsert=True, op="upsert_parts")

    def _parts(self, key: str, parts: tuple, config: Any, *, upsert: bool, op: str) -> int:
        key = check_key(key, op)
        cfg = check_config(config, op)
        bufs = [buffer_addr(p, f"{op}: parts[{i}]") for i, p in enumerate(parts)]
        if self._unstageable(op, key, sum(n for _, n, _ in bufs)):
            return INVALID
        if upsert:
            self.core.forget([key])
        return self.core.call(lambda: self.core.put_many([key], [[(a, n) for a, n, _ in bufs if n]], cfg, upsert=upsert,
                                                 op=op)[0], bufs)

    def put_batch(self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None) -> int:
        rcs = self._batch_put(keys, values, config, upsert=False, op="put_batch")
        return next((rc for rc in rcs if rc < 0), OK) if isinstance(rcs, list) else rcs

    def upsert_batch(self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None) -> int:
        rcs = self._batch_put(keys, values, config, upsert=True, op="upsert_batch")
        return next((rc for rc in rcs if rc < 0), OK) if isinstance(rcs, list) else rcs

    def _batch_put(self, keys: Any, values: Any, config: Any, *, upsert: bool, op: str) -> list[int] | int:
        keys = check_keys(keys, op)
        if not isinstance(values, (list, tuple)):
            raise TypeError(f"{op}: values must be a list of bytes-like objects, got {type(values).__name__}")
        if len(keys) != len(values):
            raise ValueError(f"{op}: {len(keys)} keys but {len(values)} values")
        unique_keys(op, keys)
        cfg = check_config(config, op)
        if not keys:
            return []
        flat: tuple[list[int], list[int], list[Any] | None]
        if set(map(type, values)) == {bytes}:  # the common case: no per-value Python work
            flat = (bytes_addrs(list(values)), list(map(len, values)), list(values))
            keep: Any = values
        else:
            bufs = [(bytes_addr(v), len(v), v) if v.__class__ is bytes else buffer_addr(v, f"{op}: values[{i}]")
                    for i, v in enumerate(values)]
            flat, keep = ([a for a, _, _ in bufs], [s for _, s, _ in bufs], None), bufs
        big = next((i for i, n in enumerate(flat[1]) if self._unstageable(op, keys[i], n)), None)
        if big is not None:
            return [INVALID] * len(keys)
        if upsert:
            self.core.forget(keys)
        return self.core.call_list(lambda: self.core.put_many(keys, None, cfg, upsert=upsert, op=op, flat=flat),
                                   len(keys), keep)

    def get(self, key: str) -> bytes:
        key = check_key(key, "get")
        dests: list[Any] = [None]
        rc = self.core.call(lambda: self.core.read_batch([key], dests, "get")[0])
        if rc < 0 or dests[0] is None:
            return b""
        return dests[0][0]

    def get_batch(self, keys: list[str]) -> list[bytes]:
        keys = check_keys(keys, "get_batch")
        if not keys:
            return []
        dests: list[Any] = [None] * len(keys)
        rcs = self.core.call_list(lambda: self.core.read_batch(keys, dests, "get_batch"), len(keys))
        return [dests[i][0] if rcs[i] >= 0 and dests[i] is not None else b"" for i in range(len(keys))]

    def get_buffer(self, key: str) -> BufferHandle | None:
        data = self.get(key)
        return BufferHandle(data) if data or self.is_exist(key) == 1 else None

    def batch_get_buffer(self, keys: list[str]) -> list[BufferHandle | None]:
        keys = check_keys(keys, "batch_get_buffer")
        return [BufferHandle(d) if d else None for d in self.get_batch(keys)]

    def get_replica_desc(self, key: str) -> list[ReplicaDesc]:
        key = check_key(key, "get_replica_desc")
        try:
            self.core.require_ready("get_replica_desc")
            return list(self.core.master.get_replica_list(key).replicas)
        except MooncakeError as e:
            if e.code != NOT_FOUND:
                log.warning("get_replica_desc(%r): %s", key, e)
            return []

    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[ReplicaDesc]]:
        keys = check_keys(keys, "batch_get_replica_desc")
        return {k: self.get_replica_desc(k) for k in keys}

    # ------------------------------------------------------------------ zero-copy
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        buffer_ptr = check_int(buffer_ptr, "register_buffer: buffer_ptr", minimum=1)
        size = check_int(size, "register_buffer: size", minimum=1)
        from mooncake_core.transfer import device_memory
        # a GPU buffer (the cuda plugin sees it) is registered as such: the engine stages it over
        # tcp/cma, the client's own-segment copies go through the device copier (memory.memmove)
        location = device_memory.locate(buffer_ptr) or "cpu:0"
        try:
            self.core.require_ready("register_buffer")
            rc = self.core.engine.register_memory(buffer_ptr, size, location)
        except MooncakeError as e:
            log.error("%s", e)
            return e.code
        if rc not in (0, None):
            return int(rc)
        self.core.registered[buffer_ptr] = size
        return OK

    def unregister_buffer(self, buffer_ptr: int) -> int:
        buffer_ptr = check_int(buffer_ptr, "unregister_buffer: buffer_ptr", minimum=1)
        if buffer_ptr not in self.core.registered:
            log.warning("unregister_buffer: %#x was not registered", buffer_ptr)
            return INVALID
        del self.core.registered[buffer_ptr]
        try:
            rc = self.core.engine.unregister_memory(buffer_ptr)
        except Exception as e:  # noqa: BLE001
            log.warning("unregister_memory(%#x): %s", buffer_ptr, e)
            return INTERNAL
        return OK if rc in (0, None) else int(rc)

    def put_from(self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None) -> int:
        key = check_key(key, "put_from")
        buffer_ptr = check_int(buffer_ptr, "put_from: buffer_ptr", minimum=1)
        size = check_int(size, "put_from: size")
        cfg = check_config(config, "put_from")
        return self.core.call(lambda: self.core.put_many([key], [[(buffer_ptr, size)]], cfg, upsert=False,
                                                         op="put_from")[0])

    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None) -> int:
        key = check_key(key, "upsert_from")
        buffer_ptr = check_int(buffer_ptr, "upsert_from: buffer_ptr", minimum=1)
        size = check_int(size, "upsert_from: size")
        cfg = check_config(config, "upsert_from")
        self.core.forget([key])
        return self.core.call(lambda: self.core.put_many([key], [[(buffer_ptr, size)]], cfg, upsert=True,
                                                 op="upsert_from")[0])

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        key = check_key(key, "get_into")
        buffer_ptr = check_int(buffer_ptr, "get_into: buffer_ptr", minimum=1)
        size = check_int(size, "get_into: size")
        return self.core.call(lambda: self.core.read_batch([key], [[(buffer_ptr, size)]], "get_into")[0])

    def batch_put_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                       config: ReplicateConfig | None = None) -> list[int]:
        return self._batch_from(keys, buffer_ptrs, sizes, config, upsert=False, op="batch_put_from")

    def batch_upsert_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                          config: ReplicateConfig | None = None) -> list[int]:
        return self._batch_from(keys, buffer_ptrs, sizes, config, upsert=True, op="batch_upsert_from")

    def _batch_from(self, keys: Any, ptrs: Any, sizes: Any, config: Any, *, upsert: bool, op: str) -> list[int]:
        keys = check_keys(keys, op)
        if _lengths_differ(op, keys, ptrs, sizes):
            return [INVALID] * len(keys)
        ptrs, sizes = check_ptr_lists(op, keys, ptrs, sizes)
        unique_keys(op, keys)
        cfg = check_config(config, op)
        if not keys:
            return []
        if upsert:
            self.core.forget(keys)
        flat = (list(ptrs), list(sizes), None)
        return self.core.call_list(lambda: self.core.put_many(keys, None, cfg, upsert=upsert, op=op, flat=flat),
                                   len(keys))

    def batch_get_into(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]:
        keys = check_keys(keys, "batch_get_into")
        if _lengths_differ("batch_get_into", keys, buffer_ptrs, sizes):
            return [INVALID] * len(keys)
        ptrs, sizes = check_ptr_lists("batch_get_into", keys, buffer_ptrs, sizes)
        if not keys:
            return []
        dests: list[Any] = [[ps] for ps in zip(ptrs, sizes)]
        return self.core.call_list(lambda: self.core.read_batch(keys, dests, "batch_get_into"), len(keys))

    def batch_put_from_multi_buffers(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                     all_sizes: list[list[int]], config: ReplicateConfig | None = None) -> list[int]:
        keys = check_keys(keys, "batch_put_from_multi_buffers")
        parts = check_multi("batch_put_from_multi_buffers", keys, all_buffer_ptrs, all_sizes)
        unique_keys("batch_put_from_multi_buffers", keys)
        cfg = check_config(config, "batch_put_from_multi_buffers")
        if not keys:
            return []
        return self.core.call_list(lambda: self.core.put_many(keys, parts, cfg, upsert=False,
                                                      op="batch_put_from_multi_buffers"), len(keys))

    def batch_get_into_multi_buffers(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                     all_sizes: list[list[int]], prefer_alloc_in_same_node: bool = False) -> list[int]:
        keys = check_keys(keys, "batch_get_into_multi_buffers")
        parts = check_multi("batch_get_into_multi_buffers", keys, all_buffer_ptrs, all_sizes)
        if not keys:
            return []
        return self.core.call_list(lambda: self.core.read_batch(keys, list(parts), "batch_get_into_multi_buffers"),
                               len(keys))

    # ------------------------------------------------------------------ metadata ops
    def is_exist(self, key: str) -> int:
        key = check_key(key, "is_exist")
        try:
            self.core.require_ready("is_exist")
            return 1 if self.core.master.exist_key(key) else 0
        except MooncakeError as e:
            log.warning("is_exist(%r): %s", key, e)
            return EXIST_ERROR

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        keys = check_keys(keys, "batch_is_exist")
        if not keys:
            return []
        try:
            self.core.require_ready("batch_is_exist")
            return [1 if x else 0 for x in self.core.master.batch_exist_key(keys)]
        except MooncakeError as e:
            log.warning("batch_is_exist: %s", e)
            return [EXIST_ERROR] * len(keys)

    def get_size(self, key: str) -> int:
        key = check_key(key, "get_size")
        return self.core.call(lambda: int(self.core.master.get_size(key)), need_ready="get_size")

    def remove(self, key: str, force: bool = False) -> int:
        key = check_key(key, "remove")
        if not isinstance(force, bool):
            raise TypeError(f"remove: force must be bool, got {type(force).__name__}")

        def run() -> int:
            self.core.master.remove(key, force)
            self.core.forget([key])
            return OK
        return self.core.call(run, need_ready="remove")

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        if not isinstance(regex_pattern, str):
            raise TypeError(f"remove_by_regex: regex_pattern must be str, got {type(regex_pattern).__name__}")
        if not isinstance(force, bool):
            raise TypeError(f"remove_by_regex: force must be bool, got {type(force).__name__}")
        try:  # matching is time-bounded (ReDoS)
            matcher = bounded_regex.Matcher(regex_pattern, REGEX_BUDGET_S, what="remove_by_regex: regex_pattern")
        except bounded_regex.PatternError as e:
            raise ValueError(f"remove_by_regex: invalid regular expression {regex_pattern!r}: {e}") from None

        def run() -> int:
            n = int(self.core.master.remove_by_regex(regex_pattern, force))
            try:
                self._forget_removed(force, matcher)
            except bounded_regex.PatternError:  # too slow here: ask the master about every owned key
                self._forget_removed(False, None)
            return n
        return self.core.call(run, need_ready="remove_by_regex")

    def remove_all(self, force: bool = False) -> int:
        if not isinstance(force, bool):
            raise TypeError(f"remove_all: force must be bool, got {type(force).__name__}")

        def run() -> int:
            n = int(self.core.master.remove_all(force))
            self._forget_removed(force, None)
            return n
        return self.core.call(run, need_ready="remove_all")

    def _forget_removed(self, force: bool, pred: Callable[[str], bool] | None) -> None:
        """After remove_all / remove_by_regex: stop re-reporting the owned objects that are
        gone. Without ``force`` the master skipped leased ones; those stay in the index (or a
        master change would lose them), so ask which of the matching keys still exist."""
        entries = self.core.owned.entries(pred)
        if force or not entries:
            self.core.owned.discard_entries(entries)
            return
        gone: list[OwnedEntry] = []
        for i in range(0, len(entries), 4096):
            chunk = entries[i:i + 4096]
            exists = self.core.master.batch_exist_key([e.key for e in chunk])
            gone.extend(e for e, x in zip(chunk, exists) if not x)
        self.core.owned.discard_entries(gone)

    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]:
        keys = check_keys(keys, "batch_remove")
        if not isinstance(force, bool):
            raise TypeError(f"batch_remove: force must be bool, got {type(force).__name__}")
        if not keys:
            return []

        def run() -> list[int]:
            rcs = [int(x) for x in self.core.master.batch_remove(keys, force)]
            self.core.forget([k for k, rc in zip(keys, rcs) if rc == 0])
            return rcs
        return self.core.call_list(run, len(keys), need_ready="batch_remove")


def _lengths_differ(op: str, keys: list[str], ptrs: Any, sizes: Any) -> bool:
    """Mismatched list lengths: upstream answers with a negative code per key, not an
    exception (logged here, naming the lengths)."""
    if isinstance(ptrs, (list, tuple)) and isinstance(sizes, (list, tuple)) and not len(keys) == len(ptrs) == len(
            sizes):
        log.warning("%s: %d keys, %d buffer_ptrs, %d sizes (must match): every key gets -600", op, len(keys),
                    len(ptrs), len(sizes))
        return True
    return False
