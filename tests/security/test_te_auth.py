"""The Transfer Engine's rpc port with a shared secret: real engine processes over real sockets.

A target started with MOONCAKE_AUTH_TOKEN refuses an initiator without it, or with another one
(clear error on both sides: the initiator's last_error, the target's log), and serves one
that has it -- the P2P handshake (descriptor fetch), a write and a read, over tcp.
"""

from __future__ import annotations

import hashlib
import socket

import numpy as np
import pytest

from mooncake_core.engine import TransferEngine
from mooncake_core.transfer import wire as W

from .conftest import TOKEN, peer_log

pytestmark = pytest.mark.integration


def _engine() -> TransferEngine:
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, e.last_error
    return e


def _write(eng: TransferEngine, peer, data: np.ndarray) -> int:
    assert eng.register_memory(data.ctypes.data, data.nbytes, "cpu:0") == 0
    return eng.transfer_sync_write(peer.segment, data.ctypes.data, peer.addr, data.nbytes)


@pytest.mark.parametrize("mine, reason", [(None, "no token presented"), ("wrong-token", "wrong token")])
def test_initiator_without_the_right_token_is_refused(start_te_peer, monkeypatch, mine, reason) -> None:
    peer = start_te_peer(TOKEN)
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    if mine is not None:
        monkeypatch.setenv("MOONCAKE_AUTH_TOKEN", mine)
    eng = _engine()
    try:
        before = peer.cmd(f"sha 0 {peer.size}")
        data = np.full(4096, 7, dtype=np.uint8)
        assert _write(eng, peer, data) < 0
        assert "authentication failed" in eng.last_error and reason in eng.last_error, eng.last_error
        assert "MOONCAKE_AUTH_TOKEN" in eng.last_error
        assert peer.cmd(f"sha 0 {peer.size}") == before, "the refused write changed the target's memory"
        assert "refused unauthenticated peer" in peer_log(peer) and reason in peer_log(peer)
        assert TOKEN not in peer_log(peer) and (mine is None or mine not in peer_log(peer)), "a token was logged"
    finally:
        eng.close()
    assert peer.proc.poll() is None, "the target died"


def test_initiator_with_the_token_transfers(start_te_peer, monkeypatch) -> None:
    peer = start_te_peer(TOKEN)
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    monkeypatch.setenv("MOONCAKE_AUTH_TOKEN", TOKEN)
    eng = _engine()
    try:
        data = np.random.default_rng(3).integers(0, 256, 64 << 10, dtype=np.uint8)
        assert _write(eng, peer, data) == 0, eng.last_error
        assert peer.cmd(f"sha 0 {data.nbytes}") == hashlib.sha256(data.tobytes()).hexdigest()
        back = np.zeros_like(data)
        assert eng.register_memory(back.ctypes.data, back.nbytes, "cpu:0") == 0
        assert eng.transfer_sync_read(peer.segment, back.ctypes.data, peer.addr, back.nbytes) == 0, eng.last_error
        assert (back == data).all()
    finally:
        eng.close()


def test_raw_peer_without_auth_gets_a_reply_not_a_hang(start_te_peer) -> None:
    """A client of its own (no engine): every op before AUTH is answered UNAUTHORIZED, then closed."""
    peer = start_te_peer(TOKEN)
    for op, length in ((W.Op.GET_DESC, 0), (W.Op.READ, 8), (W.Op.WRITE, 8), (W.Op.NOTIFY, 0)):
        with socket.create_connection(("127.0.0.1", peer.rpc_port), timeout=5) as s:
            s.sendall(W.Request(op, 1, peer.addr, length).pack() + (b"x" * length if op == W.Op.WRITE else b""))
            hdr = b""
            while len(hdr) < W.RESP.size:
                chunk = s.recv(W.RESP.size - len(hdr))
                assert chunk, f"{op.name}: closed without a reply"
                hdr += chunk
            resp = W.unpack_response(hdr)
            assert resp.status == W.Status.UNAUTHORIZED, op.name
            assert s.recv(resp.aux_len + 1 << 10).startswith(b"segment")
            assert s.recv(1) == b"", f"{op.name}: connection left open after the refusal"
    with socket.create_connection(("127.0.0.1", peer.rpc_port), timeout=5) as s:  # still serving
        s.sendall(W.Request(W.Op.AUTH, 2).pack())
        resp = W.unpack_response(s.recv(W.RESP.size))
        assert resp.status == W.Status.OK and resp.aux_len == 16  # a challenge


def test_open_target_accepts_an_initiator_with_a_token(start_te_peer, monkeypatch) -> None:
    """Turning the token on at the clients first is harmless: an open target answers AUTH with nothing."""
    peer = start_te_peer(None)
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    monkeypatch.setenv("MOONCAKE_AUTH_TOKEN", TOKEN)
    eng = _engine()
    try:
        assert _write(eng, peer, np.ones(4096, dtype=np.uint8)) == 0, eng.last_error
    finally:
        eng.close()


def test_random_answers_never_authenticate(start_te_peer, monkeypatch) -> None:
    """Hypothesis-drawn answers to a real challenge (random bytes, the right length, a proof for
    another nonce or another channel) are all refused; the target keeps serving a real engine."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    from mooncake_core import auth

    peer = start_te_peer(TOKEN)
    stale = [b""]

    def exchange(s: socket.socket, op: int, aux: bytes) -> tuple[int, bytes]:
        s.sendall(W.Request(op, 9, aux_len=len(aux)).pack() + aux)
        hdr = b""
        while len(hdr) < W.RESP.size:
            chunk = s.recv(W.RESP.size - len(hdr))
            assert chunk, "closed without a reply"
            hdr += chunk
        resp = W.unpack_response(hdr)
        body = b""
        while len(body) < resp.aux_len:
            body += s.recv(resp.aux_len - len(body))
        return resp.status, body

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(kind=st.sampled_from(["random", "32", "stale", "other-channel", "other-token"]),
           data=st.binary(max_size=64))
    def one(kind: str, data: bytes) -> None:
        with socket.create_connection(("127.0.0.1", peer.rpc_port), timeout=5) as s:
            status, nonce = exchange(s, W.Op.AUTH, b"")
            assert status == W.Status.OK and len(nonce) == auth.NONCE_BYTES
            answer = {"random": data or b"\0", "32": (data * 32)[:32] or b"\1" * 32,
                      "stale": stale[0] or b"\2" * 32,
                      "other-channel": auth.prove(TOKEN, nonce, auth.MASTER_CONTEXT),
                      "other-token": auth.prove(TOKEN + "x", nonce, auth.TE_CONTEXT)}[kind]
            stale[0] = auth.prove(TOKEN, nonce, auth.TE_CONTEXT)  # right for this nonce only
            status, msg = exchange(s, W.Op.AUTH, answer)
            assert status == W.Status.UNAUTHORIZED and b"wrong token" in msg, (kind, status, msg)
            assert s.recv(1) == b""

    one()
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    monkeypatch.setenv("MOONCAKE_AUTH_TOKEN", TOKEN)
    eng = _engine()
    try:
        assert _write(eng, peer, np.ones(4096, dtype=np.uint8)) == 0, eng.last_error
    finally:
        eng.close()
