"""Failure modes users hit with the original Mooncake (DESIGN.md §6) on the Transfer Engine side,
each tried on real processes. docs/reliability.md maps every failure mode to its test."""

from __future__ import annotations

import logging

import numpy as np
import pytest

pytestmark = pytest.mark.integration


def test_issue_553_transport_choice_is_logged_and_a_same_host_fallback_is_loud(start_peer, engine_factory,
                                                                               caplog) -> None:
    """Original #553 / the 'wrong NIC list falls back to tcp silently' reports: a mixed cluster
    failed with NotSupportedTransport, or ran slowly without saying why. Here the transport is
    negotiated per peer and logged; a same-host peer that cross-memory attach cannot reach (here:
    in its own pid namespace, as in another container) gets tcp with a WARNING naming it -- and
    the data still moves."""
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) not installed")
    open_peer = start_peer("P2PHANDSHAKE", seed=3)
    try:
        closed_peer = start_peer("P2PHANDSHAKE", seed=4, wrap=["unshare", "--pid", "--fork"])
    except RuntimeError as e:
        pytest.skip(f"cannot start a process in its own pid namespace here: {e}")
    eng = engine_factory("P2PHANDSHAKE")
    buf = np.zeros(4096, dtype=np.uint8)
    assert eng.register_memory(buf.ctypes.data, buf.nbytes) == 0
    with caplog.at_level(logging.INFO, logger="mooncake"):
        for peer, want in ((open_peer, "cma"), (closed_peer, "tcp")):
            assert eng.transfer_sync_read(peer.segment, buf.ctypes.data, peer.addr, 4096) == 0, eng.last_error
            assert bytes(buf) == peer.expected()[:4096].tobytes()
            assert eng.transport_for(peer.segment) == want
    chosen = {r.__dict__.get("segment"): r.__dict__.get("transport") for r in caplog.records
              if r.getMessage() == "transport selected for peer"}
    assert chosen.get(open_peer.segment) == "cma" and chosen.get(closed_peer.segment) == "tcp", chosen
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING and "tcp" in r.getMessage()]
    assert loud and loud[0].__dict__.get("segment") == closed_peer.segment


def test_issue_601_a_port_in_use_is_a_clear_error_naming_it(python_exe) -> None:
    """Original #601 / #2785: an implicit second port was never checked ('Address already in
    use' from deep inside), and a host with a port crashed. Here the engine's rpc port and the
    metadata server's port are checked when bound, and the error names the address."""
    import socket
    import subprocess

    from mooncake_core.engine import TransferEngine

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        eng = TransferEngine()
        assert eng.initialize(f"127.0.0.1:{port}", "P2PHANDSHAKE", "tcp", "") == -1
        assert f"127.0.0.1:{port}" in eng.last_error or str(port) in eng.last_error, eng.last_error
        eng.close()
        out = subprocess.run([python_exe, "-m", "mooncake_core.metadata.http_server", "--host", "127.0.0.1",
                              "--port", str(port)], capture_output=True, text=True, timeout=30)
        assert out.returncode != 0 and str(port) in out.stderr + out.stdout, out
    finally:
        s.close()
