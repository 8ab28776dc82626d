"""Optional dependencies: import them where needed, and say which extra to install if missing.

Why: etcd, Redis and ZeroMQ clients serve one backend or feature each (``pip install
mooncake-core[etcd]`` ...); a user of another backend should not need them, and a user of that
one should get a message naming the extra, not a bare ``ModuleNotFoundError`` from deep inside.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["MissingExtra", "require"]


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


def require(module: str, extra: str, feature: str) -> ModuleType:
    """``import module``, or MissingExtra: "<feature> needs <module>: pip install 'mooncake-core[<extra>]'"."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtra(f"{feature} needs the Python package {module.split('.')[0]!r}, which is not installed: "
                           f"pip install 'mooncake-core[{extra}]'") from e
