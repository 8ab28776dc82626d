"""The README's store command: ``mooncake_store_demo`` runs a whole single-node store."""

from __future__ import annotations

import subprocess

import pytest


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_store_demo_runs_end_to_end(python_exe) -> None:
    out = subprocess.run([python_exe, "-m", "mooncake_core.cli.store_demo", "--segment-size", "64MB",
                          "--value-size", "1MB", "--count", "8"], capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all checks passed" in out.stdout
    assert "FAIL" not in out.stdout
    assert "put_from/get_into" in out.stdout and "GB/s" in out.stdout
    assert out.stdout.count("(median of 4 warm rounds; first ") == 6, out.stdout  # put and get of 3 steps


def test_store_demo_rejects_bad_sizes(python_exe) -> None:
    out = subprocess.run([python_exe, "-m", "mooncake_core.cli.store_demo", "--segment-size", "50%"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "50%" in out.stderr
