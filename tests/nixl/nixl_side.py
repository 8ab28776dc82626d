"""Runs inside a framework venv that has nixl 1.5.1: the NIXL side of the tests in this folder.

    python nixl_side.py SCENARIO     one-process scenario (two agents in this process); prints one
                                     JSON line of observations, which the pytest side asserts on
    python nixl_side.py target       two-process peer roles: talk over stdin/stdout, metadata as
    python nixl_side.py initiator    hex lines ("META <hex>"), observations as JSON lines

Observations are computed here from real buffers (sha256 of the bytes each side holds), so a
test fails when bytes are wrong, missing or late. Only numpy is used (no torch).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import numpy as np
from nixl._api import nixl_agent, nixl_agent_config

BACKEND = "MooncakeCore"
REGION = 4 << 20
WAIT_S = 30.0


def agent(name: str) -> nixl_agent:
    return nixl_agent(name, nixl_agent_config(backends=[BACKEND]))


def sha(b) -> str:
    return hashlib.sha256(memoryview(b).cast("B")).hexdigest()


def region(seed: int | None, size: int = REGION) -> np.ndarray:
    if seed is None:
        return np.zeros(size, dtype=np.uint8)
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def register(a: nixl_agent, buf: np.ndarray):
    return a.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")


def scatter(seed: int, n: int, size: int = REGION, max_len: int = 32 << 10) -> list[tuple[int, int]]:
    """n non-overlapping (offset, length) pieces inside [0, size), in random order."""
    rng = np.random.default_rng(seed)
    slot = size // n
    lens = rng.integers(1, min(max_len, slot) + 1, n)
    offs = [i * slot + int(rng.integers(0, slot - lens[i] + 1)) for i in range(n)]
    order = rng.permutation(n)
    return [(offs[i], int(lens[i])) for i in order]


def descs(a: nixl_agent, base: int, pieces: list[tuple[int, int]]):
    return a.get_xfer_descs([(base + o, n, 0) for o, n in pieces], "DRAM")


def gather(buf: np.ndarray, pieces: list[tuple[int, int]]) -> bytes:
    return b"".join(buf[o:o + n].tobytes() for o, n in pieces)


def wait_state(a: nixl_agent, h, timeout: float = WAIT_S) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            st = a.check_xfer_state(h)
        except Exception as e:  # noqa: BLE001 - NIXL raises on an error status; its name is the observation
            return f"ERR:{type(e).__name__}"
        if st != "PROC" or time.monotonic() > deadline:
            return st
        time.sleep(0.0005)


def wait_notif(a: nixl_agent, timeout: float = WAIT_S, want: int = 1) -> dict[str, list[bytes]]:
    got: dict[str, list[bytes]] = {}
    deadline = time.monotonic() + timeout
    while sum(map(len, got.values())) < want and time.monotonic() < deadline:
        for k, v in a.get_new_notifs().items():
            got.setdefault(k, []).extend(v)
        time.sleep(0.001)
    return got


def error_name(fn) -> str:
    """'' if fn() succeeds, else the exception's class name (NIXL raises nixl*Error)."""
    try:
        fn()
        return ""
    except Exception as e:  # noqa: BLE001 - the name is the observation
        return type(e).__name__


def pair():
    a, b = agent("A"), agent("B")
    b.add_remote_agent(a.get_agent_metadata())
    return a, b


# ------------------------------------------------------------------ one-process scenarios
def sc_plugins() -> dict:
    a = nixl_agent("A", nixl_agent_config(backends=[BACKEND, "UCX"]))  # UCX still loads beside ours
    return {"plugins": a.get_plugin_list(), "mems": a.get_plugin_mem_types(BACKEND),
            "params": a.get_plugin_params(BACKEND), "backend_mems": a.get_backend_mem_types(BACKEND),
            "created": sorted(a.backends)}


