"""``bind_to_numa_node`` (LMCache calls it before store setup): binds like upstream where the
node exists, is a logged no-op where it does not, and rejects a non-int node by name."""

from __future__ import annotations

import os
import threading

import pytest

from mooncake_core.store import bind_to_numa_node
from mooncake_core.store.numa import _parse_cpulist, node_cpus


def test_parse_cpulist() -> None:
    assert _parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert _parse_cpulist("5") == {5}
    assert _parse_cpulist("") == set()


def test_node_cpus_reads_sysfs(tmp_path) -> None:
    (tmp_path / "node1").mkdir()
    (tmp_path / "node1" / "cpulist").write_text("2-3\n")
    assert node_cpus(1, str(tmp_path)) == {2, 3}
    assert node_cpus(7, str(tmp_path)) == set()


def _in_thread(fn):
    """Run ``fn`` in a fresh thread (affinity is per thread: the test's own stays untouched)."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(10)
    return out[0]


def test_bind_to_existing_node_sets_affinity() -> None:
    want = node_cpus(0) & os.sched_getaffinity(0)
    if not want:
        pytest.skip("this machine exposes no NUMA node 0 in sysfs")

    def run():
        bind_to_numa_node(0)
        return os.sched_getaffinity(0)
    assert _in_thread(run) == want


def test_bind_to_missing_node_is_a_logged_noop(caplog) -> None:
    def run():
        before = os.sched_getaffinity(0)
        bind_to_numa_node(4095)
        return before, os.sched_getaffinity(0)
    with caplog.at_level("WARNING"):
        before, after = _in_thread(run)
    assert before == after
    assert "bind_to_numa_node(4095)" in caplog.text


def test_bind_rejects_bad_node() -> None:
    with pytest.raises(TypeError, match="node must be int"):
        bind_to_numa_node("0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        bind_to_numa_node(-1)
