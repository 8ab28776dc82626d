"""``mooncake_store_demo``: a whole single-node Mooncake Store in one command.

Starts ``mooncake_master --enable_http_metadata_server`` (a subprocess on free ports), sets
up a store client that contributes memory, then puts and gets bytes, a batch, and zero-copy
buffers, verifying every byte and printing what it did with the throughput. Exit code 0 when
every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from typing import Callable, TypeVar

from mooncake_core.utils.net import free_port, wait_for_port
from mooncake_core.utils.proc import quiet_ctrl_c
from mooncake_core.utils.proc import stop_process
from mooncake_core.utils.rounds import Rounds
from mooncake_core.utils.sizes import format_size, parse_size


def _timed(rounds: int, round_fn: Callable[[int], tuple[bool, float, float]]) -> tuple[bool, Rounds, Rounds]:
    """Run ``round_fn(i)`` -> (ok, put seconds, get seconds) ``rounds`` times (stops at the first
    failure): each round writes fresh keys, so every one is a real put and a real get."""
    ok, puts, gets = True, [], []
    for i in range(rounds):
        good, tp, tg = round_fn(i)
        puts.append(tp)
        gets.append(tg)
        if not good:
            ok = False
            break
    return ok, Rounds(tuple(puts)), Rounds(tuple(gets))


T = TypeVar("T")


def _timed_round(put: Callable[[], int], get: Callable[[], T], check: Callable[[T], bool],
                 cleanup: Callable[[], object] | None = None) -> tuple[bool, float, float]:
    """One round for ``_timed``: ``put()`` (-> rc) then ``get()``, each timed alone; ``check`` of
    what the get returned and ``cleanup`` (dropping a later round's fresh keys) run untimed."""
    t0 = time.perf_counter()
    rc = put()
    t1 = time.perf_counter()
    got = get()
    t2 = time.perf_counter()
    if cleanup is not None:
        cleanup()
    return rc == 0 and check(got), t1 - t0, t2 - t1


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mooncake_store_demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segment-size", default="512MB",
                    help="memory this client contributes to the pool (e.g. '512MB'; default %(default)s)")
    ap.add_argument("--value-size", default="4MB", help="size of each demo object (default %(default)s)")
    ap.add_argument("--count", type=int, default=16, help="objects in the batch step (default %(default)s)")
    ap.add_argument("--master", default="",
                    help="use an already running master host:port (with --metadata) instead of starting one")
    ap.add_argument("--metadata", default="", help="metadata server URL when --master is given")
    ap.add_argument("--rounds", type=int, default=5,
                    help="timed rounds of each put/get step, on fresh keys; the median of the warm rounds is "
                         "printed, the first (cold: page faults of fresh memory) beside it (default %(default)s)")
    return ap


