"""This host's NIC topology, in the original's shape: ``{"cpu:0": [[preferred], [available]]}``.

For every memory location -- ``cpu:N`` per NUMA node, ``cuda:N`` per NVIDIA GPU -- the NICs it
should prefer and the others it may use: a ``cpu:N`` buffer prefers the NICs on NUMA node N, a
``cuda:N`` buffer the NICs closest to its GPU on the PCIe tree (fewest hops to a common
bridge). The NICs are the RDMA devices (``/sys/class/infiniband``) or, when ``device_name``
names them, any network interfaces. ``MC_CUSTOM_TOPO_JSON`` names a file of the same shape that
replaces discovery, as in the original. ``build``/``parse``/``preferred`` are pure
(tests/transfer/test_ucx_units.py); ``discover`` reads sysfs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Device", "build", "discover", "local", "parse", "pci_distance", "preferred"]

Topology = dict[str, list[list[str]]]


@dataclass(frozen=True)
class Device:
    name: str
    pci: str     # resolved sysfs path of the PCI function ("/sys/devices/pci0000:00/0000:00:03.0"), or ""
    numa: int    # NUMA node, -1 when unknown


def pci_distance(a: str, b: str) -> int:
    """Hops from each device up to their closest common PCI bridge (sum); large when unrelated."""
    pa, pb = [x for x in a.split("/") if x], [x for x in b.split("/") if x]
    if not pa or not pb:
        return 1 << 16
    common = 0
    for x, y in zip(pa, pb):
        if x != y:
            break
        common += 1
    return (len(pa) - common) + (len(pb) - common)


def build(nics: Sequence[Device], numa_nodes: Sequence[int], gpus: Sequence[Device]) -> Topology:
    """{"cpu:N": [[preferred], [available]], "cuda:N": [...]}: the original's shape."""
    out: Topology = {}
    for node in sorted(numa_nodes) or [0]:
        pref = [n.name for n in nics if n.numa == node or (n.numa < 0 and len(numa_nodes) <= 1)]
        out[f"cpu:{node}"] = [pref, [n.name for n in nics if n.name not in pref]]
    for i, g in enumerate(gpus):
        dist = {n.name: pci_distance(g.pci, n.pci) for n in nics}
        best = min(dist.values(), default=0)
        pref = [n.name for n in nics if dist[n.name] == best]
        out[f"cuda:{i}"] = [pref, [n.name for n in nics if n.name not in pref]]
    return out


def parse(text: str, what: str = "topology") -> Topology:
    """A user's matrix (``{"cpu:0": [["mlx5_0"], ["mlx5_1"]], ...}``); ValueError naming the bad key."""
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{what}: not JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: expected an object of location -> [[preferred NICs], [other NICs]]")
    out: Topology = {}
    for k, v in raw.items():
        if not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, list) and all(isinstance(n, str) for n in x)
                                                            for x in v)):
            raise ValueError(f"{what}: {k!r} must be [[preferred NICs], [other NICs]], got {v!r}")
        out[str(k)] = [list(v[0]), list(v[1])]
    return out


def preferred(topo: Topology, location: str, nics: Sequence[str]) -> tuple[list[str], list[str]]:
    """(NICs to use first, the rest) among ``nics`` for memory at ``location``: the matrix's
    preferred ones when any of them is among ``nics``, else all of them."""
    entry = topo.get(location) or topo.get(location.split(":", 1)[0] + ":0")
    first = [n for n in nics if entry and n in entry[0]]
    if not first:
        return list(nics), []
    return first, [n for n in nics if n not in first]


def _device(name: str, sysdir: str) -> Device:
    try:
        pci = os.path.realpath(os.path.join(sysdir, "device"))
    except OSError:
        pci = ""
    try:
        with open(os.path.join(sysdir, "device", "numa_node")) as f:
            numa = int(f.read().strip())
    except (OSError, ValueError):
        numa = -1
    return Device(name, pci if os.path.exists(pci) else "", numa)


def _gpus(root: str = "/sys/bus/pci/devices") -> list[Device]:
    """NVIDIA display/3D controllers in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID's numbering)."""
    out: list[Device] = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for n in names:
        d = os.path.join(root, n)
        try:
            with open(os.path.join(d, "vendor")) as f:
                vendor = f.read().strip()
            with open(os.path.join(d, "class")) as f:
                cls = f.read().strip()
        except OSError:
            continue
        if vendor == "0x10de" and cls[:6] in ("0x0300", "0x0302"):
            try:
                with open(os.path.join(d, "numa_node")) as f:
                    numa = int(f.read().strip())
            except (OSError, ValueError):
                numa = -1
            out.append(Device(n, os.path.realpath(d), numa))
    return out


def local(device_name: str = "", custom_path: str = "") -> Topology:
    """``MC_CUSTOM_TOPO_JSON``'s matrix when given (ValueError naming the file when unreadable or
    malformed), else what sysfs says."""
    if custom_path:
        try:
            with open(custom_path) as f:
                return parse(f.read(), f"MC_CUSTOM_TOPO_JSON={custom_path}")
        except OSError as e:
            raise ValueError(f"MC_CUSTOM_TOPO_JSON={custom_path}: {e}") from None
    return discover(device_name)


def discover(device_name: str = "") -> Topology:
    """This host's topology; NICs restricted to ``device_name`` when given ("mlx5_0,eth1")."""
    wanted = [n.split(":", 1)[0].strip() for n in device_name.replace(";", ",").split(",") if n.strip()]
    nics: list[Device] = []
    try:
        ib = sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        ib = []
    for n in (wanted or ib):
        if n in ib:
            nics.append(_device(n, f"/sys/class/infiniband/{n}"))
        elif os.path.isdir(f"/sys/class/net/{n}"):
            nics.append(_device(n, f"/sys/class/net/{n}"))
    try:
        nodes = sorted(int(x[4:]) for x in os.listdir("/sys/devices/system/node")
                       if x.startswith("node") and x[4:].isdigit())
    except OSError:
        nodes = []
    return build(nics, nodes, _gpus())
