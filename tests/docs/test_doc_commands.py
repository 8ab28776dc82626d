"""Every ``<!-- doc-test: NAME -->`` block of README.md and docs/*.md, run as the doc has it
(tests/docs/doc_runs.py says how, per block). A failure names the doc's file and line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.venvs import venv_dir

from mooncake_core.utils.net import free_port

from .doc_blocks import load_docs
from .doc_runs import RUNS, Ctx

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NAMED = {b.marker.value: b for b in load_docs(REPO)
         if b.lang == "bash" and b.marker is not None and b.marker.kind == "doc-test"}
#: runs that need a framework venv, and which
NEEDS = {"vllm-1p1d": "vllm", "vllm-guide": "vllm"}


@pytest.fixture
def ctx(tmp_path: Path) -> Ctx:
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)  # console scripts of the environment under test
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    env["PYTHONPATH"] = shim_pythonpath()  # every python (framework venvs too) imports this checkout
    env.update({"VLLM_VENV": str(venv_dir("vllm")), "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "PYTHONUNBUFFERED": "1"})
    return Ctx(tmp_path, env, free_port)


@pytest.mark.parametrize("name", [pytest.param(n, id=f"{n}@{NAMED[n].where(-1)}",
                                               marks=[pytest.mark.timeout(900)] if n in NEEDS else [])
                                  for n in sorted(NAMED)])
def test_doc_block_runs(name: str, ctx: Ctx) -> None:
    fw = NEEDS.get(name)
    if fw and not (venv_dir(fw) / "bin" / "python").exists():
        if os.environ.get(f"MOONCAKE_REQUIRE_{fw.upper()}") == "1":
            pytest.fail(f"{NAMED[name].where(-1)}: needs the {fw} venv ({venv_dir(fw)}): scripts/install_{fw}.sh")
        pytest.skip(f"no {fw} venv at {venv_dir(fw)} (scripts/install_{fw}.sh builds it)")
    RUNS[name](NAMED[name], ctx)
