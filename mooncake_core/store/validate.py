"""Argument checks of the store API: TypeError / ValueError naming the argument, as the
pybind11 original raises them (runtime failures are integer codes instead)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mooncake_core.store.types import ReplicateConfig
from mooncake_core.utils.net import parse_host_port

__all__ = ["check_config", "check_int", "check_key", "check_keys", "check_multi", "check_ptr_lists", "has_port",
           "host_of", "unique_keys"]


def check_key(key: Any, what: str) -> str:
    if not isinstance(key, str):
        raise TypeError(f"{what}: key must be str, got {type(key).__name__} ({key!r:.60})")
    if not key:
        raise ValueError(f"{what}: key must be a non-empty string")
    return key


def check_keys(keys: Any, what: str) -> list[str]:
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
        raise TypeError(f"{what}: keys must be a list of str, got {type(keys).__name__}")
    if keys and all(keys) and set(map(type, keys)) == {str}:  # the common case, at C speed
        return list(keys)
    return [check_key(k, what) for k in keys]


def check_int(value: Any, what: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what}: expected int, got {type(value).__name__} ({value!r:.60})")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{what}: must be >= {minimum}, got {value}")
    return value


def check_config(config: Any, what: str) -> ReplicateConfig:
    if config is None:
        return ReplicateConfig()
    if not isinstance(config, ReplicateConfig):
        raise TypeError(f"{what}: config must be a ReplicateConfig, got {type(config).__name__}")
    config.validate()
    return config


def has_port(hostname: str) -> bool:
    try:
        parse_host_port(hostname, what="local_hostname")
        return True
    except ValueError:
        return False


def host_of(segment_name: str) -> str:
    return segment_name.rsplit(":", 1)[0] if ":" in segment_name else segment_name




def check_ptr_lists(op: str, keys: list[str], ptrs: Any, sizes: Any) -> tuple[list[int], list[int]]:
    if not isinstance(ptrs, (list, tuple)) or not isinstance(sizes, (list, tuple)):
        raise TypeError(f"{op}: buffer_ptrs and sizes must be lists of int")
    if not len(keys) == len(ptrs) == len(sizes):
        raise ValueError(f"{op}: {len(keys)} keys, {len(ptrs)} buffer_ptrs, {len(sizes)} sizes (must match)")
    return ([check_int(p, f"{op}: buffer_ptrs[{i}]", minimum=1) for i, p in enumerate(ptrs)],
            [check_int(s, f"{op}: sizes[{i}]") for i, s in enumerate(sizes)])


def check_multi(op: str, keys: list[str], all_ptrs: Any, all_sizes: Any) -> list[list[tuple[int, int]]]:
    if not isinstance(all_ptrs, (list, tuple)) or not isinstance(all_sizes, (list, tuple)):
        raise TypeError(f"{op}: all_buffer_ptrs and all_sizes must be lists of lists of int")
    if not len(keys) == len(all_ptrs) == len(all_sizes):
        raise ValueError(f"{op}: {len(keys)} keys, {len(all_ptrs)} pointer lists, {len(all_sizes)} size lists "
                         "(must match)")
    out = []
    for i, (ptrs, sizes) in enumerate(zip(all_ptrs, all_sizes)):
        if not isinstance(ptrs, (list, tuple)) or not isinstance(sizes, (list, tuple)) or len(ptrs) != len(sizes):
            raise ValueError(f"{op}: all_buffer_ptrs[{i}] and all_sizes[{i}] must be lists of equal length")
        out.append([(check_int(p, f"{op}: all_buffer_ptrs[{i}]", minimum=1),
                     check_int(n, f"{op}: all_sizes[{i}]")) for p, n in zip(ptrs, sizes)])
    return out


def unique_keys(op: str, keys: list[str]) -> None:
    if len(set(keys)) != len(keys):
        raise ValueError(f"{op}: duplicate keys in one batch")