def sc_write_read() -> dict:
    a, b = pair()
    src, dst, back = region(1), region(None), region(None)
    for buf in (src, back):
        register(a, buf)
    register(b, dst)
    a.add_remote_agent(b.get_agent_metadata())
    pieces = scatter(7, 97)
    h = a.initialize_xfer("WRITE", descs(a, src.ctypes.data, pieces), descs(a, dst.ctypes.data, pieces), "B",
                          b"written:1")
    first = a.transfer(h)
    st = wait_state(a, h)
    notifs = wait_notif(b)
    # READ the same pieces back into `back` at the same offsets
    h2 = a.initialize_xfer("READ", descs(a, back.ctypes.data, pieces), descs(a, dst.ctypes.data, pieces), "B")
    a.transfer(h2)
    st2 = wait_state(a, h2)
    untouched = np.ones(REGION, dtype=bool)
    for o, n in pieces:
        untouched[o:o + n] = False
    return {"first": first, "write": st, "read": st2, "notifs": {k: [m.decode() for m in v] for k, v in notifs.items()},
            "sent": sha(gather(src, pieces)), "received": sha(gather(dst, pieces)),
            "read_back": sha(gather(back, pieces)), "dst_rest_zero": bool((dst[untouched] == 0).all()),
            "back_rest_zero": bool((back[untouched] == 0).all()), "pieces": len(pieces)}


def sc_notifs() -> dict:
    a, b = pair()
    a.add_remote_agent(b.get_agent_metadata())
    msgs = [b"plain", b"\x00\xff\x80binary\n", b"x" * 5000, b""]
    for m in msgs[:3]:
        a.send_notif("B", m)
    got = wait_notif(b, want=3)
    b.send_notif("A", b"back")
    back = wait_notif(a)
    a.send_notif("A", b"self")  # an agent may notify itself (supportsLocal)
    own = wait_notif(a)
    return {"got": {k: [sha(m) for m in v] for k, v in got.items()}, "want": [sha(m) for m in msgs[:3]],
            "back": {k: [m.decode() for m in v] for k, v in back.items()},
            "own": {k: [m.decode() for m in v] for k, v in own.items()}}


def sc_repost() -> dict:
    a, b = pair()
    src, dst = region(None), region(None)
    register(a, src)
    register(b, dst)
    a.add_remote_agent(b.get_agent_metadata())
    pieces = scatter(3, 16)
    h = a.initialize_xfer("WRITE", descs(a, src.ctypes.data, pieces), descs(a, dst.ctypes.data, pieces), "B", b"n0")
    rounds = []
    for i in range(4):
        src[:] = region(100 + i)
        a.transfer(h, f"n{i}".encode())
        st = wait_state(a, h)
        n = wait_notif(b)
        rounds.append({"state": st, "equal": gather(src, pieces) == gather(dst, pieces),
                       "notif": [m.decode() for m in n.get("A", [])]})
    a.release_xfer_handle(h)
    return {"rounds": rounds}


