"""The vectored tcp path (WRITEV / READV) for large batches of small scattered blocks.

Pure encoding / planning / validation helpers are unit-tested without sockets; the wire
path is driven against a real target process (mooncake_lab/te_peer.py) over loopback tcp,
with random data verified by sha256 in the target, and with raw sockets speaking the wire
format directly (out-of-bounds blocks, garbage, truncation, unknown ops).
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
import time

import numpy as np
import pytest
from mooncake_lab.te_helpers import sha

from mooncake_core.transfer import tcp_vec, vec
from mooncake_core.transfer.memory import Region, RegionTable
from mooncake_core.transfer.wire import (MAGIC, REQ, RESP, WIRE_VERSION, Op, Request, Status, WireError,
                                         unpack_response)

MB = 1 << 20
KB = 1 << 10


def _a(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


# ============================================================== pure helpers (milliseconds)
def test_encode_decode_roundtrip():
    rng = np.random.default_rng(1)
    addrs = rng.integers(1, 1 << 48, 700).astype(np.int64)
    lens = rng.integers(0, 70_000, 700).astype(np.int64)
    aux = tcp_vec.encode_blocks(addrs, lens)
    assert len(aux) == 700 * tcp_vec.ENTRY_SIZE
    assert struct.unpack_from("<QQ", aux, 16) == (int(addrs[1]), int(lens[1]))
    a2, l2 = tcp_vec.decode_blocks(aux, int(lens.sum()))
    assert a2.tolist() == addrs.tolist() and l2.tolist() == lens.tolist()


@pytest.mark.parametrize("aux,total,what", [
    (b"", 0, "multiple of 16"),
    (b"\1" * 17, 1, "multiple of 16"),
    (tcp_vec.encode_blocks(_a(*range(1, 1027)), _a(*[1] * 1026)), 1026, "1026 blocks"),
    (tcp_vec.encode_blocks(_a(4096, 8192), _a(10, 20)), 31, "add up to 30"),
    (tcp_vec.encode_blocks(_a(4096), _a(10)), tcp_vec.MAX_BYTES + 1, "payload bytes"),
])
def test_decode_refuses_malformed_lists(aux, total, what):
    with pytest.raises(WireError, match=what):
        tcp_vec.decode_blocks(aux, total)


def test_decode_refuses_a_length_beyond_the_limit_without_overflow():
    aux = struct.pack("<QQQQ", 4096, (1 << 64) - 1, 8192, 1)
    with pytest.raises(WireError, match="add up to"):
        tcp_vec.decode_blocks(aux, 0)


def test_first_bad_agrees_with_region_table():
    table = RegionTable()
    for addr, n in ((1000, 100), (1100, 50), (5000, 64)):  # two adjacent regions: no spanning
        table.add(Region(addr, n))
    starts, ends = vec.region_index(table.regions())
    rng = np.random.default_rng(2)
    addrs = rng.integers(900, 5200, 3000).astype(np.int64)
    lens = rng.integers(1, 120, 3000).astype(np.int64)
    for a, n in zip(addrs.tolist(), lens.tolist()):
        got = tcp_vec.first_bad(starts, ends, _a(a), _a(n))
        assert (got is None) == table.contains(a, n), (a, n)
    ok = _a(1000, 1100, 5000, 1099)
    assert tcp_vec.first_bad(starts, ends, ok, _a(100, 50, 64, 1)) is None
    assert tcp_vec.first_bad(starts, ends, ok, _a(100, 50, 65, 2)) == 2  # first bad, not the last
    assert tcp_vec.first_bad(starts, ends, _a(1 << 62, 1000), _a(1, 1)) == 0  # beyond any user address
    assert tcp_vec.first_bad(starts, ends, _a(1, 1000), _a(0, 1)) is None  # empty blocks are harmless
    e = np.array([], dtype=np.int64)
    assert tcp_vec.first_bad(e, e, _a(1000), _a(1)) == 0


def test_runs_merge_only_contiguous_neighbours():
    def runs(a, n):
        x, y = tcp_vec.runs(a, n)
        return x.tolist(), y.tolist()

    assert runs(_a(100, 116, 132, 500, 400, 408), _a(16, 16, 0, 8, 8, 8)) == ([100, 500, 400], [32, 8, 16])
    assert runs(_a(7), _a(3)) == ([7], [3])
    assert runs(_a(), _a()) == ([], [])
    assert runs(_a(7, 10), _a(3, 0)) == ([7], [3])


@pytest.mark.parametrize("seed", range(4))
def test_plan_requests_covers_the_batch_in_order(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5000))
    length = rng.integers(0, 300_000, n).astype(np.int64)
    local = rng.integers(1, 1 << 40, n).astype(np.int64)
    remote = rng.integers(0, 1 << 40, n).astype(np.int64)
    plan = tcp_vec.plan_requests(local, remote, length, max_blocks=100, max_bytes=1 << 20)
    assert plan.bounds[0] == 0 and plan.bounds[-1] == len(plan.length)
    assert sum(plan.nbytes) == int(length.sum()) == int(plan.length.sum())
    assert (plan.length > 0).all() and int(plan.length.max()) <= 1 << 20
    for k in range(len(plan.nbytes)):
        a, b = plan.bounds[k], plan.bounds[k + 1]
        assert 0 < b - a <= 100
        assert plan.nbytes[k] == int(plan.length[a:b].sum()) < 2 << 20
    # every byte of every non-empty entry appears once, in order
    keep = length > 0
    starts = np.flatnonzero(np.concatenate(([True], plan.local[1:] != plan.local[:-1] + plan.length[:-1])))
    assert len(starts) <= keep.sum()
    assert plan.local[0] == local[keep][0] and plan.remote[-1] + plan.length[-1] == \
        remote[keep][-1] + length[keep][-1]


# ============================================================== iovec socket I/O (socketpair)
def _scatter(rng: np.random.Generator, buf: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n disjoint unaligned ranges of ``buf`` (some empty), in shuffled order."""
    lens = rng.integers(0, 3000, n).astype(np.int64)
    offs = np.cumsum(lens + rng.integers(0, 9, n)) - lens
    assert offs[-1] + lens[-1] <= buf.nbytes
    order = rng.permutation(n)
    return (buf.ctypes.data + offs[order]).astype(np.int64), lens[order]


