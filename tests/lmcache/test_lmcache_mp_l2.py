"""LMCache's multiprocess mode with our store as its L2 tier (LMCache 0.5.6, its own classes).

LMCache's MP cache server (``python -m lmcache.v1.multiprocess.server``, unchanged) loads
``mooncake_connectors.lmcache.l2_adapter.MooncakeStoreL2Adapter`` through its ``plugin`` L2
adapter type. An engine worker (``mp_worker_peer.py``: LMCache's request client and its
``lmcache_driven`` transfer context, i.e. the CPU device spec's shared-memory KV wrappers)
stores paged CPU KV blocks through the server; LMCache's store controller writes them to L2.
The server keeps no segment of its own (``global_segment_size`` 0): the objects live in a
segment this test process lends to the pool, as a storage node would.

* restart: the server is stopped and a fresh one (empty L1) started on the same store; the
  worker's lookups hit, and the chunks it retrieves into zeroed blocks equal the stored blocks
  byte for byte -- they can only have come from the store;
* negative control: objects removed from the store are misses for the running server;
* an unreachable master stops the server at start-up with an error naming
  ``master_server_address``.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from mooncake_core.store.master_client import MasterClient
from mooncake_core.utils.net import free_port
from mooncake_core.utils.proc import readline_timeout, stop_process
from mooncake_lab.lmcache_harness import LMC_ENV, MPServer, adapter_spec, peer_env
from mooncake_lab.store_procs import Master, make_client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HERE = Path(__file__).resolve().parent
MODEL = "mooncake-l2-test"  # mp_worker_peer.py's model name
CHUNKS = 2  # per request
class WorkerPeer:
    """``mp_worker_peer.py`` (an engine worker) talking JSON lines."""

    def __init__(self, py: str, url: str, log: Path, requests: int):
        self._log = open(log, "ab")
        self.proc = subprocess.Popen([py, str(HERE / "mp_worker_peer.py"), "--url", url, "--requests",
                                      str(requests), "--chunks", str(CHUNKS)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, env=peer_env(LMC_ENV))
        self.log = log
        assert json.loads(readline_timeout(self.proc, 180, what="MP worker peer") or "{}").get("ready"), \
            log.read_text(errors="replace")[-3000:]

    def cmd(self, op: str, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(dict(kw, op=op)) + "\n")
        self.proc.stdin.flush()
        out = json.loads(readline_timeout(self.proc, 120, what=f"MP worker {op}") or "{}")
        assert "error" not in out, (out, self.log.read_text(errors="replace")[-3000:])
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        stop_process(self.proc, 5)
        self._log.close()


def stored_keys(m: Master) -> list[str]:
    with MasterClient(m.addr, timeout=5.0) as mc:
        return sorted(mc.watch_keys(0, prefix=f"{MODEL}@").snapshot)


def wait_keys(m: Master, n: int, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while len(keys := stored_keys(m)) < n:
        assert time.monotonic() < deadline, f"the store holds {len(keys)} of {n} chunks"
        time.sleep(0.3)
    return keys


def test_mp_server_l2_survives_restart_byte_exact(master_factory, lmc_py, tmp_path) -> None:
    m = master_factory()
    holder = make_client(m, segment=64 << 20)  # the pool's memory: this process, not the LMCache server
    servers: list[MPServer] = []
    workers: list[WorkerPeer] = []
    try:
        spec = adapter_spec(m.addr, m.meta)
        a = MPServer(lmc_py, tmp_path / "server-a.log", spec)
        servers.append(a)
        w = WorkerPeer(lmc_py, a.url, tmp_path / "worker-a.log", requests=4)  # starts with the server
        workers.append(w)
        a.wait_ready()
        assert w.cmd("store", requests=[0, 1, 2, 3])["stored"] == [True] * 4
        keys = wait_keys(m, 4 * CHUNKS)
        # LMCache's native-connector key string (that of its C++ mooncake_store adapter), raw KV bytes
        assert all(re.fullmatch(rf"{MODEL}@[0-9a-f]{{8}}@0@[0-9a-f]+", k) for k in keys), keys
        assert "MooncakeStoreL2Adapter ready" in a.text()
        w.close()
        a.stop()
        assert "MooncakeStoreL2Adapter closed" in a.text(), a.text()[-3000:]
        assert stored_keys(m) == keys  # the server's restart leaves the pool as it was

        b = MPServer(lmc_py, tmp_path / "server-b.log", spec)
        servers.append(b)
        w2 = WorkerPeer(lmc_py, b.url, tmp_path / "worker-b.log", requests=4)
        workers.append(w2)
        b.wait_ready()
        look = w2.cmd("lookup", requests=[0, 1, 2])
        assert look["hits"] == [CHUNKS] * 3, (look, b.text()[-3000:])
        got = w2.cmd("retrieve", requests=[0, 1, 2], lookup_n=look["n"])["retrieved"]
        assert [g["exact"] for g in got] == [True] * 3, got
        assert re.search(r"\(0 L1, 2 L2\)", b.text()), "the hits did not come from L2"

        assert holder.remove_all(True) == 4 * CHUNKS
        assert w2.cmd("lookup", requests=[3])["hits"] == [0]  # stored in the first life, now gone
    finally:
        for x in workers:
            x.close()
        for s in servers:
            s.stop()
        holder.close()


def test_mp_server_unreachable_master_names_the_key(lmc_py, tmp_path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    s = MPServer(lmc_py, tmp_path / "server.log",
                 adapter_spec(dead, "P2PHANDSHAKE", mooncake_rpc_timeout="1"))
    try:
        rc = s.proc.wait(120)
    finally:
        s.stop()
    text = s.text()
    assert rc != 0, text[-3000:]
    assert f"adapter_params['master_server_address']='{dead}': the store master is unreachable" in text, \
        text[-3000:]
