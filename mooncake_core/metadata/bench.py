"""Metadata backend micro-benchmark: our clients vs. the raw client library, same run.

    python -m mooncake_core.metadata.bench [--etcd HOST:PORT] [--redis HOST:PORT] [--seconds S]

Measures GET and SET operations per second of a ~1 KiB segment descriptor, from 1 and 4
threads, for: our HTTP server + HttpMetadataBackend (reference: a bare http.client
keep-alive request to the same server), etcd (reference: etcd3gw called directly) and Redis
(reference: redis-py called directly). The ratio column is ours / reference, so overhead of
our layer (JSON, validation, error mapping, failover) shows directly. etcd/Redis rows run
only when an endpoint is given (or MOONCAKE_TEST_ETCD / MOONCAKE_TEST_REDIS is set).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import threading
import time
from typing import Callable

from mooncake_core import envs
from mooncake_core.metadata import HttpMetadataServer, open_metadata


def _descriptor() -> dict:
    rng = random.Random(1)
    return {"name": "127.0.0.1:12345", "protocol": "tcp", "tcp_data_port": 12346,
            "buffers": [{"name": f"cpu:{i}", "addr": rng.getrandbits(47), "length": 1 << 30}
                        for i in range(16)], "nonce": rng.randbytes(128).hex()}


def _rate(make_op: Callable[[int], Callable[[int], None]], threads: int, seconds: float) -> float:
    """Operations per second of ``threads`` threads each looping op(i) for ``seconds``."""
    counts = [0] * threads
    stop = time.monotonic() + seconds
    start_gate = threading.Barrier(threads + 1)

    def run(t: int) -> None:
        op = make_op(t)
        op(0)  # warm the connection
        start_gate.wait()
        n = 0
        while time.monotonic() < stop:
            op(n)
            n += 1
        counts[t] = n

    ths = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for th in ths:
        th.start()
    t0 = time.monotonic()
    start_gate.wait()
    for th in ths:
        th.join()
    return sum(counts) / max(1e-9, time.monotonic() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--etcd", default=envs.MOONCAKE_TEST_ETCD or None,
                   help="host:port of an etcd server to include (default: $MOONCAKE_TEST_ETCD)")
    p.add_argument("--redis", default=envs.MOONCAKE_TEST_REDIS or None,
                   help="host:port of a Redis server to include (default: $MOONCAKE_TEST_REDIS)")
    p.add_argument("--seconds", type=float, default=1.0, help="duration of each measurement")
    args = p.parse_args(argv)

    value = _descriptor()
    rows: list[tuple[str, str, int, float, float]] = []
    srv = HttpMetadataServer(port=0).start()
    try:
        targets: list[tuple[str, str]] = [("http", srv.url)]
        if args.etcd:
            targets.append(("etcd", f"etcd://{args.etcd}"))
        if args.redis:
            targets.append(("redis", f"redis://{args.redis}"))
        for name, conn in targets:
            opened = open_metadata(conn)
            assert opened is not None  # not P2PHANDSHAKE
            ours = opened
            key = f"mooncake/ram/bench-{name}"
            ours.set(key, value)

            def ours_get(t: int) -> Callable[[int], None]:
                def op(i: int) -> None:
                    ours.get(key)
                return op

            def ours_set(t: int) -> Callable[[int], None]:
                return lambda i: ours.set(f"{key}-{t}", value)

            ref_get, ref_set = _reference(name, conn, srv, key, value)
            for threads in (1, 4):
                for op, mine, ref in (("GET", ours_get, ref_get), ("SET", ours_set, ref_set)):
                    a = _rate(mine, threads, args.seconds)
                    b = _rate(ref, threads, args.seconds)
                    rows.append((name, op, threads, a, b))
                    print(f"  {name:5s} {op} x{threads}: ours {a:9.0f}/s  reference {b:9.0f}/s  "
                          f"ratio {a / b:5.2f}", flush=True)
            for t in range(4):
                ours.remove(f"{key}-{t}")
            ours.remove(key)
            ours.close()
    finally:
        srv.stop()
    print("\nbackend op threads ours_ops_s ref_ops_s ratio")
    for name, op, threads, a, b in rows:
        print(f"{name} {op} {threads} {a:.0f} {b:.0f} {a / b:.2f}")
    return 0


def _reference(name: str, conn: str, srv: HttpMetadataServer, key: str, value: dict):
    """Per-thread factories for the raw-library GET and SET of the same key and value
    (including the JSON encode/decode, which the caller would have to do too)."""
    if name == "http":
        path_get = f"/metadata?key={key}"

        def mk(method: str, path: str, payload: bytes | None):
            def factory(t: int):
                c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
                p = path if method == "GET" else f"{path}-{t}"

                def op(i: int) -> None:
                    data = None if payload is None else json.dumps(value, separators=(",", ":"))
                    c.request(method, p, body=data)
                    r = c.getresponse()
                    out = r.read()
                    if method == "GET":
                        json.loads(out)
                return op
            return factory
        return mk("GET", path_get, None), mk("PUT", path_get, b"")
    if name == "etcd":
        import etcd3gw
        host, port = conn[len("etcd://"):].split(":")

        def eg(t: int):
            c = etcd3gw.client(host=host, port=int(port), timeout=5)
            return lambda i: json.loads(c.get(key.encode())[0])

        def es(t: int):
            c = etcd3gw.client(host=host, port=int(port), timeout=5)
            return lambda i: c.put(f"{key}-{t}".encode(), json.dumps(value, separators=(",", ":")))
        return eg, es
    import redis
    host, port = conn[len("redis://"):].split(":")
    r = redis.Redis(host=host, port=int(port), socket_timeout=5)
    return (lambda t: (lambda i: json.loads(r.get(key) or b"null"))), \
           (lambda t: (lambda i: r.set(f"{key}-{t}", json.dumps(value, separators=(",", ":")))))


if __name__ == "__main__":
    raise SystemExit(main())
