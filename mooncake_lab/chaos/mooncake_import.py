"""Import ``mooncake.<name>`` from the implementation under test (stdlib only).

``impl == "ref"``: the original Mooncake installed in the running venv. ``impl == "ours"``:
``mooncake_core.compat`` aliases ``mooncake.*`` to this checkout first, so the workers drive
both through exactly the same public API and code.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def mooncake_module(impl: str, name: str) -> ModuleType:
    if impl == "ours":
        from mooncake_core import compat
        from mooncake_core.utils.log import setup_logging

        setup_logging()  # timestamps in the process's log (level: MC_LOG_LEVEL, default INFO)
        compat.install(force=True)
    return importlib.import_module(f"mooncake.{name}")
