"""Frameworks' own store code on the store as a service (master + ``mooncake_client``).

vLLM's ``MooncakeStoreConnector`` in ``standalone-store`` mode: each rank is a full client that
contributes no memory (``global_segment_size`` 0), so what it stores lives in the node's
``mooncake_client`` and outlives the engine. The rank is set up here by vLLM's own
``vllm/distributed/mooncake_store.py`` (its config file reader and ``setup_mooncake_store``),
in the vLLM venv, on this package's ``mooncake.store``.

SGLang HiCache's standalone storage: its ``MooncakeStore`` with ``standalone_storage`` and
``client_server_address`` attaches with ``setup_dummy``, its host KV pool allocated by its
``MooncakeHostTensorAllocator`` (our ``MooncakeHostMemAllocator``: memory the service can map),
and moves pages with its own zero-copy batch methods, in the SGLang venv.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest
from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.venvs import venv_dir, venv_python

from mooncake_core.utils.net import free_port
from tests.store.test_dummy_service import _client, _stop

pytestmark = pytest.mark.integration


@pytest.fixture
def service(master_factory, python_exe, tmp_path):
    """(master, port) of a running ``mooncake_client`` on a fresh master."""
    m = master_factory()
    port = free_port()
    svc = _client(python_exe, m, port, str(tmp_path / "client.log"))
    yield m, port
    _stop(svc)


def _framework_python(name: str) -> str:
    py = venv_python(name)
    if not py.exists():
        pytest.skip(f"no {name} venv at {venv_dir(name)} (scripts/install_{name}.sh)")
    return str(py)


def _reader(port: int):
    """A dummy client of the service (the next engine on the node)."""
    from mooncake_core.store.client import MooncakeDistributedStore

    reader = MooncakeDistributedStore()
    assert reader.setup_dummy(4 << 20, 4 << 20, f"127.0.0.1:{port}") == 0
    return reader

#: run in the vLLM venv: vLLM's module is loaded from its file (its package __init__ would import
#: the whole engine, torch included, for two functions that need neither)
_VLLM_RANK = textwrap.dedent("""
    import importlib.util, json, os, sys
    import vllm
    path = os.path.join(os.path.dirname(vllm.__file__), "distributed", "mooncake_store.py")
    spec = importlib.util.spec_from_file_location("vllm_mooncake_store", path)
    ms = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ms)
    from mooncake_core import compat
    compat.install()
    from mooncake.store import MooncakeDistributedStore
    cfg = ms.MooncakeStoreConfig.load_from_config()   # MOONCAKE_CONFIG_PATH
    store = MooncakeDistributedStore()
    ms.setup_mooncake_store(store, cfg, "127.0.0.1")  # raises unless setup answered 0
    rcs = [store.put(f"vllm-block-{i}", bytes([i]) * (256 << 10)) for i in range(8)]
    print(json.dumps({"mode": cfg.mode, "rcs": rcs}), flush=True)
    store.close()
""")


#: run in the SGLang venv: HiCache's MooncakeStore in standalone mode, constructed as HiCache
#: does (storage config with extra_config; the host pool's allocator and kv_buffer are what the
#: standalone path reads of HiCache's host pool)
_SGLANG_RANK = textwrap.dedent("""
    import json, sys, types
    import torch
    from mooncake_core import compat
    compat.install()
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import (
        MooncakeHostTensorAllocator, MooncakeStore)
    alloc = MooncakeHostTensorAllocator()
    kv = alloc.allocate((8, 64 << 10), torch.uint8)          # 8 pages of 64 KiB
    pool = types.SimpleNamespace(allocator=alloc, kv_buffer=kv)
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                               is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                               model_name="tiny", extra_config={"standalone_storage": True,
                                                                "client_server_address": sys.argv[1]})
    st = MooncakeStore(cfg, pool)                             # setup_dummy + its warm-up put/get
    st.register_buffer(kv)
    for i in range(8):
        kv[i].fill_(i + 1)
    keys = [f"hicache-page-{i}" for i in range(8)]
    ptrs = [kv[i].data_ptr() for i in range(8)]
    put = st._put_batch_zero_copy_impl(keys, ptrs, [64 << 10] * 8)
    kv.zero_()
    got = st._get_batch_zero_copy_impl(keys, ptrs, [64 << 10] * 8)
    ok = all(bool((kv[i] == i + 1).all()) for i in range(8))
    print(json.dumps({"put": put, "got": got, "ok": ok}), flush=True)
    st.close()
""")


def test_sglang_hicache_standalone_storage_attaches_as_a_dummy(service) -> None:
    spy = _framework_python("sglang")
    _, port = service
    env = dict(os.environ, PYTHONPATH=shim_pythonpath())
    r = subprocess.run([spy, "-c", _SGLANG_RANK, f"127.0.0.1:{port}"], env=env, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.splitlines()[-1]) == {"put": [0] * 8, "got": [64 << 10] * 8, "ok": True}
    reader = _reader(port)  # the pages outlived the SGLang process
    try:
        assert [reader.get(f"hicache-page-{i}") == bytes([i + 1]) * (64 << 10) for i in range(8)] == [True] * 8
    finally:
        reader.close()


def test_vllm_standalone_store_mode_keeps_blocks_in_the_service(service, tmp_path) -> None:
    vpy = _framework_python("vllm")
    m, port = service
    conf = tmp_path / "mooncake.json"
    conf.write_text(json.dumps({"mode": "standalone-store", "global_segment_size": 0,
                                "local_buffer_size": "64MB", "protocol": "tcp", "device_name": "",
                                "master_server_address": m.addr, "metadata_server": m.meta}))
    env = dict(os.environ, PYTHONPATH=shim_pythonpath(), MOONCAKE_CONFIG_PATH=str(conf))
    r = subprocess.run([vpy, "-c", _VLLM_RANK], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.splitlines()[-1]) == {"mode": "standalone-store", "rcs": [0] * 8}
    # the rank has exited; its blocks are in the service's segment, readable by the next
    # engine attached to the service
    reader = _reader(port)
    try:
        for i in range(8):
            assert reader.get(f"vllm-block-{i}") == bytes([i]) * (256 << 10), i
        segments = {d.segment_name for d in reader.get_replica_desc("vllm-block-0")}
        assert segments == {reader.get_hostname()}, segments
    finally:
        reader.close()
