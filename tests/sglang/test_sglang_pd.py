"""SGLang's own Mooncake PD backend (bootstrap server, MooncakeKVManager, sender, receiver, ZMQ
control messages) running on our Transfer Engine, prefill and decode in separate processes."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from .conftest import HERE, listen_port, sglang_env

pytestmark = pytest.mark.integration
PEER = os.path.join(HERE, "peer_pd.py")

LAYERS, PAGES, PAGE_BYTES = 3, 24, 4096
# two requests (rooms) at once; each moves chosen prefill pages to chosen, different decode pages
ROOMS = [101, 202]
SRC = [[1, 5, 9, 10, 23, 0], [3, 4, 17]]
DST = [[30 % PAGES, 2, 7, 11, 12, 19], [0, 22, 8]]
AUX = [(1, 2), (3, 0)]  # (prefill metadata row, decode metadata row)


def _common_args(bport: int) -> list[str]:
    return ["--bootstrap-port", str(bport), "--rooms", ",".join(map(str, ROOMS)),
            "--layers", str(LAYERS), "--pages", str(PAGES), "--page-bytes", str(PAGE_BYTES),
            "--pages-map", ";".join(f"{','.join(map(str, s))}:{','.join(map(str, d))}" for s, d in zip(SRC, DST)),
            "--aux-map", ";".join(f"{p}:{d}" for p, d in AUX)]


def _arrays(path: str) -> list[np.ndarray]:
    with np.load(path) as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


@pytest.mark.parametrize("backend", ["mooncake", "mooncake_tcp"])
def test_pd_handoff_byte_exact(backend, sglang_python, peers, tmp_path):
    """``--disaggregation-transfer-backend mooncake`` (engine picks the same-host transport) and
    ``mooncake_tcp`` (SGLang sets MC_FORCE_TCP=1: our tcp transport)."""
    bport = listen_port()
    env = sglang_env()
    p_out, d_out = str(tmp_path / "prefill.npz"), str(tmp_path / "decode.npz")
    prefill = peers([sglang_python, PEER, "--role", "prefill", "--backend", backend, *_common_args(bport),
                     "--chunks", "2", "--seed", "11", "--out", p_out, "--deadline", "90"], env, "prefill")
    decode = peers([sglang_python, PEER, "--role", "decode", "--backend", backend, *_common_args(bport),
                    "--seed", "22", "--out", d_out, "--deadline", "90"], env, "decode")
    for peer in (prefill, decode):
        ev = peer.wait_event("imported", 120)
        assert ev["engine_module"] == "mooncake_core.engine", ev  # SGLang's `mooncake.engine` is ours
    d_res = decode.wait_event("result", 120)
    p_res = prefill.wait_event("result", 60)
    assert d_res["ok"], (d_res, decode.tail())
    assert p_res["ok"], (p_res, prefill.tail())
    # MOONCAKE_PROTOCOL is unset, so SGLang asked for rdma: our engine fell back to a same-host transport
    assert p_res["transports"] and set(p_res["transports"].values()) <= {"cma", "tcp"}, p_res
    if backend == "mooncake_tcp":
        assert set(p_res["transports"].values()) == {"tcp"}, p_res
    assert prefill.proc.wait(timeout=30) == 0 and decode.proc.wait(timeout=30) == 0

    assert_pages_moved(p_out, d_out)


def assert_pages_moved(p_out: str, d_out: str) -> None:
    """The decode's buffers (saved by peer_pd.py) hold exactly the prefill pages / metadata rows
    of SRC/DST/AUX and their own bytes everywhere else. Shared with tests/nixl."""
    src, dst, before = _arrays(p_out), _arrays(d_out), _arrays(d_out + ".before.npz")
    n_kv = 2 * LAYERS
    moved = {d: s for room_src, room_dst in zip(SRC, DST) for s, d in zip(room_src, room_dst)}
    for b in range(n_kv):
        s = src[b].reshape(PAGES, PAGE_BYTES)
        d = dst[b].reshape(PAGES, PAGE_BYTES)
        d0 = before[b].reshape(PAGES, PAGE_BYTES)
        assert not np.array_equal(s, d0)  # random fills differ, so a copy is visible
        for page in range(PAGES):
            want = s[moved[page]] if page in moved else d0[page]
            assert np.array_equal(d[page], want), f"kv buffer {b} decode page {page}"
    # aux (metadata) buffers: the prefill row of each request lands in its decode row, nothing else moves
    for b in range(n_kv, len(src)):
        s, d, d0 = (x.reshape(8, -1) for x in (src[b], dst[b], before[b]))
        aux_moved = {dr: pr for pr, dr in AUX}
        assert not np.array_equal(s, d0)
        for row in range(8):
            want = s[aux_moved[row]] if row in aux_moved else d0[row]
            assert np.array_equal(d[row], want), f"aux buffer {b - n_kv} decode row {row}"


def test_prefill_killed_mid_transfer_fails_decode(sglang_python, peers, tmp_path):
    """Prefill sends the first of two chunks and is SIGKILLed: decode must reach KVPoll.Failed with
    a clear reason (SGLang's heartbeat), not hang."""
    bport = listen_port()
    env = sglang_env()
    prefill = peers([sglang_python, PEER, "--role", "prefill", *_common_args(bport), "--chunks", "2",
                     "--hold-after", "1", "--seed", "11", "--deadline", "90"], env, "prefill")
    decode = peers([sglang_python, PEER, "--role", "decode", *_common_args(bport),
                    "--seed", "22", "--deadline", "90"], env, "decode")
    prefill.wait_event("hold", 150)
    t_kill = time.time()
    prefill.kill()
    res = decode.wait_event("result", 60)
    assert res["ok"] is False, res
    errors = " | ".join(res["errors"])
    assert "KVTransferError" in errors and "Lost connection with prefill instance" in errors, errors
    assert f"127.0.0.1:{bport}" in errors, errors  # names the peer
    # heartbeat 2 s x 2 failures (+ HTTP timeouts); generous for a loaded 2-core box
    assert res["t_fail"] - t_kill < 30, res["t_fail"] - t_kill
    assert decode.proc.wait(timeout=30) == 1


def test_decode_killed_before_transfer_fails_prefill(sglang_python, peers):
    """Decode publishes its pages, then dies: the prefill's write to the dead segment fails fast
    through our engine and SGLang marks the request Failed (no hang, no retry loop)."""
    bport = listen_port()
    env = sglang_env()
    prefill = peers([sglang_python, PEER, "--role", "prefill", *_common_args(bport), "--delay-send", "2",
                     "--seed", "11", "--deadline", "90"], env, "prefill")
    decode = peers([sglang_python, PEER, "--role", "decode", *_common_args(bport),
                    "--seed", "22", "--deadline", "90"], env, "decode")
    decode.wait_event("metadata_sent", 150)
    # Kill only once the prefill holds the decode's page list (KVPoll.WaitingForInput): a ZMQ
    # message still queued in the decode's I/O thread would die with it, leaving the prefill
    # waiting for metadata that never comes -- a different scenario from the one tested here.
    prefill.wait_event("delaying", 150)
    decode.kill()
    t_kill = time.time()
    res = prefill.wait_event("result", 60)
    assert res["ok"] is False, res
    errors = " | ".join(res["errors"])
    assert "KVTransferError" in errors and "Failed to send kv chunk" in errors, errors
    assert res["t_fail"] - t_kill < 30, res["t_fail"] - t_kill
    assert prefill.proc.wait(timeout=30) == 1
