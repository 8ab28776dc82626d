"""Run the coverage-guided atheris targets (tests/fuzz/atheris_targets.py) for a bounded number
of inputs each, in a subprocess (libFuzzer exits the process when it finds a crash, and prints
the input that caused it). A crash, an undocumented exception or a master INTERNAL_ERROR reply
fails the test with libFuzzer's report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RUNS = {"master": 200_000, "wire": 100_000, "params": 100_000}


@pytest.mark.parametrize("target", sorted(RUNS))
def test_atheris_target(target: str, tmp_path: Path) -> None:
    try:
        import atheris  # noqa: F401
    except ImportError:
        msg = "atheris not installed (pip install -e '.[test]')"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    env = {**os.environ, "MC_LOG_LEVEL": "CRITICAL"}  # refused frames are logged by design
    p = subprocess.run([sys.executable, str(HERE / "atheris_targets.py"), target, f"-runs={RUNS[target]}",
                        "-max_total_time=120", f"-artifact_prefix={tmp_path}/"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"atheris {target} failed (rc {p.returncode}):\n{out[-4000:]}"
    assert "DONE" in out and "cov:" in out, out[-2000:]
