"""Puts against a master of an older release, one without ``put_commit`` / ``batch_put_commit``:
the client recognises the master's "malformed request" answer to the unknown RPC and falls back
to ``put_end`` / ``batch_put_end`` (two round trips) -- no put is lost on the way. A real master
process that does not decode those request types (``older_master.py``), real sockets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_lab.store_procs import OlderMaster, make_client, payload, sha

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def older(python_exe, tmp_path, worker_factory) -> Iterator[Any]:
    """(master without the two commit RPCs, worker with a 16 MiB segment)."""
    m = OlderMaster(python_exe, str(tmp_path), ["PutCommitReq", "BatchPutCommitReq"]).start()
    try:
        yield m, worker_factory(m, 16 << 20)
    finally:
        m.stop()


@pytest.mark.parametrize("segment", [0, 16 << 20], ids=["no-segment", "own-segment"])
def test_puts_fall_back_to_put_end_against_an_older_master(older, segment: int) -> None:
    m, w = older
    c = make_client(m, segment)
    try:
        vals = {f"single-{segment}-{i}": payload(i, 1000 + i) for i in range(3)}
        for k, v in vals.items():
            assert c.put(k, v) == 0, m.log_tail()
        assert c._core.writes.single.enabled is False, "the master's refusal of put_commit was not recognised"
        for b in range(3):  # the first batch falls back; the later ones go the two-round-trip way
            batch = {f"batch-{segment}-{b}-{i}": payload(100 * b + i, 1024) for i in range(20)}
            assert c.put_batch(list(batch), list(batch.values())) == 0, m.log_tail()
            assert c._core.writes.batch.enabled is False, "the refusal of batch_put_commit was not recognised"
            assert c._core.writes.batch.current is None
            vals.update(batch)
        for k, v in vals.items():  # published: another process reads every value back
            assert w.cmd(op="get", key=k) == {"len": len(v), "sha": sha(v)}, k
        assert [sha(g) for g in c.get_batch(list(vals))] == [sha(v) for v in vals.values()]
    finally:
        c.close()


def test_the_older_master_refuses_the_commit_rpcs(older) -> None:
    """The premise: the stand-in answers the RPCs it lacks as an older master does."""
    from mooncake_core.errors import MooncakeError
    from mooncake_core.store.master_client import MasterClient
    from mooncake_core.store.protocol import ReplicateConfigMsg

    m, _ = older
    with MasterClient(m.addr) as mc:
        with pytest.raises(MooncakeError, match="malformed request"):
            mc.put_commit("c1", "k", 10, ReplicateConfigMsg(), reserved=False, next_size=0)
        assert mc.exist_key("k") is False  # and answers what it knows
