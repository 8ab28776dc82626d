"""Find the nixl installation of this Python: its version and its bundled plugin directory.

NIXL loads backend plugins from ``NIXL_PLUGIN_DIR`` when that is set -- which *replaces* the
bundled directory, hiding UCX and the others -- else from ``<dir of libnixl.so>/plugins``
(in the wheels: ``site-packages/.nixl_cuXX.mesonpy.libs/plugins``). No API adds a directory,
so the plugin is installed into the bundled one and every bundled backend stays available.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import sys
from dataclasses import dataclass
from pathlib import Path

from mooncake_connectors.nixl import abi

PLUGIN_FILE = "libplugin_MooncakeCore.so"


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
                           f"pip install --no-deps nixl-cu12=={max(abi.SUPPORTED)} nixl=={max(abi.SUPPORTED)}") from None
    pkg = getattr(nixl, "_pkg", None)  # the nixl meta package's chosen build
    if pkg is not None:
        return pkg.__name__
    for name in ("nixl_cu13", "nixl_cu12", "nixl_rocm"):
        if name in sys.modules:
            return name
    raise NixlNotFound("cannot tell which nixl build (nixl_cu12 / nixl_cu13 / ...) the nixl package uses")


def find_nixl() -> NixlInstall:
    """The nixl build ``import nixl`` uses in this interpreter."""
    name = _backend_module()
    mod = importlib.import_module(name)
    site = Path(mod.__file__).resolve().parent.parent
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
