"""LMCache engines in one process (real LMCache 0.5.6 code), driven over JSON lines on stdin/stdout.

Run with the LMCache venv's python (the vLLM venv) by tests/lmcache/ and bench/frameworks/bench_lmcache.py.
One process hosts any number of named ``LMCacheEngine`` s (importing LMCache is the slow part
of a start, so the tests open several engines per process). Every engine works on the process's
CPU KV tensor through ``ContiguousCpuKV``; its remote backend is, per ``open``'s ``backend``:

* ``builtin``  LMCache's own ``mooncakestore://`` adapter, unchanged (``--impl ours``: its
  ``import mooncake.store`` resolves to this project via ``mooncake_core.compat.install()``;
  ``--impl original``: to whatever ``mooncake`` package is on the path, e.g. Mooncake 0.3.13);
* ``native``   ``remote_storage_plugins: ["mooncake_core"]`` -> ``MooncakeCoreConnectorAdapter``;
* ``both``     both at once (the double-backend misconfiguration);
* ``disk``     LMCache's local-disk backend (the benchmark's floor; no store involved).

Prints ``{"ready": true}``, then answers one JSON object per command line. Commands (tokens are
``range(first, first + n)``; KV contents derive from ``kv_seed``): ``open`` (name, backend, ...),
``store``, ``lookup``, ``retrieve``, ``ping``, ``lookup_client``, ``close`` (name), ``exit``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from typing import Any

import torch


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", choices=("ours", "original"), default="ours",
                    help="what `import mooncake.store` means for LMCache's built-in adapter")
    ap.add_argument("--master", default="", help="default store master host:port of opened engines")
    ap.add_argument("--meta", default="", help="default metadata server (http://.../metadata)")
    ap.add_argument("--tokens", type=int, default=4096, help="capacity of the CPU KV tensor in tokens")
    ap.add_argument("--layers", type=int, default=4, help="model layers")
    ap.add_argument("--hidden", type=int, default=64, help="KV hidden size per layer (heads x head dim)")
    ap.add_argument("--chunk", type=int, default=256, help="LMCache chunk_size (tokens)")
    return ap.parse_args()


class Engine:
    """One LMCacheEngine and the bookkeeping the driver needs around it."""

    def __init__(self, peer: "Peer", name: str, backend: str, chunk_meta: bool = True, segment: int = 0,
                 cpu_gb: float = 0.05, local_cpu: bool = False, disk_dir: str = "",
                 blocking_timeout: int = 10, master: str = "", meta: str = "", extra: dict | None = None,
                 overrides: dict | None = None):
        from lmcache.v1.cache_engine import LMCacheEngineBuilder
        from lmcache.v1.config import LMCacheEngineConfig

        from mooncake_connectors.lmcache import ContiguousCpuKV

        a = peer.a
        self.name, self.peer = name, peer
        x: dict[str, Any] = {"local_hostname": "127.0.0.1", "metadata_server": meta or a.meta,
                             "master_server_address": master or a.master, "global_segment_size": str(segment),
                             "local_buffer_size": "16MB", "protocol": "tcp", "save_chunk_meta": chunk_meta}
        base: dict[str, Any] = {"chunk_size": a.chunk, "local_cpu": local_cpu, "max_local_cpu_size": cpu_gb,
                                "remote_serde": "naive", "blocking_timeout_secs": blocking_timeout,
                                "save_unfull_chunk": True}
        if backend in ("native", "both"):
            x["remote_storage_plugin.mooncake_core.module_path"] = "mooncake_connectors.lmcache"
            x["remote_storage_plugin.mooncake_core.class_name"] = "MooncakeCoreConnectorAdapter"
            base["remote_storage_plugins"] = ["mooncake_core"]
        if backend in ("builtin", "both"):
            base["remote_url"] = "mooncakestore://127.0.0.1:1/"  # LMCache never reads host/port
        if backend == "disk":
            base.update(local_disk=f"file://{disk_dir}/", max_local_disk_size=64.0)
            x = {}
        x.update(extra or {})
        if "gpu_to_numa_mapping" in x:  # JSON turned the GPU ids into strings; LMCache wants ints
            x["gpu_to_numa_mapping"] = {int(k): v for k, v in x["gpu_to_numa_mapping"].items()}
        base.update(overrides or {})
        self.config = LMCacheEngineConfig.from_dict(dict(base, extra_config=x))
        self.engine = LMCacheEngineBuilder.get_or_create(name, self.config, peer.metadata,
                                                         ContiguousCpuKV(peer.kv), lambda t, s: t,
                                                         lambda o, s: o)
        self.engine.post_init()
        self._pending = 0
        self._lock = threading.Lock()
        for b in self.remotes():
            self._count_puts(b)

    def remotes(self) -> list[Any]:
        from lmcache.v1.storage_backend import RemoteBackend

        return [b for b in self.engine.storage_manager.storage_backends.values() if isinstance(b, RemoteBackend)]

    def _count_puts(self, backend: Any) -> None:
        """Count the batched puts LMCache submits and the ones its connector finished: LMCache's
        puts are asynchronous and it offers no way to wait for them (its own ``put_tasks`` set
        tracks only unbatched puts). Submission is counted synchronously, completion when the
        connector's coroutine returns."""
        conn = backend.connection
        if conn is None or not conn.support_batched_put():
            return
        submit, put = backend.batched_submit_put_task, conn.batched_put

        def counted_submit(*args: Any, **kw: Any) -> Any:
            with self._lock:
                self._pending += 1
            try:
                return submit(*args, **kw)
            except BaseException:
                with self._lock:
                    self._pending -= 1
                raise

        async def counted_put(*args: Any, **kw: Any) -> Any:
            try:
                return await put(*args, **kw)
            finally:
                with self._lock:
                    self._pending -= 1

        backend.batched_submit_put_task = counted_submit
        conn.batched_put = counted_put

    def drain(self, timeout: float) -> bool:
        """Wait until every remote (and local-disk) put LMCache submitted has finished."""
        deadline = time.monotonic() + timeout
        disks = [b.disk_worker for b in self.engine.storage_manager.storage_backends.values()
                 if hasattr(b, "disk_worker")]
        while self._pending > 0 or any(b.put_tasks for b in self.remotes()) or any(d.put_tasks for d in disks):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)
        return True

    def info(self) -> dict:
        return {"backends": list(self.engine.storage_manager.storage_backends),
                "remote": [b.connection is not None for b in self.remotes()]}