def test_split_at_cuts_the_stream_exactly():
    from mooncake_core.transfer.iov import iov_array, split_at

    iov = iov_array(_a(1000, 2000, 3000), _a(10, 20, 30))
    for cut in range(1, 60):
        head, tail = split_at(iov.copy(), cut)
        assert int(head[:, 1].sum()) == cut and int(tail[:, 1].sum()) == 60 - cut
        stream = [int(b) + i for b, n in iov.tolist() for i in range(n)]
        got = [int(b) + i for part in (head, tail) for b, n in part.tolist() for i in range(n)]
        assert got == stream, cut
    head, tail = split_at(iov.copy(), 60)
    assert int(head[:, 1].sum()) == 60 and int(tail[:, 1].sum()) == 0


@pytest.mark.parametrize("lowat,bufsize", [(0, 16 * KB), (4 * KB, 16 * KB), (64 * KB, 16 * KB), (MB, 0)])
def test_iov_send_and_recv_scatter_gather_across_iov_max_and_partial_progress(lowat, bufsize):
    """Also with a receive low-water mark (MC_TCP_RCVLOWAT), even one larger than the socket's
    locked receive buffer: every byte lands in place and nothing waits for bytes never sent."""
    from mooncake_core.transfer.iov import iov_array, recv_iov, send_iov
    from mooncake_core.transfer.sockio import set_kernel_timeouts

    rng = np.random.default_rng(30)
    src = rng.integers(0, 256, 8 * MB, dtype=np.uint8)
    dst = np.zeros(8 * MB, dtype=np.uint8)
    n = 2500  # > IOV_MAX: several calls, windows advanced within the array
    sa, sl = _scatter(rng, src, n)
    da, _ = _scatter(rng, dst, n)
    da_lens = sl.copy()  # same lengths on both sides, different layouts
    head = np.frombuffer(b"HEAD", dtype=np.uint8)
    a, b = socket.socketpair()
    for s_ in (a, b):  # small buffers: sends and receives make partial progress
        if bufsize:
            s_.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, bufsize)
            s_.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, bufsize)
        set_kernel_timeouts(s_, 10)
    err: list = []
    th = threading.Thread(target=lambda: send_iov(a, iov_array(sa, sl, head=(head.ctypes.data, 4))))
    th.start()
    got_head = np.zeros(4, dtype=np.uint8)
    try:
        recv_iov(b, iov_array(np.concatenate(([got_head.ctypes.data], da)), np.concatenate(([4], da_lens))),
                 time.monotonic() + 10, lowat)
    except Exception as e:  # noqa: BLE001 - reported below, after the sender is joined
        err.append(e)
    th.join(10)
    assert not err and not th.is_alive()
    assert got_head.tobytes() == b"HEAD"
    base_s, base_d = src.ctypes.data, dst.ctypes.data
    want = np.zeros_like(dst)
    for x, y, ln in zip((sa - base_s).tolist(), (da - base_d).tolist(), sl.tolist()):
        want[y:y + ln] = src[x:x + ln]
    assert sha(dst) == sha(want) and int(sl.sum()) > MB
    assert b.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1  # the next message is not held back
    a.close()
    b.close()


