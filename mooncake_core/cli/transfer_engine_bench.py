"""``transfer_engine_bench``: Mooncake's transfer_engine_bench, for this implementation.

Run a target, then an initiator pointing at it:

    transfer_engine_bench --mode target --metadata_server P2PHANDSHAKE --local_server_name 127.0.0.1
    # prints: segment_id=127.0.0.1:PORT
    transfer_engine_bench --mode initiator --metadata_server P2PHANDSHAKE --segment_id 127.0.0.1:PORT \
        --operation write --block_size 1MB --batch_size 16 --threads 2 --duration 5

The initiator's threads each submit batches of ``batch_size`` blocks of ``block_size`` bytes
into their own slice of the target's first buffer until ``duration`` seconds have passed,
then the total throughput is printed (and a progress bar shows while it runs).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

import numpy as np

from mooncake_core.utils.log import setup_logging
from mooncake_core.utils.proc import quiet_ctrl_c
from mooncake_core.utils.sizes import format_size, parse_size


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="transfer_engine_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["initiator", "target"], default="initiator",
                   help="target: register a buffer and serve it until interrupted; initiator: drive transfers")
    p.add_argument("--metadata_server", default="P2PHANDSHAKE",
                   help="metadata connection string: P2PHANDSHAKE, http://h:p/metadata, etcd://h:p, redis://h:p")
    p.add_argument("--local_server_name", default="127.0.0.1",
                   help="this engine's segment name, 'host' or 'host:port' (with P2PHANDSHAKE the segment "
                        "becomes host:rpc_port)")
    p.add_argument("--segment_id", default="",
                   help="initiator: the target's segment name (printed by the target as segment_id=...)")
    p.add_argument("--protocol", default="tcp",
                   help="transport protocol: tcp, or rdma (one-sided through UCX: RDMA NICs, else its tcp / "
                        "shared-memory lanes; docs/transfer-engine.md)")
    p.add_argument("--device_name", default="", help="NICs for --protocol rdma, as UCX_NET_DEVICES names them "
                   "(mlx5_0,mlx5_1 or eth0; empty: all); an unknown name is refused")
    p.add_argument("--operation", choices=["read", "write"], default="read", help="one-sided operation to run")
    p.add_argument("--block_size", default="64KB", help="bytes per transfer request, e.g. 65536 or 1MB")
    p.add_argument("--batch_size", type=int, default=128, help="requests submitted together per batch")
    p.add_argument("--buffer_size", default="256MB",
                   help="bytes registered on each side (must be >= threads * batch_size * block_size)")
    p.add_argument("--duration", type=float, default=10.0, help="initiator: seconds to run")
    p.add_argument("--threads", type=int, default=2, help="initiator: concurrent submitting threads")
    p.add_argument("--transport_hint", default="", choices=["", "tcp", "shm", "local"],
                   help="force a transport for the initiator ('' = automatic per peer)")
    p.add_argument("--report_unit", default="GB", choices=["GB", "MB", "Gb"],
                   help="unit of the throughput report (GB = 1e9 bytes/s, Gb = 1e9 bits/s)")
    p.add_argument("--log_level", default="WARNING", help="log level (DEBUG, INFO, WARNING, ERROR)")
    return p


def _target(a, eng, buf) -> int:
    print(f"segment_id={eng.get_local_segment_name()}", flush=True)
    print(f"registered {format_size(buf.nbytes)} at {buf.ctypes.data:#x}; Ctrl-C to stop", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    return 0


def _initiator(a, eng, buf, block: int) -> int:
    from tqdm import tqdm
    if not a.segment_id:
        print("transfer_engine_bench: --segment_id is required in initiator mode", file=sys.stderr)
        return 2
    base = eng.get_first_buffer_address(a.segment_id)
    if base == 0:
        print(f"transfer_engine_bench: cannot open segment {a.segment_id!r}: {eng.last_error}", file=sys.stderr)
        return 1
    per_thread = a.batch_size * block
    if per_thread * a.threads > buf.nbytes:
        print(f"transfer_engine_bench: --buffer_size {buf.nbytes} < threads*batch_size*block_size "
              f"({per_thread * a.threads})", file=sys.stderr)
        return 2
    fn = eng.batch_transfer_sync_write if a.operation == "write" else eng.batch_transfer_sync_read
    total = [0] * a.threads
    errors: list[str] = []
    deadline = time.monotonic() + a.duration
    bar = tqdm(total=round(a.duration), unit="s", desc=f"{a.operation} {format_size(block)} x {a.batch_size}",
               disable=not sys.stderr.isatty())

    def worker(i: int) -> None:
        locs = [buf.ctypes.data + i * per_thread + k * block for k in range(a.batch_size)]
        rems = [base + i * per_thread + k * block for k in range(a.batch_size)]
        while time.monotonic() < deadline and not errors:
            if fn(a.segment_id, locs, rems, [block] * a.batch_size, a.transport_hint) != 0:
                errors.append(eng.last_error)
                return
            total[i] += per_thread

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(a.threads)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(1.0)
        bar.update(1)
    bar.close()
    dt = time.monotonic() - t0
    if errors:
        print(f"transfer_engine_bench: transfer failed: {errors[0]}", file=sys.stderr)
        return 1
    nbytes = sum(total)
    scale = {"GB": (1e9, "GB/s"), "MB": (1e6, "MB/s"), "Gb": (1e9 / 8, "Gb/s")}[a.report_unit]
    print(f"Test completed: duration {dt:.2f}s, batch count {nbytes // per_thread}, "
          f"throughput {nbytes / dt / scale[0]:.2f} {scale[1]} "
          f"(transport {a.transport_hint or eng.transport_for(a.segment_id)})")
    return 0


@quiet_ctrl_c("transfer_engine_bench")
def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    setup_logging(a.log_level)
    try:
        block = parse_size(a.block_size, name="--block_size")
        bufsize = parse_size(a.buffer_size, name="--buffer_size")
    except ValueError as e:
        print(f"transfer_engine_bench: {e}", file=sys.stderr)
        return 2
    if block <= 0 or a.batch_size <= 0 or a.threads <= 0 or bufsize <= 0:
        print("transfer_engine_bench: sizes, --batch_size and --threads must be > 0", file=sys.stderr)
        return 2
    from mooncake_core.engine import TransferEngine
    eng = TransferEngine()
    if eng.initialize(a.local_server_name, a.metadata_server, a.protocol, a.device_name) != 0:
        print(f"transfer_engine_bench: initialize failed: {eng.last_error}", file=sys.stderr)
        return 1
    buf = np.random.default_rng().integers(0, 256, bufsize, dtype=np.uint8)
    if eng.register_memory(buf.ctypes.data, buf.nbytes, "cpu:0") != 0:
        print(f"transfer_engine_bench: register_memory failed: {eng.last_error}", file=sys.stderr)
        return 1
    try:
        return _target(a, eng, buf) if a.mode == "target" else _initiator(a, eng, buf, block)
    finally:
        eng.close()


if __name__ == "__main__":
    sys.exit(main())
