"""Where the framework venvs are: ``<FW>_VENV``, else the user's cache directory.

The same rule as ``scripts/install_<fw>.sh`` (``${XDG_CACHE_HOME:-~/.cache}/mooncake-core/venvs/<fw>``),
so tests find what the install script built without a machine-specific path; ``.ci/run`` points
``<FW>_VENV`` at existing venvs when the machine has them elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path


def venv_dir(framework: str) -> Path:
    given = os.environ.get(f"{framework.upper()}_VENV")
    if given:
        return Path(given)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "mooncake-core" / "venvs" / framework


def venv_python(framework: str) -> Path:
    return venv_dir(framework) / "bin" / "python"