@quiet_ctrl_c("mooncake_store_demo")
def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    try:
        seg = parse_size(args.segment_size, name="--segment-size")
        size = parse_size(args.value_size, name="--value-size")
    except ValueError as e:
        ap.error(str(e))
    if size <= 0 or size * max(args.count, 1) > seg:
        ap.error(f"--value-size x --count ({format_size(size * args.count)}) must fit in --segment-size "
                 f"({format_size(seg)})")

    from mooncake_core.store import MooncakeDistributedStore

    master_proc = None
    logf = None
    if args.master:
        if not args.metadata:
            ap.error("--master needs --metadata (e.g. http://127.0.0.1:8080/metadata)")
        master_addr, metadata = args.master, args.metadata
    else:
        port, http, metrics = free_port(), free_port(), free_port()
        logf = tempfile.NamedTemporaryFile("w", prefix="mooncake-master-", suffix=".log", delete=False)
        master_proc = subprocess.Popen(
            [sys.executable, "-m", "mooncake_core.store.master_main", f"--port={port}",
             "--rpc_address=127.0.0.1", f"--metrics_port={metrics}", "--enable_http_metadata_server=true",
             "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={http}"],
            stdout=logf, stderr=subprocess.STDOUT)
        master_addr, metadata = f"127.0.0.1:{port}", f"http://127.0.0.1:{http}/metadata"
        print(f"started mooncake_master at {master_addr} (metadata {metadata}, metrics "
              f"http://127.0.0.1:{metrics}/metrics, log {logf.name})")
    failures = 0

    def check(ok: bool, what: str) -> None:
        nonlocal failures
        print(f"  {'ok  ' if ok else 'FAIL'} {what}")
        failures += 0 if ok else 1

    store = MooncakeDistributedStore()
    try:
        if master_proc is not None:
            wait_for_port("127.0.0.1", int(master_addr.rsplit(":", 1)[1]), 30.0, master_proc)
            wait_for_port("127.0.0.1", int(metadata.rsplit(":", 1)[1].split("/")[0]), 30.0, master_proc)
        # a local buffer: the demo puts bytes values, which stage there (refused without one)
        rc = store.setup("127.0.0.1", metadata, seg, 16 << 20, "tcp", "", master_addr)
        if rc != 0:
            print(f"mooncake_store_demo: error: store setup failed with {rc} (why: the lines above); check that "
                  f"the master ({master_addr}) and the metadata server ({metadata}) run", file=sys.stderr)
            return 1
        print(f"client {store.get_hostname()} contributes {format_size(seg)} to the pool")
        rng = np.random.default_rng(int(time.time()))

        value = rng.bytes(size)

        def single(i: int) -> tuple[bool, float, float]:
            key, v = ("demo/hello", value) if i == 0 else (f"demo/round/{i}", rng.bytes(size))
            return _timed_round(lambda: store.put(key, v), lambda: store.get(key), lambda got: got == v,
                                (lambda: store.remove(key, force=True)) if i else None)
        ok, tp, tg = _timed(args.rounds, single)
        check(ok, f"put/get {format_size(size)}: put {tp.rate(size)}, get {tg.rate(size)}")
        check(store.is_exist("demo/hello") == 1 and store.get_size("demo/hello") == size,
              "is_exist / get_size")
        check(store.put("demo/hello", b"other") == 0 and store.get("demo/hello") == value,
              "objects are immutable: a second put keeps the first value")
        check(store.get("demo/missing") == b"" and store.get_size("demo/missing") == -704,
              "a missing key gives b'' / -704")

        keys = [f"demo/batch/{i}" for i in range(args.count)]
        total = size * len(keys)

        def batch(r: int) -> tuple[bool, float, float]:
            ks = keys if r == 0 else [f"demo/round/{r}/{i}" for i in range(args.count)]
            vals = [rng.bytes(size) for _ in ks]
            return _timed_round(lambda: store.put_batch(ks, vals), lambda: store.get_batch(ks),
                                lambda got: got == vals, (lambda: store.batch_remove(ks, force=True)) if r else None)
        ok, tp, tg = _timed(args.rounds, batch)
        check(ok, f"put_batch/get_batch {len(keys)} x {format_size(size)}: put {tp.rate(total)}, "
                  f"get {tg.rate(total)}")

        src = np.frombuffer(rng.bytes(size), dtype=np.uint8).copy()
        dst = np.zeros_like(src)
        check(store.register_buffer(int(src.ctypes.data), src.nbytes) == 0
              and store.register_buffer(int(dst.ctypes.data), dst.nbytes) == 0, "register_buffer")

        def zero_copy(i: int) -> tuple[bool, float, float]:
            key = "demo/zero-copy" if i == 0 else f"demo/round/zc/{i}"
            src[:] = np.frombuffer(rng.bytes(size), dtype=np.uint8)
            dst[:] = 0
            return _timed_round(lambda: store.put_from(key, int(src.ctypes.data), src.nbytes),
                                lambda: store.get_into(key, int(dst.ctypes.data), dst.nbytes),
                                lambda n: n == size and bool(np.array_equal(src, dst)),
                                (lambda: store.remove(key, force=True)) if i else None)
        ok, tp, tg = _timed(args.rounds, zero_copy)
        check(ok, f"put_from/get_into {format_size(size)}: put {tp.rate(size)}, get {tg.rate(size)}")
        store.unregister_buffer(int(src.ctypes.data))
        store.unregister_buffer(int(dst.ctypes.data))
        rcs = store.batch_remove(["demo/hello", "demo/zero-copy", *keys], force=True)
        check(rcs == [0] * len(rcs), f"batch_remove(force=True) of {len(rcs)} objects")
        check(store.get("demo/hello") == b"", "removed objects miss")
    finally:
        store.close()
        if master_proc is not None:
            stop_process(master_proc)
        if logf is not None:
            logf.close()
            if failures == 0:
                os.unlink(logf.name)
    print("all checks passed" if failures == 0 else f"{failures} check(s) FAILED")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
