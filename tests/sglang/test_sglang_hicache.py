"""SGLang HiCache's ``MooncakeStore`` (``--hicache-storage-backend mooncake``) on our store: pages
backed up by one SGLang process are found and prefetched byte-exact by another."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from .conftest import HERE, listen_port, sglang_env

pytestmark = pytest.mark.integration
PEER = os.path.join(HERE, "peer_hicache.py")


@pytest.fixture
def master(python_exe, tmp_path):
    port, metrics = listen_port(), listen_port()
    log = open(tmp_path / "master.log", "wb")  # noqa: SIM115 - the master's stdout for the fixture's life
    proc = subprocess.Popen([python_exe, "-m", "mooncake_core.store.master_main", f"--port={port}",
                             "--rpc_address=127.0.0.1", f"--metrics_port={metrics}"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            assert proc.poll() is None, (tmp_path / "master.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "mooncake_master did not listen within 30 s"
            time.sleep(0.05)
    yield f"127.0.0.1:{port}"
    proc.kill()
    proc.wait(timeout=10)
    log.close()


def test_hicache_mooncake_store_roundtrip(sglang_python, peers, master):
    env = sglang_env()
    args = ["--master", master, "--keys", "12", "--entry-bytes", "8192", "--seed", "7"]
    writer = peers([sglang_python, PEER, "--role", "writer", *args], env, "writer")
    w = writer.wait_event("result", 150)
    assert writer.wait_event("setup", 1)["store_class"] == "mooncake_core.store.client"
    assert w["ok"] and w["exists"] == 12, (w, writer.tail())
    reader = peers([sglang_python, PEER, "--role", "reader", *args], env, "reader")
    r = reader.wait_event("result", 150)
    assert r["exists"] == 12 and r["missing_exists"] is False, r
    assert r["got"] == [True] * 12 and r["bad_pages"] == [], r
    assert r["prefix_hits"] == 6, r  # batch_exists counts the leading hits, as HiCache's prefetch expects
    assert r["ok"], (r, reader.tail())