def sc_release_inflight() -> dict:
    a, b = pair()
    big = 64 << 20
    src, dst = region(5, big), region(None, big)
    register(a, src)
    register(b, dst)
    a.add_remote_agent(b.get_agent_metadata())
    pieces = [(i * (16 << 10), 16 << 10) for i in range(big // (16 << 10))]  # 4,096 descriptors
    handles = []
    states = []
    for _ in range(3):
        h = a.initialize_xfer("WRITE", descs(a, src.ctypes.data, pieces), descs(a, dst.ctypes.data, pieces), "B")
        states.append(a.transfer(h))
        handles.append(h)
    errs = [error_name(lambda h=h: a.release_xfer_handle(h)) for h in handles]  # in flight or queued
    # the agent keeps working afterwards
    small = scatter(9, 8, size=1 << 20)
    src[:1 << 20] = region(6, 1 << 20)
    h = a.initialize_xfer("WRITE", descs(a, src.ctypes.data, small), descs(a, dst.ctypes.data, small), "B")
    a.transfer(h)
    after = wait_state(a, h)
    return {"posted": states, "release_errors": errs, "after": after,
            "after_equal": gather(src, small) == gather(dst, small)}


def sc_remove_remote() -> dict:
    a, b = pair()
    src, dst = region(11), region(None)
    register(a, src)
    register(b, dst)
    a.add_remote_agent(b.get_agent_metadata())
    pieces = scatter(1, 4)
    ld, rd = descs(a, src.ctypes.data, pieces), descs(a, dst.ctypes.data, pieces)
    h = a.initialize_xfer("WRITE", ld, rd, "B")
    a.transfer(h)
    first = wait_state(a, h)
    a.remove_remote_agent("B")
    repost = error_name(lambda: a.transfer(h))
    new = error_name(lambda: a.initialize_xfer("WRITE", ld, rd, "B"))
    notif = error_name(lambda: a.send_notif("B", b"gone?"))
    a.release_xfer_handle(h)
    a.add_remote_agent(b.get_agent_metadata())  # and it can come back
    dst[:] = 0
    h = a.initialize_xfer("WRITE", ld, rd, "B")
    a.transfer(h)
    again = wait_state(a, h)
    return {"first": first, "repost_after_remove": repost, "new_after_remove": new, "notif_after_remove": notif,
            "again": again, "again_equal": gather(src, pieces) == gather(dst, pieces)}


def sc_errors() -> dict:
    a, b = pair()
    src, dst = region(12), region(None)
    register(a, src)
    reg_b = register(b, dst)
    a.add_remote_agent(b.get_agent_metadata())
    pieces = scatter(2, 4)
    ld = descs(a, src.ctypes.data, pieces)
    out = {
        "unknown_peer": error_name(lambda: a.initialize_xfer("WRITE", ld, descs(a, dst.ctypes.data, pieces), "Nobody")),
        "unknown_peer_notif": error_name(lambda: a.send_notif("Nobody", b"x")),
        # a remote range B never registered: NIXL's own metadata check refuses it
        "unregistered_range": error_name(lambda: a.initialize_xfer(
            "WRITE", a.get_xfer_descs([(src.ctypes.data, 4096, 0)], "DRAM"),
            a.get_xfer_descs([(dst.ctypes.data + REGION, 4096, 0)], "DRAM"), "B")),
    }
    # B deregisters after A loaded its metadata: NIXL still believes the range is there, the
    # Transfer Engine's bounds check (against B's live segment) must refuse the transfer.
    h = a.initialize_xfer("WRITE", ld, descs(a, dst.ctypes.data, pieces), "B")
    b.deregister_memory(reg_b)
    out["stale_range_post"] = error_name(lambda: a.transfer(h))
    out["stale_range_state"] = wait_state(a, h)
    out["dst_untouched"] = bool((dst == 0).all())
    a.release_xfer_handle(h)
    return out


def sc_vram_without_gpu() -> dict:
    """VRAM is listed, but registering it where the engine has no GPU transport is refused
    (the reason is on stderr); DRAM still registers on the same agent afterwards."""
    a = nixl_agent("A", nixl_agent_config(backends=[]))
    a.create_backend(BACKEND)
    buf = region(1, 1 << 20)
    out = {"backend_mems": a.get_backend_mem_types(BACKEND),
           "vram": error_name(lambda: a.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "VRAM"))}
    out["dram_after"] = error_name(lambda: register(a, buf))
    return out


def sc_protocol() -> dict:
    """Backend params protocol / device_name reach the Transfer Engine: "rdma" on "lo" starts
    the UCX transport (the engine's ready line, on stderr, lists it) and moves bytes; an
    unknown NIC fails backend creation (the engine's reason naming it, on stderr)."""
    a = nixl_agent("A", nixl_agent_config(backends=[]))
    b = nixl_agent("B", nixl_agent_config(backends=[]))
    for ag in (a, b):
        ag.create_backend(BACKEND, {"protocol": "rdma", "device_name": "lo"})
    src, dst = region(3, 1 << 20), region(None, 1 << 20)
    register(a, src)
    register(b, dst)
    a.add_remote_agent(b.get_agent_metadata())
    pieces = scatter(5, 40, size=1 << 20)
    h = a.initialize_xfer("WRITE", descs(a, src.ctypes.data, pieces), descs(a, dst.ctypes.data, pieces), "B")
    a.transfer(h)
    state = wait_state(a, h)
    c = nixl_agent("C", nixl_agent_config(backends=[]))
    return {"write": state, "equal": gather(src, pieces) == gather(dst, pieces),
            "unknown_nic": error_name(lambda: c.create_backend(BACKEND, {"protocol": "rdma",
                                                                         "device_name": "no_such_nic0"}))}


SCENARIOS = {"plugins": sc_plugins, "write_read": sc_write_read, "notifs": sc_notifs, "repost": sc_repost,
             "release_inflight": sc_release_inflight, "remove_remote": sc_remove_remote, "errors": sc_errors,
             "vram_without_gpu": sc_vram_without_gpu, "protocol": sc_protocol}


# ------------------------------------------------------------------ two-process roles
# A writes pieces of the first half of B's region and reads pieces of the second half
W_PIECES = scatter(30, 300, size=REGION // 2)
R_PIECES = [(o + REGION // 2, n) for o, n in scatter(31, 200, size=REGION // 2)]


def say(**kv) -> None:
    print(json.dumps(kv), flush=True)


def hear(prefix: str) -> str:
    line = sys.stdin.readline()
    if not line.startswith(prefix + " "):
        raise SystemExit(f"expected {prefix!r} on stdin, got {line[:80]!r}")
    return line[len(prefix) + 1:].strip()


def role_target() -> None:
    b = agent("B")
    dst = region(21)  # READ source for A, WRITE target of A
    register(b, dst)
    say(meta=b.get_agent_metadata().hex(), base=dst.ctypes.data, read_src=sha(gather(dst, R_PIECES)))
    b.add_remote_agent(bytes.fromhex(hear("META")))
    n = wait_notif(b)
    say(notifs={k: [m.decode() for m in v] for k, v in n.items()}, received=sha(gather(dst, W_PIECES)))
    b.send_notif("A", b"bye from B")
    hear("EXIT")


def role_initiator() -> None:
    a = agent("A")
    src, back = region(22), region(None)
    register(a, src)
    register(a, back)
    say(meta=a.get_agent_metadata().hex())
    remote = a.add_remote_agent(bytes.fromhex(hear("META")))
    base = int(hear("BASE"))
    w = W_PIECES
    h = a.initialize_xfer("WRITE", descs(a, src.ctypes.data, w), descs(a, base, w), remote.decode(), b"done A->B")
    t0 = time.perf_counter()
    a.transfer(h)
    wst = wait_state(a, h)
    r = R_PIECES
    h2 = a.initialize_xfer("READ", descs(a, back.ctypes.data, r), descs(a, base, r), "B")
    a.transfer(h2)
    rst = wait_state(a, h2)
    n = wait_notif(a)
    say(write=wst, read=rst, sent=sha(gather(src, w)), read_back=sha(gather(back, r)), seconds=time.perf_counter() - t0,
        notifs={k: [m.decode() for m in v] for k, v in n.items()})
    hear("GONE")  # the target process has exited: a transfer now must fail cleanly
    post = error_name(lambda: a.transfer(h2))
    say(post_after_peer_exit=post, after_peer_exit=wait_state(a, h2), notif_after_exit=error_name(lambda: a.send_notif("B", b"?")))


def main() -> None:
    what = sys.argv[1]
    if what == "target":
        role_target()
    elif what == "initiator":
        role_initiator()
    else:
        say(**SCENARIOS[what]())
    if what == "plugins":
        # nixl 1.5.1's UCX plugin can crash in its exit handlers on CPU-only hosts; the result is out
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
