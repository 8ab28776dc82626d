"""A chaos store client: contributes a segment and runs load threads, logging every op.

Runs under this project's Python (``--impl ours``: ``mooncake.store`` aliased to
mooncake_core through ``mooncake_core.compat``) or under the original Mooncake's venv
(``--impl ref``), and uses only the public ``MooncakeDistributedStore`` API, so the two are
driven identically. Each load thread loops over random keys doing ``get_into`` / ``get`` /
``upsert`` / ``put`` / ``remove``; values are self-describing (payload.py) and every op is
appended to ``ops-w<writer>-i<incarnation>.jsonl`` (oplog.py) for the checker.

stdout (one JSON object per line, read by the harness): ``{"ready": ...}`` once set up,
``{"p": ops, "e": errors, "s": successes, "ok_since": ns}`` four times a second (``ok_since``: every
thread has had an acknowledged write and an answered read, both begun at or after it), ``{"done": ops, "stuck": n}`` at the end.
The worker stops when its stdin closes or on SIGTERM: threads finish their current op
(bounded by ``--stop-timeout``), ops still running are logged as ``stuck``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import random
import signal
import sys
import threading
import time

from mooncake_lab.chaos import payload
from mooncake_lab.chaos.mooncake_import import mooncake_module
from mooncake_lab.chaos.oplog import OpLog, log_path

DEFAULT_MIX = "get_into=40,get=10,upsert=25,put=15,remove=10"


def store_class(impl: str):
    return mooncake_module(impl, "store").MooncakeDistributedStore


def parse_mix(spec: str) -> list[tuple[str, int]]:
    out = []
    for part in spec.split(","):
        name, _, w = part.partition("=")
        if name not in ("get_into", "get", "upsert", "put", "remove"):
            raise SystemExit(f"--mix: unknown op {name!r} (get_into, get, upsert, put, remove)")
        out.append((name, int(w)))
    return out


def emit(obj: dict) -> None:
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


def now() -> int:
    return time.monotonic_ns()


class Worker:
    def __init__(self, args: argparse.Namespace, store) -> None:
        self.a = args
        self.s = store
        self.log = OpLog(log_path(args.logdir, args.writer, args.incarnation))
        self.stop = threading.Event()
        self.ops = 0
        self.errors = 0
        self.successes = 0
        # per thread: start (ns) of its latest acknowledged write and of its latest read that
        # got an answer (hit or miss) -- recovery needs both
        self.last_write_ok: list[int] = [0] * args.threads
        self.last_read_ok: list[int] = [0] * args.threads
        self.current: dict[int, tuple] = {}  # thread -> (n, op, key, ts) while an op runs
        self.mix = parse_mix(args.mix)
        self.keys = [f"{args.key_prefix}{i:05d}" for i in range(args.keys)]
        self.cap = args.max_value + payload.OVERHEAD + 64
        self.lock = threading.Lock()

    def _size(self, rng: random.Random) -> int:
        lo, hi = math.log(self.a.min_value), math.log(self.a.max_value)
        return int(math.exp(rng.uniform(lo, hi)))

    def run_thread(self, t: int) -> None:
        a = self.a
        rng = random.Random((a.seed << 24) ^ (a.writer << 16) ^ (a.incarnation << 8) ^ t)
        buf = (ctypes.c_char * self.cap)()
        ptr = ctypes.addressof(buf)
        if self.s.register_buffer(ptr, self.cap) != 0:
            emit({"warn": "register_buffer failed"})
        names = [n for n, _ in self.mix]
        weights = [w for _, w in self.mix]
        n = seq = 0
        base = {"w": a.writer, "i": a.incarnation, "t": t}
        period = 1.0 / a.rate if a.rate > 0 else 0.0
        next_at = time.monotonic()
        while not self.stop.is_set():
            if period:  # steady load: one op per period, no catching up after a stall
                next_at = max(next_at + period, time.monotonic() - period)
                if self.stop.wait(max(0.0, next_at - time.monotonic())):
                    break
            n += 1
            op = rng.choices(names, weights)[0]
            key = rng.choice(self.keys)
            rec = dict(base, n=n, op=op, k=key)
            ts = now()
            self.current[t] = (n, op, key, ts)
            if op in ("put", "upsert"):
                seq += 1
                wid = payload.WriteId(a.writer, a.incarnation, t, seq)
                value = payload.encode(key, wid, self._size(rng))
                rec["v"] = str(wid)
                ts = now()
                self.log.write(dict(rec, b=1, ts=ts))
                rc = (self.s.upsert if op == "upsert" else self.s.put)(key, value)
                te = now()
            elif op == "remove":
                rc = self.s.remove(key)
                te = now()
            elif op == "get_into":
                rc = self.s.get_into(key, ptr, self.cap)
                te = now()
                if rc > 0:
                    d = payload.decode(key, ctypes.string_at(ptr, rc))
                    rec["st"], rec["got"] = d.status, (str(d.wid) if d.wid else None)
                    if d.detail:
                        rec["why"] = d.detail
                else:
                    rec["st"] = "miss" if rc == -704 else "error"
            else:  # get: b"" is a miss or an error (the API cannot say which)
                data = self.s.get(key)
                te = now()
                rc = len(data)
                if data:
                    d = payload.decode(key, data)
                    rec["st"], rec["got"] = d.status, (str(d.wid) if d.wid else None)
                    if d.detail:
                        rec["why"] = d.detail
                else:
                    rec["st"] = "miss"
            self.current.pop(t, None)
            rec.update(ts=ts, te=te, rc=int(rc) if isinstance(rc, int) else -1)
            self.log.write(rec)
            failed = rec.get("st") == "error" or (op not in ("get", "get_into") and rc not in (0, -704, -705, -706))
            with self.lock:
                self.ops += 1
                self.errors += failed
                if not failed and rec.get("st") not in payload.FOREIGN:
                    self.successes += 1
                if op in ("put", "upsert") and rc == 0:
                    self.last_write_ok[t] = ts
                elif rec.get("st") in ("ok", "miss"):
                    self.last_read_ok[t] = ts
        try:
            self.s.unregister_buffer(ptr)
        except Exception:  # noqa: BLE001 - shutting down
            pass

    def run(self) -> int:
        threads = [threading.Thread(target=self.run_thread, args=(t,), daemon=True, name=f"load-{t}")
                   for t in range(self.a.threads)]
        for th in threads:
            th.start()
        while not self.stop.wait(0.25):
            emit({"p": self.ops, "e": self.errors, "s": self.successes, "ok_since": min(self.last_write_ok + self.last_read_ok)})
        deadline = time.monotonic() + self.a.stop_timeout
        for th in threads:
            th.join(max(0.0, deadline - time.monotonic()))
        stuck = 0
        for t, (n, op, key, ts) in list(self.current.items()):
            stuck += 1
            self.log.write({"stuck": 1, "w": self.a.writer, "i": self.a.incarnation, "t": t, "n": n,
                            "op": op, "k": key, "ts": ts, "tn": now()})
        emit({"done": self.ops, "stuck": stuck})
        return stuck


def setup_store(args: argparse.Namespace):
    Store = store_class(args.impl)
    deadline = time.monotonic() + args.setup_timeout
    attempt = 0
    while True:
        attempt += 1
        s = Store()
        rc = s.setup(args.host, args.meta, args.segment, args.local_buffer, "tcp", "", args.master)
        if rc == 0:
            return s, attempt
        emit({"setup_failed": rc, "attempt": attempt})
        if time.monotonic() > deadline:
            raise SystemExit(f"setup failed {attempt} times (last rc {rc})")
        time.sleep(0.5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["ours", "ref"], required=True, help="ours: alias mooncake.store to mooncake_core")
    p.add_argument("--master", required=True, help="master_server_addr (host:port or etcd://...)")
    p.add_argument("--meta", required=True, help="metadata server (http://.../metadata, etcd://..., P2PHANDSHAKE)")
    p.add_argument("--host", required=True, help="local_hostname: the IP this client serves its segment on")
    p.add_argument("--segment", type=int, default=16 << 20, help="bytes of memory this client contributes")
    p.add_argument("--local-buffer", type=int, default=16 << 20, help="local_buffer_size passed to setup")
    p.add_argument("--threads", type=int, default=2, help="load threads")
    p.add_argument("--keys", type=int, default=1000, help="size of the key space shared by all workers")
    p.add_argument("--key-prefix", default="chaos-", help="prefix of every key")
    p.add_argument("--min-value", type=int, default=1 << 10, help="smallest value, bytes")
    p.add_argument("--max-value", type=int, default=256 << 10, help="largest value, bytes (log-uniform)")
    p.add_argument("--mix", default=DEFAULT_MIX, help=f"op weights (default {DEFAULT_MIX})")
    p.add_argument("--rate", type=float, default=0.0, help="ops/s per thread (0: as fast as possible)")
    p.add_argument("--seed", type=int, default=1, help="random seed (combined with writer/incarnation/thread)")
    p.add_argument("--writer", type=int, required=True, help="this client's slot number")
    p.add_argument("--incarnation", type=int, required=True, help="how many times this slot was started before")
    p.add_argument("--logdir", required=True, help="directory of the op logs")
    p.add_argument("--setup-timeout", type=float, default=60.0, help="give up setup after this many seconds")
    p.add_argument("--stop-timeout", type=float, default=30.0, help="seconds to let running ops finish at stop")
    args = p.parse_args()
    s, attempts = setup_store(args)
    w = Worker(args, s)
    signal.signal(signal.SIGTERM, lambda *_: w.stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), w.stop.set()), daemon=True).start()
    emit({"ready": s.get_hostname(), "pid": os.getpid(), "setup_attempts": attempts})
    stuck = w.run()
    w.log.close()
    # close the store without letting a wedged close hang the exit
    t = threading.Thread(target=s.close, daemon=True)
    t.start()
    t.join(10.0)
    sys.stdout.flush()
    os._exit(4 if stuck else 0)


if __name__ == "__main__":
    main()
