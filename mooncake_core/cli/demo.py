"""``mooncake_demo``: the README's "main job" on the embedded default.

Starts an in-process HTTP metadata server, spawns a second process with a Transfer Engine
as target, then moves random data both ways -- single and batch, write and read -- over
the automatically chosen transport (same host: cross-memory attach) and over tcp, checks
every byte (sha256 computed inside the target process) and prints throughput. Exits 0
when everything matched, 1 otherwise.

Then (unless ``--only transfer``) it runs the Store demo: ``mooncake_master
--enable_http_metadata_server`` plus a client that puts and gets (``mooncake_store_demo``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from mooncake_core.utils.log import get_logger, setup_logging
from mooncake_core.utils.net import free_port
from mooncake_core.utils.proc import close_piped, quiet_ctrl_c, readline_timeout
from mooncake_core.utils.rounds import Rounds
from mooncake_core.utils.sizes import format_size, parse_size

log = get_logger("mooncake.demo")


@dataclass
class DemoResult:
    ok: bool = True
    # transport, kind, op, bytes, seconds, ok
    rows: list[tuple[str, str, str, int, float, bool]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


# ----------------------------------------------------------------------------- target process
def _target_main(metadata: str, size: int) -> int:
    from mooncake_core.engine import TransferEngine
    eng = TransferEngine()
    if eng.initialize(f"127.0.0.1:{free_port()}", metadata, "tcp", "") != 0:
        print(json.dumps({"error": eng.last_error}), flush=True)
        return 1
    buf = np.random.default_rng(int.from_bytes(os.urandom(4), "little")).integers(0, 256, size, dtype=np.uint8)
    if eng.register_memory(buf.ctypes.data, buf.nbytes, "cpu:0") != 0:
        print(json.dumps({"error": eng.last_error}), flush=True)
        return 1
    print(json.dumps({"segment": eng.get_local_segment_name(), "addr": buf.ctypes.data, "sha": _sha(buf)}),
          flush=True)
    for line in sys.stdin:
        parts = line.split()
        if parts and parts[0] == "sha":
            off, n = int(parts[1]), int(parts[2])
            print(_sha(buf[off:off + n]), flush=True)
        elif parts and parts[0] == "exit":
            break
    eng.close()
    return 0


class _Target:
    def __init__(self, metadata: str, size: int, timeout: float = 30.0):
        self.proc = subprocess.Popen([sys.executable, "-m", "mooncake_core.cli.demo", "--_target", "--metadata",
                                      metadata, "--size", str(size)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = readline_timeout(self.proc, 60, what="demo target process")
        if not line:
            raise RuntimeError(f"target process exited early (rc={self.proc.wait()})")
        info = json.loads(line)
        if "error" in info:
            raise RuntimeError(f"target failed to start: {info['error']}")
        self.segment, self.addr, self.initial_sha = info["segment"], info["addr"], info["sha"]

    def sha(self, off: int, n: int) -> str:
        assert self.proc.stdin is not None  # started with stdin=PIPE
        self.proc.stdin.write(f"sha {off} {n}\n")
        self.proc.stdin.flush()
        return readline_timeout(self.proc, 120, what="demo target process").strip()

    def close(self) -> None:
        close_piped(self.proc)


# ----------------------------------------------------------------------------- the demo
def run_transfer_demo(size: int = 64 << 20, batch: int = 64, metadata: str | None = None,
                      out=print, rounds: int = 5) -> DemoResult:
    """Move ``size`` bytes each way (single, and as ``batch`` pieces) over auto + tcp, ``rounds``
    times each; verify every round.

    ``metadata``: a connection string; None starts an embedded HTTP metadata server.
    Returns a DemoResult (``ok`` False on any mismatch or error).
    """
    from mooncake_core.engine import TransferEngine

    res = DemoResult()
    server = None
    if metadata is None:
        from mooncake_core.metadata import HttpMetadataServer
        server = HttpMetadataServer(port=0).start()
        metadata = server.url
        out(f"[demo] embedded HTTP metadata server at {metadata}")
    target = None
    eng = TransferEngine()
    try:
        if eng.initialize(f"127.0.0.1:{free_port()}", metadata, "tcp", "") != 0:
            raise RuntimeError(f"initiator initialize failed: {eng.last_error}")
        target = _Target(metadata, size)
        out(f"[demo] target process segment {target.segment} registered {format_size(size)}")
        rng = np.random.default_rng()
        src = rng.integers(0, 256, size, dtype=np.uint8)
        dst = np.zeros(size, dtype=np.uint8)
        assert eng.register_memory(src.ctypes.data, size, "cpu:0") == 0
        assert eng.register_memory(dst.ctypes.data, size, "cpu:0") == 0
        piece = size // batch
        auto = eng.transport_for(target.segment)
        out(f"[demo] transport chosen automatically for the target: {auto}")

        def step(transport: str, kind: str, op: str, fn, verify, reset) -> None:
            # ``rounds`` timed rounds, each verified; the first (cold: page faults, connection
            # set-up) is printed apart from the median of the warm ones
            secs: list[float] = []
            good, rc = True, 0
            for _ in range(rounds):
                reset()  # fresh bytes to write / a zeroed destination: every round proves itself
                t0 = time.perf_counter()
                rc = fn()
                secs.append(time.perf_counter() - t0)
                good = rc == 0 and verify()
                if not good:
                    break
            r = Rounds(tuple(secs))
            res.rows.append((transport, kind, op, size, r.warm, good))
            status = "ok" if good else f"FAILED (rc={rc}: {eng.last_error})"
            out(f"[demo] {transport:<5} {kind:<6} {op:<5} {format_size(size):>10} {r.rate(size)}  {status}")
            if not good:
                res.ok = False
                res.errors.append(f"{transport} {kind} {op}: rc={rc} {eng.last_error}")

        def fresh_src() -> None:
            src[:] = rng.integers(0, 256, size, dtype=np.uint8)

        def zero_dst() -> None:
            dst[:] = 0

        offs = [i * piece for i in range(batch)]
        for transport, hint in ((auto, ""), ("tcp", "tcp")):
            step(transport, "single", "write",
                 lambda: eng.transfer_sync_write(target.segment, src.ctypes.data, target.addr, size, hint),
                 lambda: target.sha(0, size) == _sha(src), fresh_src)
            step(transport, "single", "read",
                 lambda: eng.transfer_sync_read(target.segment, dst.ctypes.data, target.addr, size, hint),
                 lambda: np.array_equal(dst, src), zero_dst)
            step(transport, "batch", "write",
                 lambda: eng.batch_transfer_sync_write(target.segment, [src.ctypes.data + o for o in offs],
                                                       [target.addr + o for o in offs], [piece] * batch, hint),
                 lambda: target.sha(0, piece * batch) == _sha(src[:piece * batch]), fresh_src)
            step(transport, "batch", "read",
                 lambda: eng.batch_transfer_sync_read(target.segment, [dst.ctypes.data + o for o in offs],
                                                      [target.addr + o for o in offs], [piece] * batch, hint),
                 lambda: np.array_equal(dst[:piece * batch], src[:piece * batch]), zero_dst)
    except Exception as e:
        res.ok = False
        res.errors.append(str(e))
        out(f"[demo] error: {e}")
    finally:
        if target is not None:
            target.close()
        eng.close()
        if server is not None:
            server.stop()
    out(f"[demo] transfer engine demo {'PASSED' if res.ok else 'FAILED'}")
    return res


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mooncake_demo",
        description="Run the Mooncake main job on the embedded default: an in-process HTTP metadata server, "
                    "a target Transfer Engine in a second process, random data moved both ways (single + batch, "
                    "write + read) over the auto-chosen transport and over tcp, verified byte for byte, with "
                    "throughput printed. Exit code 0 when every byte matched, 1 otherwise.")
    p.add_argument("--size", default="64MiB", help="bytes moved per step, e.g. 64MiB or 1GB")
    p.add_argument("--batch", type=int, default=64, help="number of pieces the batch steps split --size into")
    p.add_argument("--rounds", type=int, default=5,
                   help="timed rounds per step, each verified; the median of the warm rounds is printed, the "
                        "first (cold: page faults, connection set-up) beside it")
    p.add_argument("--metadata", default=None,
                   help="use this metadata connection string (http://h:p/metadata, etcd://h:p, redis://h:p, "
                        "P2PHANDSHAKE) instead of starting the embedded HTTP server")
    p.add_argument("--log-level", default="WARNING", help="log level (DEBUG, INFO, WARNING, ERROR)")
    p.add_argument("--only", choices=("all", "transfer", "store"), default="all",
                   help="which part of the main job to run: the Transfer Engine demo, the Store demo "
                        "(mooncake_master --enable_http_metadata_server + a client that puts and gets), "
                        "or both (default)")
    p.add_argument("--_target", dest="target_child", action="store_true", help=argparse.SUPPRESS)
    return p


@quiet_ctrl_c("mooncake_demo")
def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    setup_logging(a.log_level)
    try:
        size = parse_size(a.size, name="--size")
    except ValueError as e:
        print(f"mooncake_demo: {e}", file=sys.stderr)
        return 2
    if a.target_child:
        try:
            return _target_main(a.metadata, size)
        except KeyboardInterrupt:  # Ctrl-C reaches the whole group: the parent reports it
            return 130
    if size <= 0 or a.batch <= 0 or size < a.batch:
        print("mooncake_demo: --size must be >= --batch > 0", file=sys.stderr)
        return 2
    if a.rounds < 1:
        print(f"mooncake_demo: --rounds must be >= 1, got {a.rounds}", file=sys.stderr)
        return 2
    if a.only in ("all", "transfer") and not run_transfer_demo(size, a.batch, a.metadata, rounds=a.rounds).ok:
        return 1
    if a.only in ("all", "store"):
        from mooncake_core.cli import store_demo

        print("[demo] store: mooncake_master --enable_http_metadata_server + a client", flush=True)
        return store_demo.main(["--rounds", str(a.rounds)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
