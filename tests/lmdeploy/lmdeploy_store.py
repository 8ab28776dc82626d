"""LMDeploy 0.18's MooncakeStoreConnector on our store, as far as it runs on CPU; print what happened.

Run by test_lmdeploy_backend.py as ``unshare -n <venv python> lmdeploy_store.py``. Brings lo up
with a default route through it (LMDeploy's store worker, like its migration backend, picks its
local hostname from the default route and refuses without one), starts our ``mooncake_master``
with its HTTP metadata server, and then, with LMDeploy's classes unchanged:

1. builds two ``MooncakeStoreConnector(KVConnectorRole.WORKER, ...)`` (a writer, kv_both, and a
   reader, kv_consumer): each creates ``mooncake.store.MooncakeDistributedStore`` (our store, through
   the alias) and calls ``setup(...)`` with the JSON config LMDeploy reads;
2. calls ``register_kv_caches`` with CPU rows: LMDeploy refuses (it registers CUDA rows only) --
   this is where a CPU host stops following LMDeploy's own sequence;
3. continues with the same steps ``register_kv_caches`` takes after that check, on CPU rows of a
   ``CacheEngine``-layout pool: ``_register_buffer`` (our ``register_buffer``),
   ``_prepare_transfer_layout``, the real sender / receiver threads and the lookup server;
4. saves three blocks through ``KVCacheStoreSendingThread`` (``batch_is_exist`` +
   ``batch_put_from_multi_buffers``; the CUDA event that ``start_save_kv`` records is replaced by a
   no-op ``synchronize``), looks them up from the scheduler side through the real
   ``LookupKeyClient`` -> ``LookupKeyServer`` ZMQ RPC (``batch_is_exist``), loads them into other
   blocks of the reader with ``start_load_kv`` (``batch_get_into_multi_buffers``), and loads hashes
   that were never saved (reported as invalid blocks); then ``shutdown``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from mooncake_lab.lmdeploy_node import make_cache_engine  # noqa: E402  (imports the connector: alias installed; the harness's PYTHONPATH shim)

from lmdeploy.messages import KVTransferConfig  # noqa: E402
from lmdeploy.pytorch.disagg.config import EngineRole  # noqa: E402
from lmdeploy.pytorch.kv_connector.base import KVConnectorRole  # noqa: E402
from lmdeploy.pytorch.kv_connector.factory import prepare_kv_connector_config  # noqa: E402
from lmdeploy.pytorch.kv_connector.mooncake.store import MooncakeStoreConnector  # noqa: E402
from lmdeploy.pytorch.kv_connector.mooncake.store.data import (MooncakeStoreConnectorMetadata,  # noqa: E402
                                                               MooncakeStoreLoadRequest, MooncakeStoreRegistration,
                                                               MooncakeStoreSaveRequest)
from lmdeploy.pytorch.kv_connector.mooncake.store.lookup import LookupKeyClient  # noqa: E402

from mooncake_core.utils.net import free_port, wait_for_port  # noqa: E402

LAYERS, BLOCKS, ENTRY = 4, 32, 4096


class CpuReadyEvent:
    """Stands in for the torch.cuda.Event start_save_kv records (the save waits on it)."""

    def synchronize(self) -> None:
        return None


def make(role: str, tmp: str, cfg_path: str, lookup_path: str, seed: int) -> tuple[Any, Any, Any]:
    ce, pool = make_cache_engine(EngineRole.Hybrid, LAYERS, BLOCKS, ENTRY, seed)
    cc = ce.cache_config
    cc.kv_transfer_config = KVTransferConfig(kv_connector="MooncakeStoreConnector", kv_role=role,
                                             kv_connector_extra_config={"mooncake_config_path": cfg_path,
                                                                        "model_name": "tiny-standin",
                                                                        "lookup_rpc_path": lookup_path})
    prepare_kv_connector_config(cc)  # LMDeploy's own preparation (lookup_async for consumers, ...)
    conn = MooncakeStoreConnector(KVConnectorRole.WORKER, cc)
    return conn, cc, pool


def wait_finished(worker: Any, what: str, want: Any, timeout: float = 30) -> dict[str, Any]:
    got: dict[str, Any] = {"completed_save_ids": set(), "finished_receiving": set(), "invalid_block_ids": set()}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = worker.get_finished()
        for k in got:
            got[k] |= set(getattr(out, k) or ())
        if want in got[what]:
            return {k: sorted(v) for k, v in got.items()}
        time.sleep(0.02)
    raise RuntimeError(f"{what} never reported {want}: {got}")


def start_like_register_kv_caches(worker: Any, pool: Any) -> list[str]:
    """The steps of MooncakeStoreWorker.register_kv_caches after its CUDA-only check, on CPU rows
    (one row per layer, like CacheEngine.connector_kv_caches: 'cache_pool.0.row.L')."""
    regs = tuple(MooncakeStoreRegistration(name=f"cache_pool.0.row.{i}", address=int(pool[i].data_ptr()),
                                           size=int(pool[i].numel() * pool[i].element_size())) for i in range(LAYERS))
    for i, reg in enumerate(regs, start=1):
        worker._register_buffer(reg, i, len(regs))
    worker._registered_regions = regs
    worker._row_block_sizes = worker._prepare_transfer_layout(regs)
    worker._start_receiver()
    worker._start_sender()
    worker._start_lookup_server()
    return [r.name for r in regs]


def main() -> int:
    ip = shutil.which("ip") or "/sbin/ip"
    subprocess.run([ip, "link", "set", "lo", "up"], check=True)
    subprocess.run([ip, "route", "add", "default", "dev", "lo", "src", "127.0.0.1"], check=True)
    facts: dict[str, Any] = {}
    tmp = tempfile.mkdtemp(prefix="lmd-store-")
    mport, hport = free_port(), free_port()
    master = subprocess.Popen([sys.executable, "-m", "mooncake_core.store.master_main", "--port", str(mport),
                               "--metrics_port", "0", "--enable_http_metadata_server=true",
                               "--http_metadata_server_host", "127.0.0.1", "--http_metadata_server_port", str(hport)],
                              stdout=open(os.path.join(tmp, "master.log"), "wb"), stderr=subprocess.STDOUT)
    try:
        wait_for_port("127.0.0.1", mport, 30, master)
        wait_for_port("127.0.0.1", hport, 30, master)
        cfg_path = os.path.join(tmp, "mooncake.json")
        with open(cfg_path, "w") as f:  # the file LMDeploy's MooncakeStoreConfig.from_file reads
            json.dump({"metadata_server": f"http://127.0.0.1:{hport}/metadata", "protocol": "tcp",
                       "master_server_address": f"127.0.0.1:{mport}", "device_name": "",
                       "global_segment_size": "64MB", "local_buffer_size": "16MB"}, f)
        lookup_path = f"ipc://{tmp}/lookup.sock"
        writer, wcc, wpool = make("kv_both", tmp, cfg_path, lookup_path, seed=5)
        reader, _, rpool = make("kv_consumer", tmp, cfg_path, f"ipc://{tmp}/lookup-r.sock", seed=6)
        ww, rw = writer.connector_worker, reader.connector_worker
        facts["store_class"] = f"{type(ww.store).__module__}.{type(ww.store).__qualname__}"
        facts["local_hostname"] = ww.store.get_hostname()
        try:
            writer.register_kv_caches({f"cache_pool.0.row.{i}": wpool[i] for i in range(LAYERS)})
            facts["register_kv_caches_cpu"] = "accepted"
        except Exception as e:  # noqa: BLE001 - reported as a fact
            facts["register_kv_caches_cpu"] = f"{type(e).__name__}: {e}"
        facts["rows"] = start_like_register_kv_caches(ww, wpool)
        start_like_register_kv_caches(rw, rpool)

        hashes = tuple(bytes([i]) * 32 for i in (11, 12, 13))
        src_blocks, dst_blocks = (3, 5, 9), (1, 2, 30)
        ww.kv_send_thread.add_request(MooncakeStoreSaveRequest(save_id=1, request_id=7, start_block=0,
                                                               block_ids=src_blocks, logical_block_ids=src_blocks,
                                                               block_hashes=hashes), CpuReadyEvent())
        facts["save"] = wait_finished(ww, "completed_save_ids", 1)
        client = LookupKeyClient(wcc)  # scheduler side: asks the writer's lookup server over ZMQ
        facts["lookup_rpc"] = client.lookup(7, 16 * 3 + 5, hashes, non_block=False)
        facts["lookup_rpc_missing"] = client.lookup(8, 16 * 3, (b"\x99" * 32,) + hashes[1:], non_block=False)
        client.close()
        facts["lookup_reader"] = rw.lookup(16 * 3, hashes)
        rw.start_load_kv(MooncakeStoreConnectorMetadata(load_requests=(
            MooncakeStoreLoadRequest(request_id=21, block_ids=dst_blocks, block_hashes=hashes),)))
        facts["load"] = wait_finished(rw, "finished_receiving", 21)
        facts["load_exact"] = all(bool((wpool[:, s, :] == rpool[:, d, :]).all()) for s, d in zip(src_blocks, dst_blocks))
        before = rpool[:, 7, :].clone()
        rw.start_load_kv(MooncakeStoreConnectorMetadata(load_requests=(
            MooncakeStoreLoadRequest(request_id=22, block_ids=(7,), block_hashes=(b"\x42" * 32,)),)))
        facts["load_missing"] = wait_finished(rw, "finished_receiving", 22)
        facts["load_missing_untouched"] = bool((before == rpool[:, 7, :]).all())
        writer.shutdown() if hasattr(writer, "shutdown") else ww.shutdown()
        reader.shutdown() if hasattr(reader, "shutdown") else rw.shutdown()
        facts["shutdown"] = ww.store is None and rw.store is None
    finally:
        master.kill()
        master.wait(10)
    print(json.dumps({"facts": facts}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
