"""One HiCache client: SGLang's real ``MooncakeStore`` (``--hicache-storage-backend mooncake``)
on our store, run by tests/sglang/test_sglang_hicache.py with the SGLang venv's python.

``--role writer`` backs pages of a host KV pool up to the store (``batch_set_v1``); ``--role
reader`` -- another process, another store client -- checks ``batch_exists`` / ``exists`` and
prefetches the pages into different host slots (``batch_get_v1``), then compares them byte for
byte with what the writer generated from the same seed. The host pool is a minimal
page-first stand-in for SGLang's ``HostKVCache`` (the interface ``MooncakeStore`` reads: a
``kv_buffer``, ``page_size``, ``layout``, ``get_page_buffer_meta``, ``get_ksize_per_token``),
because SGLang's real host pools need a device KV pool that cannot be built without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


class PageFirstHostPool:
    """Host pool with ``pages`` slots of (K, V) entries of ``entry_bytes`` each, page_size 1."""

    layout = "page_first"
    page_size = 1

    def __init__(self, pages: int, entry_bytes: int):
        import torch

        self.entry_bytes = entry_bytes
        self.kv_buffer = torch.zeros((pages, 2, entry_bytes), dtype=torch.uint8)

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        for idx in indices:
            for kv in (0, 1):
                ptrs.append(self.kv_buffer[int(idx), kv].data_ptr())
                sizes.append(self.entry_bytes)
        return ptrs, sizes

    def get_ksize_per_token(self) -> int:
        return 2 * self.entry_bytes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=["writer", "reader"], required=True, help="which client to run")
    p.add_argument("--master", required=True, help="our mooncake_master address host:port")
    p.add_argument("--keys", type=int, default=12, help="number of page keys")
    p.add_argument("--entry-bytes", type=int, default=8192, help="bytes of one K (or V) entry of a page")
    p.add_argument("--seed", type=int, default=5, help="seed of the page contents (writer and reader agree)")
    p.add_argument("--prefix", default="hicache-test", help="key prefix")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    import numpy as np
    import torch

    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    cfg = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name="test/model",
        extra_config={"master_server_address": a.master, "metadata_server": "P2PHANDSHAKE",
                      "protocol": "tcp", "device_name": "", "local_hostname": "127.0.0.1",
                      "global_segment_size": 64 << 20, "check_server": False})
    store = MooncakeStore(cfg)  # setup + warmup put/get through our store
    emit(event="setup", store_class=type(store.store).__module__)
    n, eb = a.keys, a.entry_bytes
    pool = PageFirstHostPool(2 * n + 2, eb)
    store.register_mem_pool_host(pool)
    keys = [f"{a.prefix}-{i}" for i in range(n)]
    expected = np.random.default_rng(a.seed).integers(0, 256, (n, 2, eb), dtype=np.uint8)

    if a.role == "writer":
        pool.kv_buffer[:n] = torch.from_numpy(expected)
        ok = store.batch_set_v1(keys, torch.arange(n))
        again = store.batch_set_v1(keys[:2], torch.arange(2))  # existing keys: skipped, still True
        emit(event="result", role="writer", ok=all(ok) and all(again), set=ok,
             exists=store.batch_exists(keys))
        # keep this client (and so its memory segment, where the replicas live) up until told to stop
        sys.stdin.read()
        return 0

    exists = store.batch_exists(keys)
    missing = store.exists(f"{a.prefix}-missing")
    got = store.batch_get_v1(keys, torch.arange(n, 2 * n))
    data = pool.kv_buffer[n:2 * n].numpy()
    bad = [i for i in range(n) if not np.array_equal(data[i], expected[i])]
    partial = store.batch_exists(keys[: n // 2] + [f"{a.prefix}-missing"] + keys[n // 2:])
    emit(event="result", role="reader", ok=all(got) and not bad and exists == n and not missing,
         exists=exists, missing_exists=missing, got=got, bad_pages=bad, prefix_hits=partial)
    return 0


if __name__ == "__main__":
    sys.exit(main())
