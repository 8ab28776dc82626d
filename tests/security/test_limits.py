"""Limits with clear errors, on real processes: the master's keys per batch and value size, the
TE rpc port's connections per peer. (The metadata server's 413 and budgets: tests/metadata; the
proxy's body limit: test_http_auth.py.)"""

from __future__ import annotations

import socket
import time

import pytest

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store import protocol as P
from mooncake_core.store.master_client import MasterClient
from mooncake_core.transfer import wire as W
from mooncake_lab.store_procs import Master

from .conftest import child_env

pytestmark = pytest.mark.integration


def test_master_refuses_oversize_values_and_batches_by_name(python_exe, tmp_path) -> None:
    m = Master(python_exe, str(tmp_path), http=False, max_value_size="1MB", max_batch_keys=4).start()
    try:
        with MasterClient(m.addr, timeout=3.0) as c:
            with pytest.raises(MooncakeError) as e:
                c.put_start("client", "big", 2 << 20, P.ReplicateConfigMsg())
            assert e.value.code == ErrorCode.INVALID_PARAMS and "--max_value_size" in e.value.message
            assert "'big'" in e.value.message
            with pytest.raises(MooncakeError) as e:
                c.batch_exist_key([f"k{i}" for i in range(5)])
            assert e.value.code == ErrorCode.INVALID_PARAMS and "--max_batch_keys" in e.value.message
            assert c.batch_exist_key(["a", "b", "c", "d"]) == [False] * 4  # at the limit: served
            assert c.ping().num_keys == 0
    finally:
        m.stop()


def _open(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _probe(s: socket.socket) -> bool:
    """A PROBE on ``s``: True when answered, False when the target closed the connection."""
    try:
        s.sendall(W.Request(W.Op.PROBE, 1).pack())
        hdr = s.recv(W.RESP.size)
    except (ConnectionResetError, BrokenPipeError):
        return False
    return bool(hdr) and W.unpack_response(hdr).status == W.Status.OK


def test_te_rpc_port_bounds_connections_per_peer(python_exe) -> None:
    from mooncake_lab.te_helpers import spawn_peer

    peer = spawn_peer(python_exe, "P2PHANDSHAKE", env=child_env(None, MC_TCP_MAX_CONNS_PER_PEER="4"))
    try:
        held = [_open(peer.rpc_port) for _ in range(4)]
        assert all(_probe(s) for s in held)
        extra = _open(peer.rpc_port)
        assert not _probe(extra), "a fifth connection from the same peer was served"
        extra.close()
        held.pop().close()
        deadline = time.monotonic() + 5
        while True:  # the target notices the close, then a new connection is served again
            s = _open(peer.rpc_port)
            if _probe(s):
                held.append(s)
                break
            s.close()
            assert time.monotonic() < deadline, "a freed connection slot was never reused"
            time.sleep(0.05)
        for s in held:
            s.close()
    finally:
        peer.stop()
