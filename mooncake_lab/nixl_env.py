"""Environment for NIXL subprocesses that load the plugin built from this checkout (tests, benches).

The plugin is compiled into a fresh directory that also links every plugin the venv's nixl
bundles, and ``NIXL_PLUGIN_DIR`` names it, so nothing installed in the venv is used or changed.
The bundled plugins find their libraries (UCX's libucp, libnixl_common, ...) through
``$ORIGIN``-relative RPATHs, which do not follow the links: ``LD_LIBRARY_PATH`` adds those
directories so UCX really loads beside ours.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from mooncake_lab.checkout_shim import shim_pythonpath


def run_py(py: str, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([py, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": shim_pythonpath(), **(env or {})})


_WHERE = ("import json; from mooncake_connectors.nixl.locate import find_nixl; i = find_nixl(); "
          "print(json.dumps([str(i.plugin_dir), i.package]))")


def make_plugin_env(py: str, d: Path) -> dict[str, str]:
    """Build the checkout's plugin into ``d`` for the nixl build ``py`` uses; the env to run with."""
    r = run_py(py, "-m", "mooncake_connectors.nixl.cli", "install", "--plugin-dir", str(d))
    if r.returncode != 0:
        raise RuntimeError(f"building the plugin failed:\n{r.stdout}\n{r.stderr}")
    where = run_py(py, "-c", _WHERE)
    if where.returncode != 0:
        raise RuntimeError(where.stderr)
    plugin_dir, package = json.loads(where.stdout.strip().splitlines()[-1])
    bundled = Path(plugin_dir)
    for p in bundled.iterdir():
        if p.name.endswith(".so") and not (d / p.name).exists():
            (d / p.name).symlink_to(p)
    libs = [str(bundled.parent), str(bundled.parent.parent / f"{package}.libs")]
    old = os.environ.get("LD_LIBRARY_PATH")
    return {"NIXL_PLUGIN_DIR": str(d), "PYTHONPATH": shim_pythonpath(), "MC_TRANSFER_TIMEOUT": "10",
            "LD_LIBRARY_PATH": os.pathsep.join(libs + ([old] if old else []))}
