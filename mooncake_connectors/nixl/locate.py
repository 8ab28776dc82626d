"""Find the nixl installation of this Python: its version and its bundled plugin directory.

NIXL loads backend plugins from ``NIXL_PLUGIN_DIR`` when that is set -- which *replaces* the
bundled directory, hiding UCX and the others -- else from ``<dir of libnixl.so>/plugins``
(in the wheels: ``site-packages/.nixl_cuXX.mesonpy.libs/plugins``). No API adds a directory,
so the plugin is installed into the bundled one and every bundled backend stays available.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from mooncake_connectors.nixl import abi

PLUGIN_FILE = "libplugin_MooncakeCore.so"
#: the nixl wheel builds, in the order the ``nixl`` meta package tries them without CUDA
BUILDS = ("nixl_cu13", "nixl_cu12", "nixl_rocm")


class NixlNotFound(RuntimeError):
    """nixl is not importable in this Python, or its plugin directory is missing."""


@dataclass(frozen=True)
class NixlInstall:
    package: str  # the wheel's module, e.g. nixl_cu12
    version: str
    plugin_dir: Path

    @property
    def plugin_path(self) -> Path:
        return self.plugin_dir / PLUGIN_FILE

    def vtable_words(self) -> int | None:
        return abi.vtable_words(self.plugin_dir)

    def check_abi(self) -> None:
        abi.check(self.version, self.vtable_words())


def _backend_module() -> str:
    try:
        nixl = importlib.import_module("nixl")
    except ImportError as e:
        raise NixlNotFound(f"nixl is not installed in {sys.executable} ({e}); install it first, e.g. "
                           f"pip install --no-deps nixl-cu12=={max(abi.SUPPORTED)} nixl=={max(abi.SUPPORTED)}"
                           ) from None
    pkg = getattr(nixl, "_pkg", None)  # the nixl meta package's chosen build
    if pkg is not None:
        return pkg.__name__
    for name in BUILDS:
        if name in sys.modules:
            return name
    raise NixlNotFound("cannot tell which nixl build (nixl_cu12 / nixl_cu13 / ...) the nixl package uses")


def find_nixl() -> NixlInstall:
    """The nixl build ``import nixl`` uses in this interpreter."""
    return _install_of(_backend_module())


def find_all() -> list[NixlInstall]:
    """Every nixl build installed here (found without importing them). A venv may hold two:
    the ``nixl`` meta package picks one by the CUDA major it detects *in the importing
    process* (vLLM's processes import cuda-bindings, a plain script does not), so the plugin
    goes beside each of them."""
    found = [_install_of(n) for n in BUILDS if importlib.util.find_spec(n) is not None]
    if not found:
        _backend_module()  # raises NixlNotFound with the install hint
    return found


def _install_of(name: str) -> NixlInstall:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        raise NixlNotFound(f"nixl build {name} is not importable")
    site = Path(spec.origin).resolve().parent.parent
    dist = name.replace("_", "-")
    try:
        version = md.version(dist)
    except md.PackageNotFoundError:
        raise NixlNotFound(f"module {name} has no installed distribution {dist}") from None
    plugin_dir = site / f".{name}.mesonpy.libs" / "plugins"
    if not plugin_dir.is_dir():
        found = sorted(p.parent for p in site.glob(".*.libs/plugins/libplugin_UCX.so"))
        if not found:
            raise NixlNotFound(f"nixl {version} ({name}) has no bundled plugin directory under {site}")
        plugin_dir = found[0]
    return NixlInstall(package=name, version=version, plugin_dir=plugin_dir)
