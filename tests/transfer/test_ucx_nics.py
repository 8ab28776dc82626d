"""Several NICs under ``protocol="rdma"``: two "hosts" (network + pid + UTS namespaces) joined by
a plain link and two data NICs shaped to the same rate (mooncake_lab/twohosts.py), UCX over
tcp on them -- the code path an RDMA host runs with ``device_name="mlx5_0,mlx5_1"``.

* both NICs carry about twice what one does, bytes counted per NIC;
* a NIC taken down in the middle of a write: the write completes on the other, byte-exact,
  and the NIC is used again once it is back;
* an unknown device name is refused at initialize, naming it."""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time

import pytest

from mooncake_lab.line_peer import spawn_line_peer
from mooncake_lab.te_helpers import PEER, Peer, sha
from mooncake_lab.twohosts import TwoHosts, available

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(available() is not None, reason=f"two-host lab unavailable: {available()}")]

MB = 1 << 20
RATE = "400mbit"  # 50 MB/s per NIC: far below what the CPU moves, so the NICs set the pace


@pytest.fixture(scope="module")
def lab(ucx_lib):
    with TwoHosts(rate=RATE) as lab:
        yield lab


@pytest.fixture
def host_peer(lab):
    made: list[Peer] = []

    def start(host: str, device: str, size: int, seed: int, **extra: str) -> Peer:
        env = {**os.environ, "UCX_TLS": "tcp", "MC_SLICE_TIMEOUT": "1", "MC_RDMA_RAIL_PAUSE_SECONDS": "1", **extra}
        argv = lab.argv(host, [sys.executable, PEER, "--metadata", "P2PHANDSHAKE", "--size", str(size), "--seed",
                               str(seed), "--hostname", lab.ip[host], "--protocol", "rdma", "--device", device])
        proc, info = spawn_line_peer(argv, f"peer on host {host}", env=env)
        p = Peer(proc, info["segment"], info["addr"], info["size"], info["pid"], info["rpc_port"], seed)
        made.append(p)
        return p

    yield start
    for p in made:
        p.stop()


def _write(ini: Peer, tgt: Peer, n: int) -> dict:
    r = json.loads(ini.cmd(f"xfer w {tgt.segment} {tgt.addr} 0 {n}", timeout=120))
    assert r["rc"] == 0, r
    return r


def _nic_bytes(ini: Peer) -> dict[str, int]:
    out: dict[str, int] = {}
    for _t, lanes, _op, n in json.loads(ini.cmd("lanes")):
        out[lanes] = out.get(lanes, 0) + n
    return out


def test_two_nics_carry_twice_one_counted_per_nic(lab, host_peer):
    tgt = host_peer("b", "d0,d1", 16 * MB, 1)
    one = host_peer("a", "d0", 16 * MB, 2)
    two = host_peer("a", "d0,d1", 16 * MB, 3)
    t1 = statistics.median(_write(one, tgt, 16 * MB)["s"] for _ in range(3))
    t2 = statistics.median(_write(two, tgt, 16 * MB)["s"] for _ in range(3))
    assert tgt.sha(0, 16 * MB) == sha(two.expected())
    assert t1 / t2 >= 1.6, f"two NICs {16 / t2:.0f} MiB/s vs one {16 / t1:.0f} MiB/s"
    per_nic = _nic_bytes(two)
    assert set(per_nic) == {"tcp/d0", "tcp/d1"} and min(per_nic.values()) >= 16 * MB, per_nic
    assert set(_nic_bytes(one)) == {"tcp/d0"}


def test_nic_down_mid_write_fails_over_byte_exact_and_comes_back(lab, host_peer):
    size = 32 * MB
    tgt = host_peer("b", "d0,d1", size, 4)
    ini = host_peer("a", "d0,d1", size, 5)
    cut = threading.Timer(0.15, lab.link, args=("d1", False))
    cut.start()
    try:
        r = _write(ini, tgt, size)  # ~0.35 s on two NICs: d1 goes down in the middle
    finally:
        cut.join()
    assert r["s"] < 1 + 10, r  # MC_SLICE_TIMEOUT=1, then d0 carries the rest
    assert tgt.sha(0, size) == sha(ini.expected())
    before = _nic_bytes(ini)
    # d1 completed less than its half before it went down; d0 carried the rest (its retried windows)
    assert before.get("tcp/d1", 0) < size // 2 < before["tcp/d0"], before
    assert before.get("tcp/d1", 0) + before["tcp/d0"] == size, before
    lab.link("d1", True)
    time.sleep(1.5)  # MC_RDMA_RAIL_PAUSE_SECONDS=1
    _write(ini, tgt, size)
    after = _nic_bytes(ini)
    assert after.get("tcp/d1", 0) > before.get("tcp/d1", 0), (before, after)
    assert tgt.sha(0, size) == sha(ini.expected())


def test_memory_prefers_its_nics_and_the_others_take_over(lab, host_peer, tmp_path):
    """A topology matrix saying host memory prefers d1: every byte goes over d1; with d1 down
    the write still completes, on d0."""
    topo = tmp_path / "topo.json"
    topo.write_text('{"cpu:0": [["d1"], ["d0"]]}')
    tgt = host_peer("b", "d0,d1", 8 * MB, 7)
    ini = host_peer("a", "d0,d1", 8 * MB, 8, MC_CUSTOM_TOPO_JSON=str(topo))
    _write(ini, tgt, 8 * MB)
    assert set(_nic_bytes(ini)) == {"tcp/d1"}
    lab.link("d1", False)
    try:
        _write(ini, tgt, 8 * MB)
    finally:
        lab.link("d1", True)
    assert _nic_bytes(ini).get("tcp/d0", 0) == 8 * MB
    assert tgt.sha(0, 8 * MB) == sha(ini.expected())


def test_unknown_nic_refused(lab, host_peer):
    with pytest.raises(RuntimeError, match="d7"):
        host_peer("a", "d0,d7", MB, 6)
