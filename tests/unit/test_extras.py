"""An optional dependency that is not installed is an error naming the extra to install.

Each check runs in a fresh interpreter where the client library cannot be imported (its
module set to None in sys.modules, as when the extra was never installed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mooncake_lab.checkout_shim import shim_pythonpath

CASES = {
    "etcd": ("etcd3gw", "from mooncake_core.metadata import open_metadata\nopen_metadata('etcd://127.0.0.1:1')"),
    "redis": ("redis", "from mooncake_core.metadata import open_metadata\nopen_metadata('redis://127.0.0.1:1')"),
    "etcd-ha": ("etcd3gw", "from mooncake_core.store.ha import resolve_leader\nresolve_leader([('127.0.0.1', 1)])"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_missing_client_names_the_extra(case: str) -> None:
    module, code = CASES[case]
    extra = case.split("-")[0]
    script = f"import sys\nsys.modules[{module!r}] = None\n{code}\n"
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": shim_pythonpath(), "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0
    assert f"pip install 'mooncake-core[{extra}]'" in r.stderr, r.stderr[-2000:]


def test_engine_reports_the_missing_extra() -> None:
    script = ("import sys\nsys.modules['redis'] = None\nfrom mooncake_core.engine import TransferEngine\n"
              "e = TransferEngine()\nprint(e.initialize('127.0.0.1', 'redis://127.0.0.1:1', 'tcp', ''), e.last_error)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": shim_pythonpath(), "PATH": "/usr/bin:/bin"})
    assert r.stdout.startswith("-1 ") and "mooncake-core[redis]" in r.stdout, r.stdout + r.stderr[-2000:]
