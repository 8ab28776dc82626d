"""``bind_to_numa_node``: upstream ``mooncake.store``'s NUMA helper, harmless without NUMA.

Why it exists: LMCache's Mooncake adapter imports it from ``mooncake.store`` and calls it
before ``setup`` when a GPU->NUMA mapping is configured, so the store's memory is allocated
near the GPU. Upstream binds the calling thread's CPUs and memory preference to the node;
so do we, with ``sched_setaffinity`` (the node's ``cpulist`` from sysfs) and libnuma's
``numa_set_preferred`` when libnuma is present. On a machine without that node (or without
NUMA at all) the call logs a warning and changes nothing -- binding is an optimisation,
never a reason to fail the store's setup.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from mooncake_core.utils.log import get_logger

__all__ = ["bind_to_numa_node", "node_cpus"]

log = get_logger("mooncake.store.numa")

_SYS_NODE = "/sys/devices/system/node"


def _parse_cpulist(text: str) -> set[int]:
    """``"0-3,8,10-11"`` -> {0, 1, 2, 3, 8, 10, 11} (the kernel's cpulist format)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def node_cpus(node: int, sys_node: str = _SYS_NODE) -> set[int]:
    """CPUs of NUMA ``node`` per sysfs; empty when the node does not exist."""
    try:
        with open(os.path.join(sys_node, f"node{node}", "cpulist"), encoding="ascii") as f:
            return _parse_cpulist(f.read())
    except (OSError, ValueError):
        return set()


def _set_preferred(node: int) -> bool:
    name = ctypes.util.find_library("numa")
    if not name:
        return False
    try:
        lib = ctypes.CDLL(name)
        if lib.numa_available() < 0:
            return False
        lib.numa_set_preferred(ctypes.c_int(node))
        return True
    except (OSError, AttributeError):
        return False


def bind_to_numa_node(node: int) -> None:
    """Bind the current thread and memory allocation preference to the specified NUMA node.

    Upstream signature ``bind_to_numa_node(node: int) -> None``. A node this machine does not
    have is logged and ignored.
    """
    if isinstance(node, bool) or not isinstance(node, int):
        raise TypeError(f"bind_to_numa_node: node must be int, got {type(node).__name__} ({node!r:.40})")
    if node < 0:
        raise ValueError(f"bind_to_numa_node: node must be >= 0, got {node}")
    cpus = node_cpus(node) & os.sched_getaffinity(0)
    if not cpus:
        log.warning("bind_to_numa_node(%d): no such NUMA node with usable CPUs here; not binding", node)
        return
    os.sched_setaffinity(0, cpus)  # pid 0 = the calling thread on Linux
    preferred = _set_preferred(node)
    log.info("bound to NUMA node", extra={"node": node, "cpus": sorted(cpus), "memory_preferred": preferred})
