"""atomic_write: the one helper behind metadata snapshots and SSD-tier files."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mooncake_core.utils.fileio import atomic_write


@pytest.mark.parametrize("durable", [False, True])
def test_atomic_write_creates_and_replaces(tmp_path, durable: bool) -> None:
    path = str(tmp_path / "sub" / "dir" / "f.bin")
    rng = np.random.default_rng(11)
    first, second = rng.bytes(10_000), rng.bytes(3_000)
    assert atomic_write(path, first, durable=durable) == len(first)
    assert open(path, "rb").read() == first
    assert atomic_write(path, memoryview(second), durable=durable) == len(second)
    assert open(path, "rb").read() == second
    assert os.listdir(os.path.dirname(path)) == ["f.bin"], "no temporary file left behind"


def test_atomic_write_failure_leaves_old_file_and_no_temp(tmp_path) -> None:
    target = tmp_path / "adir"
    target.mkdir()
    (target / "keep").write_bytes(b"old")
    with pytest.raises(OSError):
        atomic_write(str(target), np.random.default_rng(3).bytes(100))  # cannot replace a directory
    assert sorted(os.listdir(tmp_path)) == ["adir"]
    assert (target / "keep").read_bytes() == b"old"
