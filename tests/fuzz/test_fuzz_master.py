"""Fuzz the store master: its RPC port (framing and msgpack bodies) and its embedded HTTP
metadata server. A real ``mooncake_master`` process; a real store client in this process
checks, every 50 inputs and at the end, that puts and gets still work and return its bytes."""

from __future__ import annotations

import os

import pytest
from fuzz.conftest import fuzz
from mooncake_lab.fuzz.surfaces import HttpFuzzer, MasterRpcFuzzer, metadata_routes, rand_bytes
from mooncake_lab.store_procs import Master, make_client

pytestmark = pytest.mark.integration


@pytest.fixture
def master_and_client(python_exe, tmp_path):
    m = Master(python_exe, str(tmp_path)).start()
    c = make_client(m, 16 << 20)
    yield m, c
    c.close()
    m.stop()


def _live(m: Master, c, n: int) -> None:
    key, val = f"fuzz-live/{n}/{os.urandom(8).hex()}", os.urandom(4096)
    rc = c.put(key, val)
    assert rc == 0, f"put after {n} fuzz inputs: {rc}\n{m.log_tail()}"
    assert c.get(key) == val, f"get after {n} fuzz inputs returned other bytes"
    assert m.proc is not None and m.proc.poll() is None, "the master died"


def test_master_rpc_survives_fuzzing(master_and_client) -> None:
    m, c = master_and_client
    fz = MasterRpcFuzzer("127.0.0.1", m.port)
    try:
        fuzz(fz.one, lambda n: _live(m, c, n))
    finally:
        fz.close()
    assert fz.kinds["frame"] > 0 and sum(fz.statuses.values()) > 0


def test_metadata_http_survives_fuzzing(master_and_client) -> None:
    m, c = master_and_client
    fz = HttpFuzzer("127.0.0.1", m.http_port, metadata_routes(), lambda r: rand_bytes(r, r.randrange(0, 2000)))
    fuzz(fz.one, lambda n: _live(m, c, n))
    assert fz.statuses, "no HTTP answer was ever parsed"


def test_backtracking_pattern_is_refused_without_freezing_the_master(master_and_client) -> None:
    """Found by fuzzing: one remove_by_regex with a backtracking pattern froze the master's RPC
    thread (every client got -900). Now it is refused after --remove_by_regex_budget_ms."""
    import time

    m, c = master_and_client
    assert c.put("a" * 40 + "!", b"victim") == 0
    assert c.put("keep/1", b"x") == 0
    t = time.monotonic()
    rc = c.remove_by_regex("(a|aa)+$")
    took = time.monotonic() - t
    assert rc == -600, rc
    assert took < 15.0, f"refusal took {took:.1f}s"  # 1 s budget at the master; unbounded: hours
    t = time.monotonic()
    assert c.is_exist("keep/1") == 1 and time.monotonic() - t < 5.0  # the master answers at once
    assert c.get("a" * 40 + "!") == b"victim"  # nothing was removed
    assert c.remove_by_regex("^keep/") == 1  # ordinary patterns still work
