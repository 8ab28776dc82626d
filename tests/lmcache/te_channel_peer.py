"""One side of LMCache's ``mooncake_te`` transfer channel (real LMCache 0.5.6 code).

Launched through ``python -m mooncake_connectors.lmcache.run`` (which installs the ``mooncake``
alias, as a user would launch LMCache's server), so ``mooncake_te_impl`` imports our
``mooncake.engine.TransferEngine``. Every peer owns an L1 buffer filled from ``--seed`` and
serves it; ``read`` pulls random pages of the lower half of another peer's buffer into random
pages of the upper half of ours and checks them byte for byte against that peer's seed. JSON lines on stdin/stdout: ``{"ready": url}`` first, then
``read`` (peer url, peer seed, pages, page size) -> ``{"ok", "exact", "secs"}``, ``exit``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def pattern(seed: int, size: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True, help="host:port this peer's channel server listens on")
    ap.add_argument("--seed", type=int, required=True, help="seed of this peer's buffer contents")
    ap.add_argument("--size", type=int, default=8 << 20, help="L1 buffer bytes")
    a = ap.parse_args()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    from lmcache.v1.distributed.internal_api import L1MemoryDesc
    from lmcache.v1.distributed.transfer_channel import TransferChannelAddress, create_transfer_channel_context

    buf = pattern(a.seed, a.size)
    desc = L1MemoryDesc(ptr=int(buf.ctypes.data), size=a.size, align_bytes=4096)
    ctx = create_transfer_channel_context("mooncake_te", desc, listen_url=a.url, advertise_url=a.url)
    print(json.dumps({"ready": a.url, "engine": type(ctx.mooncake_te_engine).__module__}), file=out, flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        t0 = time.perf_counter()
        try:
            rng = np.random.default_rng(cmd.get("pick", 0))
            page, n = cmd["page"], cmd["pages"]
            # pages are read from the lower half of the peer's buffer (never written) into the
            # upper half of ours, so every check compares against the untouched seed pattern
            half = a.size // 2
            remote = rng.choice(half // page, n, replace=False) * page
            local = half + rng.choice(half // page, n, replace=False) * page
            client = ctx.get_transfer_channel_client(cmd["peer"])
            task = client.submit_read([TransferChannelAddress(int(o), page) for o in local],
                                      [TransferChannelAddress(int(o), page) for o in remote])
            deadline = time.monotonic() + cmd.get("timeout", 30)
            while not (res := client.query_read_status(task)).finished:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"read task {task} not finished after {cmd.get('timeout', 30)}s")
                time.sleep(0.001)
            want = pattern(cmd["peer_seed"], a.size)
            bad = [int(lo) for lo, ro in zip(local, remote) if not np.array_equal(buf[lo:lo + page], want[ro:ro + page])]
            ok = all(res.succeeded_mask)
            reply = {"ok": ok, "exact": not bad if ok else None, "bad_pages": len(bad)}
        except Exception as e:  # noqa: BLE001 - the driver asserts on it
            reply = {"error": f"{type(e).__name__}: {e}"}
        reply["secs"] = time.perf_counter() - t0
        print(json.dumps(reply), file=out, flush=True)
    ctx.close()
    out.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
