"""``import mooncake.store`` / ``import mooncake.engine`` resolving to this project.

Why: framework code (SGLang, LMDeploy, LMCache, vLLM's Mooncake connectors) is written
against the original wheel's import paths. ``install()`` puts a meta-path finder in front of
the import system that maps those names onto our modules, so that code runs unchanged.
It only does so when the original Mooncake is *not* importable (we never shadow a real
install) unless forced with ``force=True`` or env ``MOONCAKE_CORE_COMPAT=1``. Idempotent.
Targets are imported lazily, on first import of the alias.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

__all__ = ["ALIASES", "install", "is_installed", "uninstall"]

# alias name -> our module
ALIASES: dict[str, str] = {
    "mooncake.engine": "mooncake_core.engine",
    "mooncake.store": "mooncake_core.store",
    "mooncake.mooncake_config": "mooncake_core.store.mooncake_config",
    "mooncake.async_store": "mooncake_core.store.async_store",
    "mooncake.buffer_pool": "mooncake_core.store.buffer_pool",
    "mooncake._fast_copy": "mooncake_core.store.fast_copy",
    "mooncake.structured_object_store": "mooncake_core.structured",
    "mooncake.http_metadata_server": "mooncake_core.metadata.kv_bootstrap",
    "mooncake.dataproto_catalog": "mooncake_core.structured.catalog",
}

#: names the original exports from the top-level ``mooncake`` package -> our module
TOP_LEVEL: dict[str, str] = {
    "BufferPool": "mooncake_core.store.buffer_pool",
    "RegisteredBufferPool": "mooncake_core.store.buffer_pool",
}


def _top_level_getattr(name: str):
    """``from mooncake import BufferPool`` (resolved on first use, as the alias modules are)."""
    if name in TOP_LEVEL:
        return getattr(importlib.import_module(TOP_LEVEL[name]), name)
    raise AttributeError(f"module 'mooncake' has no attribute {name!r}")


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target
        self._saved: tuple | None = None

    def create_module(self, spec):
        mod = importlib.import_module(self.target)
        # the import system overwrites __spec__/__loader__ on the module we return;
        # remember the originals so the real module keeps its identity.
        self._saved = (getattr(mod, "__spec__", None), getattr(mod, "__loader__", None))
        return mod

    def exec_module(self, module) -> None:
        if self._saved is not None:
            module.__spec__, module.__loader__ = self._saved


class _PackageLoader(importlib.abc.Loader):
    """The synthetic top-level ``mooncake`` package."""

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        module.__path__ = []  # a package, so submodule imports go through the finders
        # a real file, as a package has one (tools and tests locate the package by it)
        module.__file__ = __file__
        module.__getattr__ = _top_level_getattr
        module.__all__ = list(TOP_LEVEL)
        module.__doc__ = "Compatibility alias of mooncake_core (see mooncake_core.compat)."
        module.__mooncake_core_alias__ = True


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "mooncake":
            return importlib.machinery.ModuleSpec("mooncake", _PackageLoader(), is_package=True)
        if fullname in ALIASES:
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(ALIASES[fullname]))
        return None


_finder: _AliasFinder | None = None


def _original_importable() -> bool:
    if "mooncake" in sys.modules:
        return not getattr(sys.modules["mooncake"], "__mooncake_core_alias__", False)
    try:
        return importlib.util.find_spec("mooncake") is not None
    except (ImportError, ValueError):
        return False


def is_installed() -> bool:
    return _finder is not None and _finder in sys.meta_path


def install(force: bool = False) -> bool:
    """Make ``mooncake.*`` resolve to ours. Returns True when the alias is active.

    Without ``force`` (or ``MOONCAKE_CORE_COMPAT=1``) nothing happens if the original
    Mooncake package is importable.
    """
    global _finder
    if is_installed():
        return True
    from mooncake_core import envs

    forced = force or envs.MOONCAKE_CORE_COMPAT
    if not forced and _original_importable():
        return False
    if forced:
        # drop an already-imported original so the aliases take effect
        for name in [n for n in sys.modules if n == "mooncake" or n.startswith("mooncake.")]:
            del sys.modules[name]
    _finder = _AliasFinder()
    sys.meta_path.insert(0, _finder)
    return True


def uninstall() -> None:
    """Remove the alias (tests use it); already-imported alias modules are dropped."""
    global _finder
    if _finder is not None and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    _finder = None
    for name in [n for n in sys.modules if n == "mooncake" or n.startswith("mooncake.")]:
        mod = sys.modules[name]
        if name in ALIASES or getattr(mod, "__mooncake_core_alias__", False):
            del sys.modules[name]

