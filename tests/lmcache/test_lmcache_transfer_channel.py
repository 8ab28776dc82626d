"""LMCache's ``mooncake_te`` transfer channel (``--p2p-transfer-engine mooncake_te``) on our
Transfer Engine: two processes running LMCache 0.5.6's ``mooncake_te_impl`` unchanged, launched
through ``python -m mooncake_connectors.lmcache.run``; random pages move byte-exact both ways,
and a read from a peer that is gone fails within the transfer timeout instead of hanging."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from mooncake_lab.lmcache_harness import peer_env
from mooncake_core.utils.net import free_port
from mooncake_core.utils.proc import readline_timeout, stop_process

HERE = Path(__file__).resolve().parent  # te_channel_peer.py

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


class ChannelPeer:
    def __init__(self, py: str, seed: int, log):
        self.url = f"127.0.0.1:{free_port()}"
        self.seed = seed
        self.proc = subprocess.Popen(
            [py, "-m", "mooncake_connectors.lmcache.run", str(HERE / "te_channel_peer.py"),
             "--url", self.url, "--seed", str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
            env=peer_env({"MC_TRANSFER_TIMEOUT": "3"}))
        self.ready = json.loads(readline_timeout(self.proc, 120, what="transfer channel peer") or "{}")

    def read(self, other: "ChannelPeer", **kw) -> dict:
        self.proc.stdin.write(json.dumps(dict(op="read", peer=other.url, peer_seed=other.seed, **kw)) + "\n")
        self.proc.stdin.flush()
        return json.loads(readline_timeout(self.proc, 60, what="transfer channel read") or "{}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(20)
            except (OSError, subprocess.TimeoutExpired):
                pass
        stop_process(self.proc, 5)


def test_mooncake_te_channel_moves_pages_byte_exact(lmc_py, tmp_path) -> None:
    logs = [open(tmp_path / f"peer{i}.log", "w") for i in range(2)]
    a, b = ChannelPeer(lmc_py, 1, logs[0]), ChannelPeer(lmc_py, 2, logs[1])
    try:
        for p in (a, b):
            assert p.ready.get("engine") == "mooncake_core.engine", (p.ready, (tmp_path / "peer0.log").read_text()[-3000:])
        for page, pages, pick in ((4096, 64, 1), (256 << 10, 16, 2)):
            got = a.read(b, page=page, pages=pages, pick=pick)
            assert got.get("ok") and got.get("exact"), got
            got = b.read(a, page=page, pages=pages, pick=pick + 10)
            assert got.get("ok") and got.get("exact"), got
        b.close()
        t0 = time.monotonic()
        got = a.read(b, page=4096, pages=8, pick=3, timeout=20)
        assert time.monotonic() - t0 < 20
        assert "error" in got or got.get("ok") is False, got  # fails, never wrong bytes or a hang
    finally:
        a.close()
        b.close()
        for f in logs:
            f.close()