class Peer:
    def __init__(self, a: argparse.Namespace):
        from lmcache.v1.metadata import LMCacheMetadata

        self.a = a
        self.metadata = LMCacheMetadata(model_name="tiny", world_size=1, local_world_size=1, worker_id=0,
                                        local_worker_id=0, kv_dtype=torch.float16,
                                        kv_shape=(a.layers, 2, a.chunk, 1, a.hidden))
        self.kv = torch.zeros(2, a.layers, a.tokens, a.hidden, dtype=torch.float16)
        self.engines: dict[str, Engine] = {}
        self._expected_cache: tuple[int, int, torch.Tensor] | None = None

    def _expected(self, kv_seed: int, n: int) -> torch.Tensor:
        """KV of tokens [0, n) for ``kv_seed``: every element of every token differs from its
        neighbours (a misplaced token, layer or K/V half shows), values are small integers
        (exact in fp16), and a prefix never depends on n. Cheap enough for GBs (benchmark)."""
        c = self._expected_cache
        if c is not None and c[0] == kv_seed and c[1] >= n:
            return c[2][:, :, :n]
        per_token = 2 * self.a.layers * self.a.hidden
        elem = torch.arange(per_token, dtype=torch.int32).mul_(7)
        tok = torch.arange(n, dtype=torch.int32).mul_(131).add_(977 * kv_seed)
        t = (tok[:, None] + elem[None, :]).remainder_(2039).to(torch.float16)
        t = t.view(n, 2, self.a.layers, self.a.hidden).permute(1, 2, 0, 3)
        self._expected_cache = (kv_seed, n, t)
        return t

    # ------------------------------------------------------------------ commands
    def open(self, name: str, **kw: Any) -> dict:
        t0 = time.perf_counter()
        e = Engine(self, name, **kw)
        self.engines[name] = e
        return dict(e.info(), secs=time.perf_counter() - t0)

    def store(self, name: str, first: int, n: int, kv_seed: int, timeout: float = 120.0) -> dict:
        e = self.engines[name]
        self.kv[:, :, :n].copy_(self._expected(kv_seed, n))
        t0 = time.perf_counter()
        e.engine.store(list(range(first, first + n)))
        drained = e.drain(timeout)
        return {"secs": time.perf_counter() - t0, "drained": drained}

    def lookup(self, name: str, first: int, n: int) -> dict:
        t0 = time.perf_counter()
        hit = self.engines[name].engine.lookup(list(range(first, first + n)))
        return {"hit": int(hit), "secs": time.perf_counter() - t0}

    def retrieve(self, name: str, first: int, n: int, kv_seed: int, check: bool = True) -> dict:
        self.kv.zero_()
        t0 = time.perf_counter()
        mask = self.engines[name].engine.retrieve(list(range(first, first + n)))
        secs = time.perf_counter() - t0
        got = int(mask.sum())
        exact = bool(torch.equal(self.kv[:, :, :got], self._expected(kv_seed, got))) if check else None
        return {"got": got, "exact": exact, "secs": secs}

    def ping(self, name: str) -> dict:
        out = []
        for b in self.engines[name].remotes():
            c = b.connection
            if c is None or not c.support_ping():
                out.append(None)
                continue
            out.append(asyncio.run_coroutine_threadsafe(c.ping(), b.loop).result(30))
        return {"ping": out}

    def lookup_client(self, master: str, ranges: list[list[int]], name: str = "") -> dict:
        """LMCache's scheduler-side ``MooncakeLookupClient`` (a segment-less store, one
        ``batch_is_exist`` per lookup): prefix tokens found for each (first, n)."""
        from lmcache.v1.lookup_client.mooncake_lookup_client import MooncakeLookupClient

        cfg = self.engines[name].config if name else next(iter(self.engines.values())).config
        client = MooncakeLookupClient(cfg, self.metadata, master or self.a.master)
        try:
            t0 = time.perf_counter()
            hits = [int(client.lookup(list(range(f, f + n)))) for f, n in ranges]
            return {"hits": hits, "secs": time.perf_counter() - t0}
        finally:
            client.store.close()

    def close(self, name: str) -> dict:
        from lmcache.v1.cache_engine import LMCacheEngineBuilder

        t0 = time.perf_counter()
        self.engines.pop(name)
        LMCacheEngineBuilder.destroy(name)
        return {"secs": time.perf_counter() - t0}


def main() -> None:
    a = _args()
    # the protocol owns the real stdout; anything libraries print goes to stderr (the log)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if a.impl == "ours":
        from mooncake_core import compat

        compat.install()
    t0 = time.perf_counter()
    import lmcache.v1.cache_engine  # noqa: F401 - the slow import, before "ready"

    peer = Peer(a)
    print(json.dumps({"ready": True, "secs": time.perf_counter() - t0}), file=out, flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        if op == "exit":
            break
        try:
            reply = getattr(peer, op)(**cmd)
        except Exception as e:  # noqa: BLE001 - report to the driver, keep serving
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), file=out, flush=True)
    for name in list(peer.engines):
        try:
            peer.close(name)
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
    out.flush()
    os._exit(0)  # LMCache leaves non-daemon threads behind; the driver waits for our exit


if __name__ == "__main__":
    main()
