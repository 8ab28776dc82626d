"""A store client in its own process, driven by the tests over stdin/stdout (JSON lines).

Usage: python store_worker.py MASTER_ADDR METADATA_URL SEGMENT_SIZE [OFFLOAD_DIR]
Prints {"ready": <segment name>} once set up, then answers one JSON line per command.
Payloads are generated from a seed (np.random.default_rng(seed).bytes(size)) so the test
process can compute the expected sha256 without shipping bytes around.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

from mooncake_core.store import MooncakeDistributedStore, ReplicateConfig
from mooncake_core.utils.log import setup_logging


def payload(seed: int, size: int) -> bytes:
    return np.random.default_rng(seed).bytes(size)


def sha(b) -> str:
    return hashlib.sha256(b).hexdigest()


def _cfg(cmd: dict) -> ReplicateConfig:
    c = ReplicateConfig()
    c.replica_num = cmd.get("replica_num", 1)
    if cmd.get("preferred"):
        c.preferred_segment = cmd["preferred"]
    c.with_hard_pin = bool(cmd.get("hard_pin", False))
    return c


def main() -> int:
    setup_logging("WARNING")  # shown by pytest when a test fails
    master, meta, seg = sys.argv[1], sys.argv[2], int(sys.argv[3])
    offload = sys.argv[4] if len(sys.argv) > 4 else ""
    store = MooncakeDistributedStore()
    # MC_TEST_LOCAL_HOSTNAME: a worker in a network namespace serves on that namespace's address
    host = os.environ.get("MC_TEST_LOCAL_HOSTNAME", "127.0.0.1")
    cfg = {"local_hostname": host, "metadata_server": meta, "global_segment_size": seg,
           "local_buffer_size": 16 << 20, "protocol": "tcp", "master_server_addr": master}
    if offload:
        cfg["enable_ssd_offload"] = True
        cfg["ssd_offload_path"] = offload
    rc = store.setup(cfg)
    print(json.dumps({"ready": store.get_hostname(), "rc": rc}), flush=True)
    if rc != 0:
        return 1
    keep: dict[str, np.ndarray] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        out: dict = {}
        if op == "put":
            fn = store.upsert if cmd.get("upsert") else store.put
            out["rc"] = fn(cmd["key"], payload(cmd["seed"], cmd["size"]), _cfg(cmd))
        elif op == "put_from":
            arr = np.frombuffer(bytearray(payload(cmd["seed"], cmd["size"])), dtype=np.uint8)
            keep[cmd["key"]] = arr
            ptr = int(arr.ctypes.data)
            assert store.register_buffer(ptr, arr.nbytes) == 0
            out["rc"] = store.put_from(cmd["key"], ptr, arr.nbytes, _cfg(cmd))
            assert store.unregister_buffer(ptr) == 0
        elif op == "get":
            data = store.get(cmd["key"])
            out = {"len": len(data), "sha": sha(data)}
        elif op == "get_into":
            buf = np.zeros(cmd["cap"], dtype=np.uint8)
            n = store.get_into(cmd["key"], int(buf.ctypes.data), buf.nbytes)
            out = {"rc": n, "sha": sha(buf[:n].tobytes()) if n >= 0 else ""}
        elif op == "put_batch":
            vals = [payload(s, n) for s, n in zip(cmd["seeds"], cmd["sizes"])]
            out["rc"] = store.put_batch(cmd["keys"], vals, _cfg(cmd))
        elif op == "get_batch":
            out["shas"] = [sha(d) if d else None for d in store.get_batch(cmd["keys"])]
        elif op == "call":
            out["result"] = getattr(store, cmd["method"])(*cmd.get("args", []))
        elif op == "close":
            out["rc"] = store.close()
            print(json.dumps(out), flush=True)
            return 0
        else:
            out["error"] = f"unknown op {op}"
        print(json.dumps(out), flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