def test_iov_recv_times_out_and_reports_a_closed_peer():
    from mooncake_core.transfer.iov import iov_array, recv_iov
    from mooncake_core.transfer.sockio import (
        PeerClosed,
        is_timeout,
        set_kernel_timeouts,
    )

    dst = np.zeros(1000, dtype=np.uint8)
    a, b = socket.socketpair()
    set_kernel_timeouts(b, 0.2)
    t0 = time.monotonic()
    with pytest.raises(OSError) as ei:
        recv_iov(b, iov_array(_a(dst.ctypes.data), _a(1000)))
    assert is_timeout(ei.value) and time.monotonic() - t0 < 2
    a.sendall(b"x" * 300)
    a.close()
    with pytest.raises(PeerClosed, match="700 bytes"):
        recv_iov(b, iov_array(_a(dst.ctypes.data, dst.ctypes.data + 500), _a(500, 500)))
    assert dst[:300].tobytes() == b"x" * 300
    b.close()
    with pytest.raises(ValueError, match="uint64"):
        recv_iov(b, np.zeros((1, 2), dtype=np.int64))


# ============================================================== real processes, real sockets
def _layout(rng: np.random.Generator, n: int, space: int, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """n non-overlapping (offset, length) pairs inside ``space`` bytes, lengths 1..max_len,
    unaligned offsets, in shuffled order (scattered)."""
    # log-uniform: as many 1..64-byte blocks as 1..64 KiB ones; the largest exactly max_len
    lens = np.exp(rng.uniform(0, np.log(max_len), n)).astype(np.int64).clip(1, max_len)
    lens[0], lens[1] = 1, max_len
    gaps = rng.integers(0, 40, n).astype(np.int64)
    offs = np.cumsum(gaps + lens) - lens
    assert offs[-1] + lens[-1] <= space, "layout does not fit"
    order = rng.permutation(n)
    return offs[order], lens[order]


@pytest.fixture
def force_tcp(monkeypatch):
    monkeypatch.setenv("MC_FORCE_TCP", "1")


@pytest.mark.integration
@pytest.mark.parametrize("rcvlowat", ["0", str(MB)])
def test_many_block_write_then_read_verified(rcvlowat, monkeypatch, force_tcp, start_peer, engine_factory):
    """With MC_TCP_RCVLOWAT off and on (the default) at both ends: WRITEV payloads at the
    target, READV replies here."""
    monkeypatch.setenv("MC_TCP_RCVLOWAT", rcvlowat)
    size = 32 * MB
    peer = start_peer("P2PHANDSHAKE", size=size, seed=11)
    eng = engine_factory("P2PHANDSHAKE")
    rng = np.random.default_rng(12)
    n = 3000
    offs, lens = _layout(rng, n, size, 64 * KB)
    src = rng.integers(0, 256, int(lens.sum()) + 4 * KB, dtype=np.uint8)
    assert eng.register_memory(src.ctypes.data, src.nbytes) == 0
    loffs = np.cumsum(lens) - lens + 3  # contiguous, unaligned source ranges
    rc = eng.batch_transfer_sync_write(peer.segment, (src.ctypes.data + loffs).tolist(),
                                       (peer.addr + offs).tolist(), lens.tolist())
    assert rc == 0, eng.last_error
    assert eng.transport_for(peer.segment) == "tcp"
    expect = peer.expected()
    for o, lo, ln in zip(offs.tolist(), loffs.tolist(), lens.tolist()):
        expect[o:o + ln] = src[lo:lo + ln]
    assert peer.sha(0, size) == sha(expect)

    # read back, scattered into a second buffer in another order, with duplicate sources
    m = 4000
    pick = rng.integers(0, n, m)  # duplicates: the same remote block read into several places
    back = np.zeros(int(lens[pick].sum()) + 1, dtype=np.uint8)
    assert eng.register_memory(back.ctypes.data, back.nbytes) == 0
    boffs = np.cumsum(lens[pick]) - lens[pick] + 1
    perm = rng.permutation(m)  # local destinations not in stream order either
    dst = (back.ctypes.data + boffs[perm])
    rc = eng.batch_transfer_sync_read(peer.segment, dst.tolist(), (peer.addr + offs[pick[perm]]).tolist(),
                                      lens[pick[perm]].tolist())
    assert rc == 0, eng.last_error
    want = np.zeros_like(back)
    for j, i in enumerate(pick.tolist()):
        want[boffs[j]:boffs[j] + lens[i]] = expect[offs[i]:offs[i] + lens[i]]
    assert sha(back) == sha(want)


@pytest.mark.integration
def test_async_vectored_batches_and_tcp_hint(start_peer, engine_factory):
    size = 8 * MB
    peer = start_peer("P2PHANDSHAKE", size=size, seed=13)
    eng = engine_factory("P2PHANDSHAKE")
    rng = np.random.default_rng(14)
    n = 2048
    blk = 4 * KB
    src = rng.integers(0, 256, n * blk, dtype=np.uint8)
    assert eng.register_memory(src.ctypes.data, src.nbytes) == 0
    perm = rng.permutation(n)
    bufs = (src.ctypes.data + np.arange(n) * blk).tolist()
    dsts = (peer.addr + perm * blk).tolist()
    bid = eng.batch_transfer_async_write(peer.segment, bufs, dsts, [blk] * n, "tcp")
    assert bid > 0
    t0 = time.monotonic()
    while (st := eng.transfer_check_status(bid)) == 0 and time.monotonic() - t0 < 20:
        time.sleep(0.002)
    assert st == 1, eng.last_error
    expect = peer.expected()
    expect.reshape(-1, blk)[perm] = src.reshape(n, blk)
    assert peer.sha(0, size) == sha(expect)
    back = np.zeros_like(src)
    assert eng.register_memory(back.ctypes.data, back.nbytes) == 0
    bid = eng.batch_transfer_async_read(peer.segment, (back.ctypes.data + np.arange(n) * blk).tolist(),
                                        dsts, [blk] * n, "tcp")
    t0 = time.monotonic()
    while (st := eng.transfer_check_status(bid)) == 0 and time.monotonic() - t0 < 20:
        time.sleep(0.002)
    assert st == 1, eng.last_error
    assert sha(back) == sha(src)


@pytest.mark.integration
def test_batch_with_an_out_of_bounds_block_fails_whole(force_tcp, start_peer, engine_factory):
    size = 4 * MB
    peer = start_peer("P2PHANDSHAKE", size=size, seed=15)
    eng = engine_factory("P2PHANDSHAKE")
    rng = np.random.default_rng(16)
    n = 500
    src = rng.integers(0, 256, n * 4 * KB, dtype=np.uint8)
    assert eng.register_memory(src.ctypes.data, src.nbytes) == 0
    before = peer.sha(0, size)
    bufs = (src.ctypes.data + np.arange(n) * 4 * KB).tolist()
    dsts = (peer.addr + rng.permutation(n) * 4 * KB).tolist()
    bad = peer.addr + size - 100  # straddles the end of the region
    dsts[321] = bad
    assert eng.batch_transfer_sync_write(peer.segment, bufs, dsts, [4 * KB] * n) == -1
    assert f"{bad:#x}" in eng.last_error and "outside" in eng.last_error
    local_before = sha(src)
    assert eng.batch_transfer_sync_read(peer.segment, bufs, dsts, [4 * KB] * n) == -1
    assert f"{bad:#x}" in eng.last_error
    assert peer.sha(0, size) == before == sha(peer.expected())
    assert sha(src) == local_before


# ---------------------------------------------------------------- raw wire (target side)
def _recv_exact(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def _dropped(s: socket.socket) -> bool:
    try:
        return s.recv(100) == b""
    except ConnectionResetError:
        return True


def _vreq(op: Op, rid: int, addrs: list[int], lens: list[int]) -> bytes:
    aux = tcp_vec.encode_blocks(np.array(addrs, dtype=np.int64), np.array(lens, dtype=np.int64))
    return REQ.pack(MAGIC, WIRE_VERSION, op, 0, rid, 0, sum(lens), len(aux), 0) + aux


def _resp(s: socket.socket):
    r = unpack_response(_recv_exact(s, RESP.size))
    return r, _recv_exact(s, r.aux_len)


def _probe(s: socket.socket, rid: int) -> None:
    s.sendall(Request(Op.PROBE, rid).pack())
    r, _ = _resp(s)
    assert r.status == Status.OK and r.req_id == rid


@pytest.mark.integration
def test_raw_vectored_requests_validated_by_the_target(start_peer):
    size = MB
    peer = start_peer("P2PHANDSHAKE", size=size, seed=17)
    expect = peer.expected()
    rng = np.random.default_rng(18)
    s = socket.create_connection(("127.0.0.1", peer.rpc_port), timeout=10)
    # a valid WRITEV of scattered unaligned blocks (two of them contiguous remotely)
    addrs = [peer.addr + 5, peer.addr + 70_001, peer.addr + 70_001 + 999, peer.addr + size - 7]
    lens = [1, 999, 4096, 7]
    payload = rng.integers(0, 256, sum(lens), dtype=np.uint8).tobytes()
    s.sendall(_vreq(Op.WRITEV, 1, addrs, lens) + payload)
    r, _ = _resp(s)
    assert (r.status, r.req_id) == (Status.OK, 1)
    off = 0
    for a, n in zip(addrs, lens):
        expect[a - peer.addr:a - peer.addr + n] = np.frombuffer(payload[off:off + n], dtype=np.uint8)
        off += n
    assert peer.sha(0, size) == sha(expect)
    # READV gathers them back (a block twice)
    s.sendall(_vreq(Op.READV, 2, addrs + addrs[:1], lens + lens[:1]))
    r, _ = _resp(s)
    assert (r.status, r.length) == (Status.OK, sum(lens) + 1)
    assert _recv_exact(s, r.length) == payload + payload[:1]
    # a WRITEV with one bad block among good ones: refused whole, payload drained, memory unchanged
    bad_addrs = [peer.addr, peer.addr + 100, peer.addr + size - 10, peer.addr + 5000]
    bad_lens = [300, 300, 11, 300]
    s.sendall(_vreq(Op.WRITEV, 3, bad_addrs, bad_lens) + os.urandom(sum(bad_lens)))
    r, msg = _resp(s)
    assert (r.status, r.req_id) == (Status.OUT_OF_BOUNDS, 3)
    text = msg.decode()
    assert f"{peer.addr + size - 10:#x}" in text and "block 2 of 4" in text and "11 bytes" in text
    # a READV with a block before the region: refused, no payload leaks
    s.sendall(_vreq(Op.READV, 4, [peer.addr, peer.addr - 64], [10, 128]))
    r, msg = _resp(s)
    assert (r.status, r.length) == (Status.OUT_OF_BOUNDS, 0) and b"block 1 of 2" in msg
    _probe(s, 5)  # same connection still in sync
    s.close()
    assert peer.sha(0, size) == sha(expect)


@pytest.mark.integration
def test_raw_garbage_vectored_requests_close_only_that_connection(start_peer):
    peer = start_peer("P2PHANDSHAKE", size=MB, seed=19)
    before = peer.sha(0, MB)
    port = peer.rpc_port
    keeper = socket.create_connection(("127.0.0.1", port), timeout=10)  # an innocent bystander
    _probe(keeper, 1)
    cases = [
        # block list not a multiple of 16 bytes
        REQ.pack(MAGIC, WIRE_VERSION, Op.WRITEV, 0, 1, 0, 8, 15, 0) + b"\1" * 15 + b"\2" * 8,
        # lengths do not add up to the header's payload length
        REQ.pack(MAGIC, WIRE_VERSION, Op.WRITEV, 0, 2, 0, 50, 16, 0)
        + tcp_vec.encode_blocks(_a(peer.addr), _a(100)) + b"x" * 50,
        # too many blocks
        _vreq(Op.READV, 3, [peer.addr] * 1100, [1] * 1100),
        # an empty block list
        REQ.pack(MAGIC, WIRE_VERSION, Op.READV, 0, 4, 0, 0, 0, 0),
    ]
    for raw in cases:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(raw)
        assert _dropped(s)
        s.close()
    # truncated: the header and half the block list, then the peer goes away
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(_vreq(Op.WRITEV, 5, [peer.addr, peer.addr + 100], [10, 10])[:REQ.size + 20])
    s.close()
    # truncated payload of a valid WRITEV
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(_vreq(Op.WRITEV, 6, [peer.addr, peer.addr + 4096], [2000, 2000]) + b"z" * 1000)
    s.close()
    # an op this release does not know gets a clear answer naming it, then the connection closes
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(REQ.pack(MAGIC, WIRE_VERSION, 99, 0, 7, 0, 0, 0, 0))
    r, msg = _resp(s)
    assert r.status == Status.BAD_REQUEST and r.req_id == 7
    assert b"unknown op 99" in msg and b"WRITEV" in msg
    assert _dropped(s)
    s.close()
    _probe(keeper, 2)  # the other connection never noticed
    keeper.close()
    # a fresh connection is served, and the truncated WRITEV left no partial block behind it
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    _probe(s, 3)
    s.close()
    time.sleep(0.05)
    after = peer.sha(0, MB)
    exp = peer.expected()
    # the valid-but-truncated WRITEV may have landed its first 1000 bytes before the peer
    # vanished (bytes are received straight into memory); nothing else may have changed
    exp2 = exp.copy()
    exp2[:1000] = ord("z")
    assert after in (before, sha(exp2)) and before == sha(exp)
    assert peer.sha(4096, MB - 4096) == sha(exp[4096:])


@pytest.mark.integration
def test_peer_killed_mid_vectored_batch_fails_fast(monkeypatch, force_tcp, start_peer, engine_factory):
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "3")
    size = 64 * MB
    peer = start_peer("P2PHANDSHAKE", size=size, seed=21)
    eng = engine_factory("P2PHANDSHAKE")
    blk = 16 * KB
    n = size // blk
    src = np.random.default_rng(22).integers(0, 256, size, dtype=np.uint8)
    assert eng.register_memory(src.ctypes.data, size) == 0
    assert eng.send_probe(peer.segment) == 0
    bufs = (src.ctypes.data + np.arange(n) * blk).tolist()
    dsts = (peer.addr + np.random.default_rng(23).permutation(n) * blk).tolist()
    assert eng.batch_transfer_sync_write(peer.segment, bufs[:256], dsts[:256], [blk] * 256) == 0  # warm
    os.kill(peer.pid, signal.SIGSTOP)  # hung mid-batch: sends stall once socket buffers fill ...
    result: dict = {}

    def run() -> None:
        t0 = time.monotonic()
        result["rc"] = eng.batch_transfer_sync_write(peer.segment, bufs, dsts, [blk] * n)
        result["took"] = time.monotonic() - t0

    th = threading.Thread(target=run)
    th.start()
    time.sleep(0.5)
    assert th.is_alive()
    os.kill(peer.pid, signal.SIGKILL)  # ... then it dies: the batch fails on the reset, not the timeout
    peer.proc.wait()
    th.join(10)
    assert not th.is_alive()
    assert result["rc"] == -1
    assert result["took"] < 3.0 + 0.5 + 1.5, result
    assert eng.last_error
    t0 = time.monotonic()  # and the dead peer keeps failing fast
    assert eng.batch_transfer_sync_read(peer.segment, bufs[:512], dsts[:512], [blk] * 512) == -1
    assert time.monotonic() - t0 < 4.0


@pytest.mark.integration
def test_hung_peer_vectored_batch_times_out(monkeypatch, force_tcp, start_peer, engine_factory):
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "1.5")
    size = 32 * MB
    peer = start_peer("P2PHANDSHAKE", size=size, seed=24)
    eng = engine_factory("P2PHANDSHAKE")
    blk = 8 * KB
    n = size // blk
    buf = np.random.default_rng(25).integers(0, 256, size, dtype=np.uint8)
    assert eng.register_memory(buf.ctypes.data, size) == 0
    assert eng.send_probe(peer.segment) == 0
    dsts = (peer.addr + np.random.default_rng(26).permutation(n) * blk).tolist()
    os.kill(peer.pid, signal.SIGSTOP)
    try:
        for op in (eng.batch_transfer_sync_write, eng.batch_transfer_sync_read):
            t0 = time.monotonic()
            rc = op(peer.segment, (buf.ctypes.data + np.arange(n) * blk).tolist(), dsts, [blk] * n)
            took = time.monotonic() - t0
            assert rc == -1
            assert took < 6.0, took
    finally:
        os.kill(peer.pid, signal.SIGCONT)


