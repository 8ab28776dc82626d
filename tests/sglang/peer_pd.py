"""One side of a PD hand-off driven through SGLang's real Mooncake backend classes.

Run by tests/sglang/test_sglang_pd.py (and bench/frameworks/bench_sglang_handoff.py) with the SGLang venv's
python, one process per role. ``sglang_side.build_side`` does what SGLang's scheduler does
around the KV manager, without a model (SGLang cannot run one on this CPU); everything below
that line -- bootstrap HTTP, ZMQ control messages, the transfer worker, our engine -- is the
real code path. Prefill: sender per room, waits for decode's metadata, ``init`` + ``send`` in
chunks. Decode: receiver per room, ``init`` + ``send_metadata`` with its destination pages.

Output: JSON lines on stdout (``{"event": ...}``) and .npz files of the buffers for the test to
compare byte for byte. Every wait has a deadline (``--deadline``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sglang_side import build_side, failure_text, wait_states


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=["prefill", "decode"], required=True, help="which side to run")
    p.add_argument("--backend", default="mooncake", choices=["mooncake", "mooncake_tcp", "nixl"],
                   help="SGLang --disaggregation-transfer-backend (bench compares mooncake-on-ours with nixl)")
    p.add_argument("--bootstrap-port", type=int, required=True,
                   help="prefill's bootstrap server port (prefill starts it, decode queries it)")
    p.add_argument("--rooms", required=True, help="comma-separated bootstrap rooms (one request each)")
    p.add_argument("--layers", type=int, default=4, help="model layers (2 KV buffers per layer)")
    p.add_argument("--pages", type=int, default=32, help="pages in each KV buffer")
    p.add_argument("--page-bytes", type=int, default=4096, help="bytes of one page in one buffer")
    p.add_argument("--page-tokens", type=int, default=16, help="tokens per page (SGLang page_size)")
    p.add_argument("--pages-map", required=True,
                   help="per room 'src:dst' page lists, rooms separated by ';', pages by ',' "
                        "(e.g. '1,5,9:30,2,7;3:4'); 'all' = every page to the same page")
    p.add_argument("--aux-map", required=True,
                   help="per room 'prefill_row:decode_row' of the metadata buffers, rooms separated by ';'")
    p.add_argument("--chunks", type=int, default=1, help="prefill sends each room's pages in this many chunks")
    p.add_argument("--hold-after", type=int, default=0,
                   help="prefill: after sending this many chunks (>0), report 'hold' and stop sending")
    p.add_argument("--delay-send", type=float, default=0.0,
                   help="prefill: seconds to wait between decode's metadata and sending (kill-decode test)")
    p.add_argument("--seed", type=int, default=1, help="random fill seed of this side's buffers")
    p.add_argument("--out", default="", help="write this side's buffers (npz) here at the end")
    p.add_argument("--deadline", type=float, default=60.0, help="seconds before giving up on any wait")
    p.add_argument("--repeat", type=int, default=1,
                   help="bench: run the room list this many times (rooms offset by 1000 per round)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    import numpy as np

    rooms = [int(r) for r in a.rooms.split(",")]
    if a.pages_map == "all":
        pages = [(list(range(a.pages)), list(range(a.pages)))] * len(rooms)
    else:
        pages = []
        for spec in a.pages_map.split(";"):
            s, d = spec.split(":")
            pages.append(([int(x) for x in s.split(",")], [int(x) for x in d.split(",")]))
    auxes = [tuple(int(x) for x in spec.split(":")) for spec in a.aux_map.split(";")]
    if not len(rooms) == len(pages) == len(auxes):
        raise SystemExit("--rooms, --pages-map and --aux-map must have one entry per room")

    side = build_side(a.role, a.bootstrap_port, layers=a.layers, pages=a.pages, page_bytes=a.page_bytes,
                      page_tokens=a.page_tokens, seed=a.seed, backend_name=a.backend)
    import mooncake.engine  # the module SGLang's wrapper imported (resolved through the plugin)

    emit(event="imported", engine_module=mooncake.engine.__name__)
    KVPoll = side.KVPoll
    bootstrap_addr = f"127.0.0.1:{a.bootstrap_port}"
    deadline = time.monotonic() + a.deadline
    n_bufs = len(side.kv)
    def out_arrays() -> list:
        return [t.numpy() for t in side.kv] + [t.numpy() for t in side.aux_tensors()]

    if a.role == "prefill":
        emit(event="ready", role="prefill")
        for rnd in range(a.repeat):
            base = 1000 * rnd
            senders = [side.sender_cls(side.mgr, bootstrap_addr, base + r) for r in rooms]
            states = wait_states(senders, KVPoll.WaitingForInput, KVPoll.Failed, deadline,
                                 "decode's metadata (KVPoll.WaitingForInput)")
            if KVPoll.Failed in states:
                emit(event="result", role="prefill", ok=False, errors=[failure_text(s) for s in senders])
                return 1
            if a.delay_send:
                emit(event="delaying", seconds=a.delay_send)
                time.sleep(a.delay_send)
            t0 = time.perf_counter()
            for snd, (src, _dst), (paux, _daux), room in zip(senders, pages, auxes, rooms):
                side.meta.bootstrap_room[paux, 0] = base + room
                snd.init(len(src), paux)
            n = max(1, a.chunks)
            for c in range(n):
                for snd, (src, _dst) in zip(senders, pages):
                    lo, hi = len(src) * c // n, len(src) * (c + 1) // n
                    snd.send(np.asarray(src[lo:hi], dtype=np.int32))
                if a.hold_after and c + 1 == a.hold_after:
                    emit(event="hold", chunks_sent=c + 1)
                    time.sleep(a.deadline)
                    return 2
            states = wait_states(senders, KVPoll.Success, KVPoll.Failed, deadline,
                                 "the transfer to finish (KVPoll.Success)")
            dt = time.perf_counter() - t0
            ok = all(s == KVPoll.Success for s in states)
            emit(event="round", role="prefill", round=rnd, ok=ok, seconds=dt,
                 bytes=sum(len(s) for s, _ in pages) * a.page_bytes * n_bufs)
            if not ok:
                emit(event="result", role="prefill", ok=False, t_fail=time.time(),
                     errors=[failure_text(s) for s, st in zip(senders, states) if st != KVPoll.Success])
                return 1
            for snd in senders:
                snd.clear()
        if a.out:
            np.savez(a.out, *out_arrays())
        emit(event="result", role="prefill", ok=True, transports=_transports(side))
        time.sleep(0.5)  # decode may still poll our bootstrap server
        return 0

    # ---------------------------------------------------------------- decode
    if a.out:
        np.savez(a.out + ".before.npz", *out_arrays())
    while not side.mgr.try_ensure_parallel_info(bootstrap_addr):
        if time.monotonic() > deadline:
            emit(event="result", role="decode", ok=False, errors=["prefill bootstrap server never became ready"])
            return 1
        time.sleep(0.1)
    emit(event="ready", role="decode")
    total_s, rounds = 0.0, []
    for rnd in range(a.repeat):
        base = 1000 * rnd
        receivers = [side.receiver_cls(side.mgr, bootstrap_addr, base + r) for r in rooms]
        for rcv in receivers:
            rcv.init(0)
        wait_states(receivers, KVPoll.WaitingForInput, KVPoll.Failed, deadline,
                    "the bootstrap handshake (KVPoll.WaitingForInput)")
        t0 = time.perf_counter()
        for rcv, (_src, dst), (_paux, daux) in zip(receivers, pages, auxes):
            rcv.send_metadata(np.asarray(dst, dtype=np.int32), daux, None)
        emit(event="metadata_sent", round=rnd)
        try:
            states = wait_states(receivers, KVPoll.Success, KVPoll.Failed, deadline,
                                 "the KV pages (KVPoll.Success)")
        except TimeoutError as e:
            emit(event="result", role="decode", ok=False, errors=[f"decode: {e}"], t_fail=time.time())
            return 1
        dt = time.perf_counter() - t0
        total_s += dt
        rounds.append(dt)
        if any(s != KVPoll.Success for s in states):
            emit(event="result", role="decode", ok=False, t_fail=time.time(),
                 errors=[failure_text(r) for r, s in zip(receivers, states) if s != KVPoll.Success])
            return 1
        for rcv in receivers:
            rcv.clear()
    if a.out:
        np.savez(a.out, *out_arrays())
    emit(event="result", role="decode", ok=True, seconds=total_s, rounds=rounds,
         bytes_per_round=sum(len(d) for _, d in pages) * a.page_bytes * n_bufs)
    return 0


def _transports(side) -> dict:
    """Transport our engine picked for each decode peer (SGLang's mooncake_session_id)."""
    from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import get_mooncake_transfer_engine

    te = get_mooncake_transfer_engine()
    engine = getattr(te, "engine", None)
    if engine is None or not hasattr(engine, "transport_for"):
        return {}
    sessions = {getattr(info, "mooncake_session_id", None) for info in side.mgr.decode_kv_args_table.values()}
    return {s: engine.transport_for(s) for s in sessions if s}


if __name__ == "__main__":
    rc = main()
    if "nixl" in sys.argv:
        # NIXL 1.5.1's UCX plugin segfaults in its exit handlers on CPU-only hosts; the result is out already
        sys.stdout.flush()
        os._exit(rc)
    sys.exit(rc)
