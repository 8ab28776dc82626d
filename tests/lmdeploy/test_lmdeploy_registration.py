"""How ``--migration-backend Mooncake`` comes to mean our backend: import order, choice, launcher.

LMDeploy has no plugin hook; ``import mooncake_connectors.lmdeploy`` and the launcher are the way
in (mooncake_connectors/lmdeploy/registration.py). Each case is a fresh LMDeploy-venv interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lmdeploy_harness import HERE, REPO, venv_env

CORE = "mooncake_connectors.lmdeploy.backend.MooncakeCoreBackend"
THEIRS = "lmdeploy.pytorch.disagg.backend.mooncake.MooncakeBackend"

_REPORT = """
import json, mooncake_connectors.lmdeploy as m
from lmdeploy.pytorch.disagg.backend.backend import MIGRATION_BACKENDS
c = MIGRATION_BACKENDS.module_dict['Mooncake']
from mooncake.engine import TransferEngine
print(json.dumps({'cls': c.__module__ + '.' + c.__qualname__, 'again': m.register(),
                  'names': sorted(MIGRATION_BACKENDS.module_dict), 'te': TransferEngine.__module__, **R}))
"""

CASES = {
    # ours first, then LMDeploy's engine, its disagg connection module and its own backend module
    "ours_first": ("R = {}\nimport mooncake_connectors.lmdeploy\nimport lmdeploy.pytorch.engine\n"
                   "import lmdeploy.pytorch.disagg.conn.engine_conn\nimport lmdeploy.pytorch.disagg.backend.mooncake\n",
                   {}),
    # LMDeploy fully imported (its class registered) before ours
    "lmdeploy_first": ("import lmdeploy.pytorch.engine, lmdeploy.pytorch.disagg.conn.engine_conn\n"
                       "import lmdeploy.pytorch.disagg.backend.mooncake\n"
                       "from lmdeploy.pytorch.disagg.backend.backend import MIGRATION_BACKENDS as B\n"
                       "R = {'before': B.module_dict['Mooncake'].__module__}\n", {}),
    "keep_theirs": ("R = {}\n", {"MOONCAKE_LMDEPLOY_BACKEND": "lmdeploy"}),
}


def _run_all(cmds: dict[str, tuple[list[str], dict[str, str]]]) -> dict[str, subprocess.CompletedProcess]:
    procs = {k: subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=venv_env(**e),
                                 cwd=HERE) for k, (a, e) in cmds.items()}
    out = {}
    for k, p in procs.items():
        so, se = p.communicate(timeout=180)
        out[k] = subprocess.CompletedProcess(p.args, p.returncode, so, se)
    return out


def _json(r: subprocess.CompletedProcess) -> dict:
    """The JSON object a case printed last (one line, or the launcher's indented report)."""
    lines = r.stdout.splitlines()
    start = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("{")), None)
    assert r.returncode == 0 and start is not None, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    if lines[start] == "{":
        return json.loads("\n".join(lines[start:]))
    return json.loads(lines[start])


@pytest.mark.integration
def test_registration_any_order_choice_and_launcher(lmdeploy_python) -> None:
    cmds = {k: ([lmdeploy_python, "-c", pre + _REPORT], env) for k, (pre, env) in CASES.items()}
    launcher = [lmdeploy_python, "-m", "mooncake_connectors.lmdeploy"]
    cmds["check"] = (launcher + ["check"], {})
    cmds["probe_plain"] = ([lmdeploy_python, "-m", "lmdeploy_spawn_probe"], {})
    r = _run_all(cmds)

    first = _json(r["ours_first"])
    assert first["cls"] == CORE and first["again"] == "core"
    assert first["names"] == ["Mooncake"]  # DLSlime is absent here (no dlslime), LMDeploy's Mooncake replaced
    assert first["te"] == "mooncake_core.engine"  # the alias: LMDeploy's own code gets our engine
    late = _json(r["lmdeploy_first"])
    assert late["before"] == "lmdeploy.pytorch.disagg.backend.mooncake" and late["cls"] == CORE
    keep = _json(r["keep_theirs"])
    assert keep["cls"] == THEIRS and keep["again"] == "lmdeploy" and keep["te"] == "mooncake_core.engine"

    # the launcher (a package __main__, like the probe) makes LMDeploy-style spawned children register;
    # without its fix such a child keeps LMDeploy's class (the probe). `serve ...` is run through the
    # launcher by every PD scenario (test_lmdeploy_pd.py starts the proxy with it).
    chk = _json(r["check"])
    assert chk["backend"] == CORE and chk["spawned_child_backend"] == CORE and chk["lmdeploy"] == "0.18.0"
    assert _json(r["probe_plain"])["child"] == THEIRS


def test_launcher_help_and_choice_validation(monkeypatch) -> None:
    r = subprocess.run([sys.executable, "-m", "mooncake_connectors.lmdeploy", "--help"], capture_output=True,
                       text=True, timeout=60, cwd=REPO, env=dict(os.environ), check=False)
    assert r.returncode == 0
    for word in ("serve api_server", "--migration-backend Mooncake", "check", "MOONCAKE_LMDEPLOY_BACKEND",
                 "MOONCAKE_LOCAL_HOSTNAME", "MC_TRANSFER_TIMEOUT", "MC_FORCE_TCP"):
        assert word in r.stdout
    r = subprocess.run([sys.executable, "-m", "mooncake_connectors.lmdeploy", "serve", "proxy"], capture_output=True,
                       text=True, timeout=60, cwd=REPO, check=False)
    assert r.returncode == 2 and "LMDeploy is not installed" in r.stderr  # this interpreter has no LMDeploy

    from mooncake_connectors.lmdeploy import chosen

    monkeypatch.setenv("MOONCAKE_LMDEPLOY_BACKEND", "LMDeploy")
    assert chosen() == "lmdeploy"
    monkeypatch.setenv("MOONCAKE_LMDEPLOY_BACKEND", "dlslime")
    with pytest.raises(ValueError, match="MOONCAKE_LMDEPLOY_BACKEND='dlslime'"):
        chosen()
