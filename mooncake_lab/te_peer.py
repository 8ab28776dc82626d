"""A target process for the transfer tests: one engine, one registered random buffer.

Started by the tests with the ``python_exe`` fixture. Prints one JSON line
{segment, addr, size, pid, rpc_port} once ready, then obeys one command per stdin line:
  sha OFF LEN      -> sha256 hex of buffer[OFF:OFF+LEN]
  reg SIZE SEED    -> register another random buffer, prints its address
  unreg ADDR       -> unregister the region at ADDR, prints the return code
  xfer OP SEG REMOTE OFF LEN [HINT] -> as initiator: write (OP=w) buffer[OFF:OFF+LEN] to REMOTE in
                      segment SEG, or read (OP=r) it into the buffer; prints {"rc", "s", "error"}
  lanes            -> JSON list of [transport, lanes, op, bytes] this process moved
  notifies         -> JSON list of [name, msg] received
  exit             -> close the engine and exit 0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

from mooncake_core.engine import TransferEngine
from mooncake_core.utils.log import setup_logging


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--metadata", required=True)
    p.add_argument("--hostname", default="127.0.0.1")
    p.add_argument("--size", type=int, default=1 << 20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--protocol", default="tcp")
    p.add_argument("--device", default="")
    a = p.parse_args()
    setup_logging("WARNING")
    eng = TransferEngine()
    if eng.initialize(a.hostname, a.metadata, a.protocol, a.device) != 0:
        print(json.dumps({"error": eng.last_error}), flush=True)
        return 1
    keep = [np.random.default_rng(a.seed).integers(0, 256, a.size, dtype=np.uint8)]
    buf = keep[0]
    assert eng.register_memory(buf.ctypes.data, buf.nbytes, "cpu:0") == 0
    print(json.dumps({"segment": eng.get_local_segment_name(), "addr": buf.ctypes.data, "size": buf.nbytes,
                      "pid": os.getpid(), "rpc_port": eng.get_rpc_port()}), flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        cmd = parts[0]
        if cmd == "sha":
            off, ln = int(parts[1]), int(parts[2])
            print(hashlib.sha256(buf[off:off + ln].tobytes()).hexdigest(), flush=True)
        elif cmd == "reg":
            extra = np.random.default_rng(int(parts[2])).integers(0, 256, int(parts[1]), dtype=np.uint8)
            keep.append(extra)
            rc = eng.register_memory(extra.ctypes.data, extra.nbytes)
            print(extra.ctypes.data if rc == 0 else -1, flush=True)
        elif cmd == "unreg":
            print(eng.unregister_memory(int(parts[1])), flush=True)
        elif cmd == "xfer":
            op, seg, remote, off, ln = parts[1], parts[2], int(parts[3]), int(parts[4]), int(parts[5])
            hint = parts[6] if len(parts) > 6 else ""
            fn = eng.transfer_sync_write if op == "w" else eng.transfer_sync_read
            t0 = time.perf_counter()
            rc = fn(seg, buf.ctypes.data + off, remote, ln, hint)
            print(json.dumps({"rc": rc, "s": time.perf_counter() - t0, "error": eng.last_error if rc else ""}),
                  flush=True)
        elif cmd == "lanes":
            from mooncake_core.transfer import metrics
            print(json.dumps([[*k, n] for k, n in metrics.lanes_snapshot().items()]), flush=True)
        elif cmd == "notifies":
            print(json.dumps([[n.name, n.msg] for n in eng.get_notifies()]), flush=True)
        elif cmd == "exit":
            break
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
