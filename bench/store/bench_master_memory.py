#!/usr/bin/env python3
"""Master memory per object: put N complete objects into the pure MasterState and measure
the heap growth with tracemalloc (keys included, as the master must hold them).

Reference measured in the same run: a plain ``dict[str, int]`` holding the same keys (the
floor any key -> location map pays in CPython). Target: <= 300 bytes/object at 1M objects.

    python3 -m bench.store.bench_master_memory            # 1,000,000 objects (~1 min)
    python3 -m bench.store.bench_master_memory --objects 200000
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

from mooncake_core.store.master_state import MasterConfig, MasterState
from mooncake_core.store.protocol import ReplicateConfigMsg
from mooncake_core.utils.progress import Progress


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=1_000_000, help="number of objects to put (default 1M)")
    ap.add_argument("--size", type=int, default=512 * 1024, help="object size in bytes (default 512 KiB)")
    ap.add_argument("--replicas", type=int, default=1, help="replicas per object (default 1)")
    ap.add_argument("--segments", type=int, default=8, help="mounted segments (default 8)")
    args = ap.parse_args()

    n = args.objects
    # key strings are created before measuring in both cases and counted separately
    keys = [f"mooncake/kv/layer-{i % 61:02d}/block-{i:010d}" for i in range(n)]
    key_bytes = sum(k.__sizeof__() for k in keys)

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    ref = {}
    for i, k in enumerate(keys):
        ref[k] = i * 4096 + 1_000_000_000  # a location int per key
    ref_bytes = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del ref
    gc.collect()

    st = MasterState(MasterConfig(eviction_high_watermark_ratio=1.0))
    seg_size = max(1 << 30, (n * args.size * args.replicas) // args.segments * 2)
    seg_size = min(seg_size, (1 << 48) - 1)
    for s in range(args.segments):
        st.mount_segment(f"client{s}", f"10.0.0.{s}:12345", 0x7F0000000000, seg_size)
    cfg = ReplicateConfigMsg(replica_num=args.replicas)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    prog = Progress("put", len(keys), unit="objects", every_s=2.0)
    for k in keys:
        st.put_start("client0", k, args.size, cfg)
        st.put_end("client0", k)
        prog.add()
    prog.finish()
    dt = time.perf_counter() - t0
    master_bytes = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()

    per_obj = (master_bytes + key_bytes) / n
    per_ref = (ref_bytes + key_bytes) / n
    print(f"objects: {n:,}  replicas: {args.replicas}  key length: {len(keys[0])}")
    print(f"master state:        {per_obj:7.1f} bytes/object (keys included: {key_bytes / n:.1f})")
    print(f"reference dict[str,int]: {per_ref:7.1f} bytes/object (same keys)")
    print(f"ratio master/reference:  {per_obj / per_ref:.2f}x   target <= 300 bytes/object: "
          f"{'OK' if per_obj <= 300 else 'OVER'}")
    print(f"put_start+put_end in-process (with tracemalloc on): {n / dt:,.0f} objects/s")


if __name__ == "__main__":
    main()
