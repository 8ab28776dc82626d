"""Which ``libucp`` this process uses, found in a fixed order and said out loud.

Why an order and not "whatever the loader finds": the PyPI ``libucx-cu12/13`` wheels are built
without verbs (tcp, shared-memory and cuda lanes only), so on an RDMA host the wheel is the
worst choice; a system / MOFED / HPC-X UCX knows the host's NICs best, NIXL's wheel bundles a
UCX with ``rc_mlx5`` / ``rc_verbs`` / ``ud`` / ``efa``. The order, first found wins:

1. a ``libucp`` already loaded in this process (NIXL or ucxx imported first): two UCX copies in
   one process would fight over the same symbols and memory hooks;
2. ``system``: the dynamic loader's ``libucp.so.0`` (``LD_LIBRARY_PATH`` -- what HPC-X's
   ``hpcx_load`` sets -- then ``ldconfig``: MOFED and distribution packages);
3. ``nixl``: the UCX inside an installed NIXL wheel (``nixl_cu13.libs/``, ``nixl_cu12.libs/``);
4. ``wheel``: the ``libucx`` package (``pip install libucx-cu13``: the ``ucx`` extra).

``MC_UCX_LIBRARY`` overrides: one of ``system`` / ``nixl`` / ``wheel`` (only that source), or
the path of a ``libucp.so`` (or of the directory holding it). Pure parts (the order, the
override's meaning) are functions of their inputs; ``load()`` does the I/O once per process.

On a host with no RDMA device, ``UCX_MODULES`` is set (unless the user set it) to skip UCX's
InfiniBand / RDMA-CM modules: they can serve nothing there, and the NIXL wheel's UCX, whose
``ib`` module fails to load without ``libibverbs``, otherwise leaves its bundled ``libnl-route``
half-loaded and the process crashes in that library's destructor at exit (seen with NIXL 1.5.1's
UCX 1.23 here).
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from mooncake_core import envs

__all__ = ["SOURCES", "LoadedUcp", "UcxNotFound", "candidates", "load"]

#: the automatic order (after a libucp already in the process)
SOURCES = ("system", "nixl", "wheel")
#: NIXL wheel builds whose ``<name>.libs/`` may bundle UCX, newest CUDA first
NIXL_BUILDS = ("nixl_cu13", "nixl_cu12", "nixl_rocm")
#: the libucx wheels (RAPIDS), newest CUDA first
WHEEL_PACKAGES = ("libucx", "libucx_cu13", "libucx_cu12")

HOW_TO_INSTALL = ("pip install libucx-cu13 (the 'ucx' extra; tcp / shared-memory / cuda lanes, no verbs); "
                  "for RDMA NICs a verbs-capable UCX: MOFED/DOCA or the distribution's 'ucx' package (system), "
                  "HPC-X (hpcx_load sets LD_LIBRARY_PATH), or the NIXL wheel (pip install nixl-cu12 / nixl-cu13); "
                  "MC_UCX_LIBRARY=system|nixl|wheel|/path/libucp.so picks one")


class UcxNotFound(RuntimeError):
    """No libucp could be loaded from the sources allowed; the message says where it looked."""


@dataclass(frozen=True)
class LoadedUcp:
    source: str          # "loaded" | "system" | "nixl" | "wheel" | "path"
    path: str            # the file the loader mapped
    lib: ctypes.CDLL


def _sources_for(override: str) -> tuple[tuple[str, ...], str]:
    """(sources to try in order, explicit path or ""): pure reading of ``MC_UCX_LIBRARY``."""
    o = override.strip()
    if not o:
        return ("loaded", *SOURCES), ""
    if o.lower() in SOURCES:
        return (o.lower(),), ""
    return ("path",), o


def _loaded_in_process(maps: str = "/proc/self/maps") -> list[str]:
    try:
        with open(maps) as f:
            paths = {line.split(None, 5)[5].strip() for line in f if line.count(" ") >= 5 and "libucp" in line}
    except (OSError, IndexError):
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith("libucp"))


def _package_dir(name: str) -> Path | None:
    """Where an installed package lives, found without importing it (None when absent)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin:
        return Path(spec.origin).parent
    locations = list(spec.submodule_search_locations or [])
    return Path(locations[0]) if locations else None


