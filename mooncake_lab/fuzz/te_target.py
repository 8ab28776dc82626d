"""Target process for the Transfer Engine wire fuzzers.

One engine registers the middle of a larger buffer: ``GUARD`` bytes of a fixed pattern on
each side are *not* registered, so a request that writes outside registered memory shows up
as a changed guard (read-outside shows up on the fuzzer's side as data it should not get).
Prints one JSON line {segment, rpc_port, base, size, pid} once ready, then obeys stdin lines:
  check   -> JSON {"guards_ok": bool, "sha": sha256 of the registered bytes}
  notifies -> number of notifications received so far
  exit    -> close the engine and exit 0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import numpy as np

from mooncake_core.engine import TransferEngine
from mooncake_core.utils.log import setup_logging

GUARD = 64 << 10
PATTERN = 0xA5


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=256 << 10, help="registered bytes")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    setup_logging("ERROR")  # the fuzzer makes the engine log every refusal
    eng = TransferEngine()
    if eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        print(json.dumps({"error": eng.last_error}), flush=True)
        return 1
    buf = np.full(a.size + 2 * GUARD, PATTERN, dtype=np.uint8)
    buf[GUARD:GUARD + a.size] = np.random.default_rng(a.seed).integers(0, 256, a.size, dtype=np.uint8)
    base = buf.ctypes.data + GUARD
    assert eng.register_memory(base, a.size, "cpu:0") == 0, eng.last_error
    print(json.dumps({"segment": eng.get_local_segment_name(), "rpc_port": eng.get_rpc_port(),
                      "base": base, "size": a.size, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "check":
            guards_ok = bool((buf[:GUARD] == PATTERN).all() and (buf[GUARD + a.size:] == PATTERN).all())
            sha = hashlib.sha256(buf[GUARD:GUARD + a.size].tobytes()).hexdigest()
            print(json.dumps({"guards_ok": guards_ok, "sha": sha}), flush=True)
        elif cmd == "notifies":
            print(len(eng.get_notifies()), flush=True)
        elif cmd == "exit":
            break
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
