"""Transfer Engine load for the soak (bench/robustness/soak.py), through the public
``mooncake.engine.TransferEngine`` API only (``--impl ours`` aliases it to mooncake_core, as
worker.py does for the store), so the original 0.3.13 can run the same load.

Roles:
  target     register ``--region`` bytes, print ``{"ready": segment, "addr": base}``, wait
             for stdin to close;
  initiator  at ``--rate`` rounds/s: write a fresh pattern of a random size (4 KiB..1 MiB,
             sometimes a batch of 16 slices) into its own slice of the target's region, read
             it back into another buffer and compare; prints ``{"p", "e", "bytes", "bad"}``
             four times a second (``bad``: reads that came back different) until stdin closes.
Both use P2PHANDSHAKE (no metadata server). Stdlib + ctypes only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import sys
import threading
import time

from mooncake_lab.chaos.mooncake_import import mooncake_module

KiB, MiB = 1 << 10, 1 << 20


def engine_class(impl: str):
    return mooncake_module(impl, "engine").TransferEngine


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _engine(args):
    eng = engine_class(args.impl)()
    rc = eng.initialize(args.host, "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise SystemExit(f"TransferEngine.initialize failed with {rc}")
    return eng


def target(args) -> None:
    eng = _engine(args)
    region = (ctypes.c_char * args.region)()
    base = ctypes.addressof(region)
    if eng.register_memory(base, args.region) != 0:
        raise SystemExit("register_memory failed")
    emit({"ready": f"{args.host}:{eng.get_rpc_port()}", "addr": base})
    sys.stdin.read()
    eng.unregister_memory(base)


def initiator(args) -> None:
    eng = _engine(args)
    slice_bytes = args.region // args.initiators
    remote = args.addr + args.index * slice_bytes
    src = (ctypes.c_char * slice_bytes)()
    dst = (ctypes.c_char * slice_bytes)()
    sp, dp = ctypes.addressof(src), ctypes.addressof(dst)
    for p in (sp, dp):
        if eng.register_memory(p, slice_bytes) != 0:
            raise SystemExit("register_memory failed")
    emit({"ready": f"{args.host}:{eng.get_rpc_port()}"})
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    rng = random.Random(args.seed * 1000 + args.index)
    stats = {"p": 0, "e": 0, "bytes": 0, "bad": 0}
    period = 1.0 / args.rate if args.rate > 0 else 0.0
    next_at = time.monotonic()
    last_emit = 0.0
    n = 0
    while not stop.is_set():
        if period:
            next_at = max(next_at + period, time.monotonic() - period)
            if stop.wait(max(0.0, next_at - time.monotonic())):
                break
        n += 1
        size = min(slice_bytes, int(2 ** rng.uniform(12, 20)))
        pattern = (n.to_bytes(8, "little") + bytes([n % 251])) * (size // 9 + 1)
        ctypes.memmove(sp, pattern, size)
        if n % 8 == 0 and size >= 16 * 4 * KiB:  # a batch of 16 slices, every 8th round
            k = 16
            part = size // k
            offs = [i * part for i in range(k)]
            rc = eng.batch_transfer_sync_write(args.segment, [sp + o for o in offs], [remote + o for o in offs],
                                               [part] * k)
            rc2 = -1 if rc != 0 else eng.batch_transfer_sync_read(args.segment, [dp + o for o in offs],
                                                                   [remote + o for o in offs], [part] * k)
            size = part * k
        else:
            rc = eng.transfer_sync_write(args.segment, sp, remote, size)
            rc2 = -1 if rc != 0 else eng.transfer_sync_read(args.segment, dp, remote, size)
        stats["p"] += 1
        if rc != 0 or rc2 != 0:
            stats["e"] += 1
        else:
            stats["bytes"] += 2 * size
            if ctypes.string_at(dp, size) != pattern[:size]:
                stats["bad"] += 1
        now = time.monotonic()
        if now - last_emit >= 0.25:
            emit(stats)
            last_emit = now
    emit(dict(stats, done=1))
    for p in (sp, dp):
        eng.unregister_memory(p)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", choices=["target", "initiator"], help="target: serve memory; initiator: load it")
    p.add_argument("--impl", choices=["ours", "ref"], required=True, help="ours: alias mooncake.engine to mooncake_core")
    p.add_argument("--host", default="127.0.0.1", help="local_hostname")
    p.add_argument("--region", type=int, default=64 * MiB, help="target memory, split between the initiators")
    p.add_argument("--segment", default="", help="initiator: the target's segment name (host:port)")
    p.add_argument("--addr", type=int, default=0, help="initiator: the target's region base address")
    p.add_argument("--initiators", type=int, default=1, help="how many initiators share the region")
    p.add_argument("--index", type=int, default=0, help="this initiator's slice of the region")
    p.add_argument("--rate", type=float, default=50.0, help="rounds/s (0: as fast as possible)")
    p.add_argument("--seed", type=int, default=1, help="random seed")
    args = p.parse_args()
    target(args) if args.role == "target" else initiator(args)


if __name__ == "__main__":
    main()
