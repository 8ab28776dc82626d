"""The console scripts: mooncake_demo (main job) and transfer_engine_bench."""

from __future__ import annotations

import signal
import subprocess

import pytest

pytestmark = pytest.mark.integration


def test_demo_runs_and_verifies(python_exe):
    """The README's main job: Transfer Engine part (8 verified steps) then the Store part."""
    r = subprocess.run([python_exe, "-m", "mooncake_core.cli.demo", "--size", "8MiB", "--batch", "16"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED" in r.stdout and "cma" in r.stdout and "tcp" in r.stdout
    te_lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[demo]") and ln.endswith(" ok")]
    assert len(te_lines) == 8, r.stdout
    # each step: the warm median of 4 rounds, the cold first round beside it
    assert all("(median of 4 warm rounds; first " in ln for ln in te_lines), r.stdout
    assert "all checks passed" in r.stdout, r.stdout
    assert "put_from/get_into" in r.stdout and "median of 4 warm rounds" in r.stdout.split("store:")[-1]


def test_demo_rejects_zero_rounds(python_exe):
    r = subprocess.run([python_exe, "-m", "mooncake_core.cli.demo", "--rounds", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--rounds must be >= 1" in r.stderr


def test_demo_transfer_only(python_exe):
    r = subprocess.run([python_exe, "-m", "mooncake_core.cli.demo", "--size", "4MiB", "--batch", "8",
                        "--only", "transfer"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mooncake_master" not in r.stdout


@pytest.mark.parametrize("mod", ["mooncake_core.cli.demo", "mooncake_core.cli.transfer_engine_bench"])
def test_help(python_exe, mod):
    r = subprocess.run([python_exe, "-m", mod, "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "usage" in r.stdout


def test_transfer_engine_bench_target_and_initiator(python_exe):
    tgt = subprocess.Popen([python_exe, "-m", "mooncake_core.cli.transfer_engine_bench", "--mode", "target",
                            "--buffer_size", "16MB"], stdout=subprocess.PIPE, text=True)
    try:
        line = tgt.stdout.readline()
        assert line.startswith("segment_id="), line
        seg = line.strip().split("=", 1)[1]
        for op, hint in (("write", "tcp"), ("read", "")):
            r = subprocess.run([python_exe, "-m", "mooncake_core.cli.transfer_engine_bench", "--segment_id", seg,
                                "--operation", op, "--block_size", "256KB", "--batch_size", "8",
                                "--buffer_size", "16MB", "--duration", "1", "--transport_hint", hint],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            assert "throughput" in r.stdout
        r = subprocess.run([python_exe, "-m", "mooncake_core.cli.transfer_engine_bench", "--segment_id",
                            "127.0.0.1:1", "--duration", "1", "--buffer_size", "1MB", "--batch_size", "2"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "cannot open segment" in r.stderr
    finally:
        tgt.send_signal(signal.SIGTERM)
        tgt.wait(10)
