"""Make framework-venv subprocesses import the checkout under test.

The SGLang and vLLM venvs have this repo installed editable from wherever their install script
last ran (a developer's tree, or CI's fresh clone elsewhere). ``checkout_shim()`` returns a
directory whose entries link this checkout's packages (and the lab harness, for the framework-side
helpers it holds) under their import names; put first on
the subprocess's PYTHONPATH it makes the framework import the code under test, while the
framework still finds our entry points through the venv's installed metadata.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_SHIM: list[str] = []


def checkout_shim() -> str:
    if not _SHIM:
        d = tempfile.mkdtemp(prefix="mooncake-checkout-shim-")
        for name in ("mooncake_core", "mooncake_connectors", "mooncake_proxy", "mooncake_lab"):
            os.symlink(REPO / name, os.path.join(d, name))
        atexit.register(shutil.rmtree, d, True)
        _SHIM.append(d)
    return _SHIM[0]


def shim_pythonpath() -> str:
    """PYTHONPATH value with the shim first, keeping any PYTHONPATH already set."""
    return os.pathsep.join([checkout_shim()] + [p for p in [os.environ.get("PYTHONPATH")] if p])
