#!/usr/bin/env python3
"""How the proxy learns what the Mooncake Store holds: key events vs batch_is_exist queries.

A real ``mooncake_master`` process; a writer puts connector block keys (chained, 16-token
blocks), and each view (``mooncake_proxy/store_view.py``) is measured in the same run:

* staleness: time from ``put_end`` / ``remove`` returning to the view reporting the change
  (p50 / p99 over ``--samples`` changes);
* lookup cost on the request path: mean microseconds of ``prefix_len`` for a
  ``--blocks``-block prompt drawn from ``--prefixes`` shared prefixes at ``--rate`` lookups/s
  (the query view pays a master round trip whenever its cache entry expired);
* master load: RPCs per second the view sends while the cluster serves that rate.

The event view is the reference: the query view's figures are printed as ratios to it.

    python3 -m bench.scheduling.bench_store_view                 # ~15 s
    python3 -m bench.scheduling.bench_store_view --samples 100 --seconds 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time

from mooncake_core.store.master_client import MasterClient
from mooncake_core.store.protocol import ReplicateConfigMsg
from mooncake_core.utils.net import free_port
from mooncake_core.utils.proc import stop_process
from mooncake_proxy.store_view import StoreBlockHasher, StoreEventView, StoreQueryView, store_key


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def _lag(view, h: list[int], want: int, what: str) -> float:
    """Seconds until ``view`` reports ``want`` leading blocks of ``h``."""
    t0 = time.perf_counter()
    while view.prefix_len(h) != want:
        if time.perf_counter() - t0 > 5:
            raise SystemExit(f"the view never showed {what}")
        time.sleep(0.0005)
    return time.perf_counter() - t0


def staleness(view, c: MasterClient, hasher: StoreBlockHasher, samples: int, tag: str) -> list[float]:
    """Lag (s) between a put/remove returning and the view showing it."""
    lags: list[float] = []
    for i in range(samples):
        h = hasher.hash_tokens([hash((tag, i)) & 0xFFFF] * hasher.block_size)[:1]
        k = store_key(h[0])
        c.put_start("writer", k, 4096, ReplicateConfigMsg())
        c.put_end("writer", k)
        lags.append(_lag(view, h, 1, f"{tag}: the put of {k}"))
        c.remove(k)
        lags.append(_lag(view, h, 0, f"{tag}: the removal of {k}"))
    return lags


def lookups(view, prompts: list[list[int]], rate: float, seconds: float) -> tuple[float, int]:
    """Mean lookup time (us) at ``rate`` lookups/s for ``seconds``; number of lookups."""
    rng = random.Random(1)
    spent, n = 0.0, 0
    end = time.perf_counter() + seconds
    gap = 1.0 / rate
    nxt = time.perf_counter()
    while nxt < end:
        now = time.perf_counter()
        if now < nxt:
            time.sleep(nxt - now)
        p = prompts[rng.randrange(len(prompts))]
        t0 = time.perf_counter()
        view.prefix_len(p)
        spent += time.perf_counter() - t0
        n += 1
        nxt += gap
    return spent / max(1, n) * 1e6, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=30, help="put+remove changes timed per view")
    ap.add_argument("--blocks", type=int, default=64, help="blocks per looked-up prompt (16 tokens each)")
    ap.add_argument("--prefixes", type=int, default=50, help="distinct prompts looked up")
    ap.add_argument("--rate", type=float, default=200.0, help="lookups per second (the proxy's request rate)")
    ap.add_argument("--seconds", type=float, default=4.0, help="duration of the lookup phase per view")
    ap.add_argument("--poll-ms", type=float, default=20.0, help="event view: pull interval")
    ap.add_argument("--ttl-ms", type=float, default=500.0, help="query view: cache lifetime of an answer")
    a = ap.parse_args()

    port, mport = free_port(), free_port()
    master = subprocess.Popen([sys.executable, "-m", "mooncake_core.store.master_main", f"--port={port}",
                               "--rpc_address=127.0.0.1", f"--metrics_port={mport}", "--client_ttl=3600"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    addr = f"127.0.0.1:{port}"
    try:
        c = MasterClient(addr, timeout=5)
        deadline = time.monotonic() + 20
        while True:
            try:
                c.ping()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise SystemExit("master did not start")
                time.sleep(0.1)
        c.mount_segment("writer", "127.0.0.1:7001", 0x7F0000000000, 1 << 30)
        hasher = StoreBlockHasher("bench-model|torch.float32", 16)
        prompts = [hasher.hash_tokens([p] * 16 * a.blocks) for p in range(a.prefixes)]
        for p in prompts[: a.prefixes // 2]:  # half the prompts are in the store, to half their length
            for h in p[: a.blocks // 2]:
                c.put_start("writer", store_key(h), 4096, ReplicateConfigMsg())
                c.put_end("writer", store_key(h))
        rows = {}
        for name in ("events", "query"):
            if name == "events":
                view = StoreEventView(addr, poll_s=a.poll_ms / 1e3).start()
            else:
                view = StoreQueryView(addr, ttl_s=a.ttl_ms / 1e3)
            try:
                lags = staleness(view, c, hasher, a.samples, name)
                before = view.state.events if name == "events" else view.queries
                t0 = time.perf_counter()
                us, n = lookups(view, prompts, a.rate, a.seconds)
                dt = time.perf_counter() - t0
                rpcs = (dt / view.poll_s) if name == "events" else (view.queries - before)
                rows[name] = (statistics.median(lags) * 1e3, pct(lags, 99) * 1e3, us, rpcs / dt, n)
            finally:
                view.stop()
        print(f"master {addr}; {a.samples} put+remove changes; {a.prefixes} prompts of {a.blocks} blocks "
              f"at {a.rate:g} lookups/s; poll {a.poll_ms:g} ms, ttl {a.ttl_ms:g} ms")
        print(f"{'view':8} {'stale p50 ms':>13} {'stale p99 ms':>13} {'lookup us':>10} {'master RPC/s':>13}")
        for name, (p50, p99, us, rps, _) in rows.items():
            print(f"{name:8} {p50:13.2f} {p99:13.2f} {us:10.1f} {rps:13.1f}")
        e, q = rows["events"], rows["query"]
        print(f"query/events: staleness p50 {q[0] / e[0]:.2f}x, lookup cost {q[2] / e[2]:.1f}x, "
              f"master RPCs {q[3] / max(e[3], 1e-9):.2f}x")
    finally:
        stop_process(master, 5)


if __name__ == "__main__":
    main()