# ---------------------------------------------------------------- busy polling (4 KiB path)
def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_busy_poll_env_is_validated(monkeypatch):
    from mooncake_core.transfer.sockio import DEFAULT_BUSY_POLL_US, busy_poll_s

    monkeypatch.delenv("MC_TCP_BUSY_POLL_US", raising=False)
    assert busy_poll_s() == DEFAULT_BUSY_POLL_US / 1e6
    monkeypatch.setenv("MC_TCP_BUSY_POLL_US", "0")
    assert busy_poll_s() == 0
    for bad in ("-5", "fast", "1.5"):
        monkeypatch.setenv("MC_TCP_BUSY_POLL_US", bad)
        with pytest.raises(ValueError, match="MC_TCP_BUSY_POLL_US"):
            busy_poll_s()


def test_poller_backs_off_after_polls_that_find_nothing():
    from mooncake_core.transfer.sockio import Poller

    a, b = socket.socketpair()
    view = memoryview(bytearray(16))
    p = Poller(0.0002)
    assert p.recv_into(b, view, 16) is None  # nothing there: polled 200 us, a miss ...
    a.sendall(b"0123")
    assert p.recv_into(b, view, 16) is None  # ... so the next wait does not poll (caller blocks)
    assert p.recv_into(b, view, 16) == 4 and bytes(view[:4]) == b"0123"  # polling again, a hit
    assert p.recv_into(b, view, 16) is None  # miss: skip 1
    assert p.recv_into(b, view, 16) is None
    assert p.recv_into(b, view, 16) is None  # miss again: skip 3
    for _ in range(3):
        a.sendall(b"x")
        assert p.recv_into(b, view, 16) is None
    assert p.recv_into(b, view, 16) == 3  # back to polling
    assert Poller(0).recv_into(b, view, 16) is None  # MC_TCP_BUSY_POLL_US=0: never polls
    a.sendall(b"y")
    assert Poller(0).recv_into(b, view, 16) is None
    a.close()
    b.close()