def _nixl_paths() -> list[str]:
    """The libucp a NIXL wheel bundles: ``<site>/nixl_cuXX.libs/libucp-<hash>.so.0.0.0``."""
    out: list[str] = []
    for name in NIXL_BUILDS:
        d = _package_dir(name)
        if d is not None:
            out += sorted(glob.glob(str(d.parent / f"{name}.libs" / "libucp*.so*")))
    return out


def _wheel_paths() -> list[str]:
    """The libucx wheel's ``libucx/lib/libucp.so.0``."""
    found = (_package_dir(name) for name in WHEEL_PACKAGES)
    return [str(d / "lib" / "libucp.so.0") for d in found if d is not None and (d / "lib" / "libucp.so.0").exists()]


def _path_of(p: str) -> list[str]:
    path = Path(p)
    if path.is_dir():
        exact = sorted(str(x) for x in path.glob("libucp.so*"))
        return (exact or sorted(str(x) for x in path.glob("libucp*.so*")))[:1]
    return [str(path)]


def candidates(sources: Sequence[str], explicit: str = "",
               finders: dict[str, Callable[[], list[str]]] | None = None) -> list[tuple[str, str]]:
    """(source, path or soname) in the order they are tried."""
    f = finders or {"loaded": _loaded_in_process, "system": lambda: ["libucp.so.0"], "nixl": _nixl_paths,
                    "wheel": _wheel_paths, "path": lambda: _path_of(explicit)}
    return [(s, p) for s in sources for p in f[s]()]


def _mapped_path(lib: ctypes.CDLL, fallback: str) -> str:
    """The file the loader actually mapped for ``lib`` (a soname tells nobody which UCX)."""
    class _DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]
    try:
        libdl = ctypes.CDLL(None)
        dladdr = libdl.dladdr
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        info = _DlInfo()
        if dladdr(ctypes.cast(lib.ucp_get_version, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode())
    except (AttributeError, OSError):
        pass
    return fallback


#: UCX modules that need an RDMA device (and libibverbs / librdmacm)
RDMA_MODULES = ("ib", "ib_mlx5", "ib_mlx5_ext", "ib_mlx5_gda", "ib_mlx5_gdp", "ib_efa", "efa", "rdmacm")


def modules_setting(env: Mapping[str, str], rdma_devices: list[str]) -> str | None:
    """The ``UCX_MODULES`` value to set before loading UCX, or None to leave it alone."""
    if rdma_devices or env.get("UCX_MODULES", "").strip():
        return None
    return "^" + ",".join(RDMA_MODULES)


def _rdma_devices() -> list[str]:
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []


_lock = threading.Lock()
_loaded: LoadedUcp | None = None


def load() -> LoadedUcp:
    """The process's libucp (loaded once; UcxNotFound naming every place tried)."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        override = envs.MC_UCX_LIBRARY
        sources, explicit = _sources_for(override)
        modules = modules_setting(os.environ, _rdma_devices())
        if modules is not None:  # read by UCX when it loads (see the module docstring)
            os.environ["UCX_MODULES"] = modules
        tried: list[str] = []
        for source, path in candidates(sources, explicit):
            try:
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL if source == "path" else ctypes.RTLD_LOCAL)
                lib.ucp_get_version  # noqa: B018 - a libucp, not some other file
            except (OSError, AttributeError) as e:
                tried.append(f"{source}: {path} ({str(e).splitlines()[0][:160]})")
                continue
            _loaded = LoadedUcp(source, _mapped_path(lib, path), lib)
            return _loaded
        where = "; ".join(tried) if tried else f"nothing found for {', '.join(sources)}"
        raise UcxNotFound(f"no UCX library (libucp) could be loaded (MC_UCX_LIBRARY={override or 'unset'}; "
                          f"tried: {where}). Install one: {HOW_TO_INSTALL}")
