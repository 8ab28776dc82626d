"""Fuzz what a *peer* sends to our engine: the P2P handshake (descriptor fetch) and the replies
to our reads and writes. A fake peer (surfaces.EvilPeer) answers with mutated descriptors,
wrong statuses, short or mislabeled replies, garbage, a closed connection or a late answer.

Rules: every call returns (0 or an error) within MC_TRANSFER_TIMEOUT plus slack; the local
buffer's unregistered guards never change; a read that reports success holds exactly the bytes
the peer sent; a descriptor claiming to be *another* process on this host (a victim) never gets
our engine to write into that process; and afterwards the engine still moves data to a real peer.
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import pytest

from fuzz.conftest import fuzz
from mooncake_lab.fuzz.targets import start_te_target
from mooncake_lab.fuzz.surfaces import EvilPeer
from mooncake_core.engine import TransferEngine
from mooncake_core.transfer.descriptor import host_identity, process_start_time
from mooncake_core.utils.proc import close_piped

pytestmark = pytest.mark.integration

GUARD = 4096
LOCAL = 64 << 10


@pytest.fixture
def setup(python_exe, monkeypatch):
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "1")
    victim = start_te_target(python_exe)
    eng = TransferEngine()
    assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, eng.last_error
    buf = np.full(LOCAL + 2 * GUARD, 0x5A, dtype=np.uint8)
    assert eng.register_memory(buf.ctypes.data + GUARD, LOCAL) == 0
    evil = EvilPeer()
    yield eng, buf, evil, victim
    evil.close()
    eng.close()
    close_piped(victim.proc)


def test_engine_survives_hostile_peers(setup) -> None:
    eng, buf, evil, victim = setup
    boot, pidns = host_identity()
    vinfo = {"boot_id": boot, "pidns": pidns, "pid": victim.proc.pid,
             "start_time": process_start_time(victim.proc.pid), "addr": victim.base, "length": victim.size}
    victim_sha = victim.check()["sha"]
    local = buf.ctypes.data + GUARD
    slow: list[float] = []

    def one(rng) -> None:
        length = rng.choice([0, 1, 4096, LOCAL, rng.randrange(1, LOCAL)])
        evil.new_plan(rng, vinfo, length)
        desc_claims_victim = b'"pid": %d' % victim.proc.pid in evil.plan["desc"]
        remote = (victim.base if desc_claims_victim else evil.region[0]) + rng.randrange(0, 4096)
        write = rng.random() < 0.5
        before = buf.copy()
        t = time.monotonic()
        if write:
            rc = eng.transfer_sync_write(evil.segment, local, remote, length)
        else:
            rc = eng.transfer_sync_read(evil.segment, local, remote, length)
        took = time.monotonic() - t
        slow.append(took)
        assert took < 1 + 3.5 + (3.0 if evil.plan["how"] == "late" else 0), f"call took {took:.1f}s ({evil.plan})"
        assert (buf[:GUARD] == 0x5A).all() and (buf[GUARD + LOCAL:] == 0x5A).all(), "local guard overwritten"
        if write or rc != 0:
            assert (buf == before).all() or not write, "a write changed local memory"
        elif length and evil.plan["how"] == "ok" and not desc_claims_victim:
            assert bytes(buf[GUARD:GUARD + length]) == evil.plan["payload"][:length], "read bytes differ"
        assert rc in (0, -1) or rc < 0, rc

    fuzz(one)
    assert victim.check()["sha"] == victim_sha, "our engine wrote into another process's memory"
    assert victim.check()["guards_ok"]
    # still a working engine: read all of a real peer
    out = np.zeros(victim.size, dtype=np.uint8)
    assert eng.register_memory(out.ctypes.data, out.nbytes) == 0
    assert eng.transfer_sync_read(victim.segment, out.ctypes.data, victim.base, victim.size) == 0, eng.last_error
    assert hashlib.sha256(out.tobytes()).hexdigest() == victim_sha
    assert sum(evil.served.values()) > 0 and "GET_DESC" in evil.served


def test_descriptor_claiming_another_local_process_is_not_attached_to(setup) -> None:
    """Found by the fuzzer above: a peer whose descriptor names another local process (pid,
    boot id, its memory) made our engine write into that process by cross-memory attach."""
    import random

    eng, buf, evil, victim = setup
    boot, pidns = host_identity()
    vinfo = {"boot_id": boot, "pidns": pidns, "pid": victim.proc.pid,
             "start_time": process_start_time(victim.proc.pid), "addr": victim.base, "length": victim.size}
    before = victim.check()["sha"]
    rng = random.Random(0)
    while True:  # a plan whose descriptor is the impersonation (variant 5), answered normally
        evil.new_plan(rng, vinfo, 4096)
        if b'"pid": %d' % victim.proc.pid in evil.plan["desc"] and evil.plan["how"] == "ok":
            break
    evil.plan.pop("status", None)
    rc = eng.transfer_sync_write(evil.segment, buf.ctypes.data + GUARD, victim.base, 4096)
    assert eng.transport_for(evil.segment) == "tcp"  # not cma: the claim was not believed
    assert rc == 0  # the write went to the peer that answered, over its own socket
    assert victim.check()["sha"] == before


def test_pid_listens_on() -> None:
    import socket

    from mooncake_core.transfer.cma import pid_listens_on

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        assert pid_listens_on(os.getpid(), port)
        assert not pid_listens_on(os.getppid(), port)
    finally:
        s.close()
    assert not pid_listens_on(os.getpid(), port)