def test_a_hit_clears_the_waits_still_to_be_skipped():
    """A connection whose first poll missed (a loaded box) and whose caller then records a hit
    polls at once again: the hit resets the whole back-off, not only the miss count (the store
    master test that records a hit after its warm-up call relies on it)."""
    from mooncake_core.utils.busypoll import Poller

    p = Poller(0.0002)
    p.record(False)
    p.record(False)  # skip 3
    p.record(True)
    assert p.should_poll()


@pytest.mark.integration
@pytest.mark.parametrize("poll_us", ["200", "0"])
def test_busy_poll_answers_small_requests_and_idles_without_cpu(poll_us, monkeypatch, force_tcp,
                                                                start_peer, engine_factory):
    """Polling only follows traffic: after a burst of 4 KiB round trips, neither the initiator
    nor the target spends CPU while idle (a poll that never stopped would burn a core)."""
    monkeypatch.setenv("MC_TCP_BUSY_POLL_US", poll_us)
    peer = start_peer("P2PHANDSHAKE", size=MB, seed=27, env={"MC_TCP_BUSY_POLL_US": poll_us})
    eng = engine_factory("P2PHANDSHAKE")
    buf = np.random.default_rng(28).integers(0, 256, MB, dtype=np.uint8)
    assert eng.register_memory(buf.ctypes.data, MB) == 0
    for i in range(300):
        off = (i * 4096) % MB
        assert eng.transfer_sync_write(peer.segment, buf.ctypes.data + off, peer.addr + off, 4096) == 0
        assert eng.transfer_sync_read(peer.segment, buf.ctypes.data + off, peer.addr + off, 4096) == 0
    assert peer.sha(0, MB) == sha(buf)
    time.sleep(0.1)
    mine, theirs = os.times(), _cpu_s(peer.pid)
    time.sleep(1.0)
    now = os.times()
    used_here = now.user + now.system - mine.user - mine.system
    used_there = _cpu_s(peer.pid) - theirs
    assert used_here < 0.15 and used_there < 0.15, (used_here, used_there)
