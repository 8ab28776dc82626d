"""Both migration backends under LMDeploy's CacheEngine in one process, and LMDeploy's store connector.

lmdeploy_inproc.py and lmdeploy_store.py (LMDeploy venv, ``unshare -n``) report facts; the checks
are here. What LMDeploy's own backend does is asserted too: it is the baseline our backend has to
beat (and the reason ours exists), so a change in LMDeploy's behaviour should be noticed.
"""

from __future__ import annotations

import os

import pytest

from lmdeploy_harness import HERE, run_venv_json, venv_env

pytestmark = pytest.mark.integration


def test_cache_engine_pd_methods_on_both_backends(lmdeploy_python, netns) -> None:
    f = run_venv_json(lmdeploy_python, [os.path.join(HERE, "lmdeploy_inproc.py")], timeout=180, prefix=netns,
                      env=venv_env(MC_FORCE_TCP="1"))["facts"]
    assert f["force_tcp"] == "1"
    # ours: 8 proxy retries of one pair -> one link, one engine, each pool registered once
    r = f["ours_retries"]
    assert r == {"links": 1, "sessions": 1, "engine_users": 2, "registered": 2, "live_engines": 1}, r
    m = f["ours_migrate"]
    assert m["outcome"] == "ok" and m["exact"] and m["untouched"], m
    e = f["ours_errors"]
    assert "http://127.0.0.1:23333" in e["out_of_bounds"] and "past the end" in e["out_of_bounds"]
    assert "http://10.9.9.9:1" in e["unknown_peer"] and "no link" in e["unknown_peer"]
    assert "not connected" in e["not_connected"]
    assert f["kv_location"] == "cpu:0"
    # p2p_drop_connect: both links gone -> the engine is closed and nothing stays registered
    assert f["ours_drop"] == {"returns": [True, True, False], "engine": False, "registered": 0, "live_engines": 0}

    # LMDeploy's own backend on our engine: its preconditions, its engines, its loop
    ref = f["theirs_refusals"]
    assert "Can not get local ip" in ref["no_route"]
    assert "No RDMA devices available" in ref["no_ibv_devices"]
    assert f["theirs_retries"]["live_engines"] == 16  # 8 retries x 2 sides, none closed
    tm = f["theirs_migrate"]
    assert tm["outcome"] == "ok" and tm["exact"]
    assert tm["max_loop_stall"] > 0.5 * tm["seconds"]  # it holds the event loop for the whole migration
    assert m["max_loop_stall"] < 0.5 * m["seconds"] or m["max_loop_stall"] < 0.05  # ours does not
    assert f["theirs_async"]["outcome"] == "no return"  # LMDEPLOY_USE_ASYNC_MIGRATION=1: awaits forever


def test_lmdeploys_store_connector_on_our_store_as_far_as_cpu_goes(lmdeploy_python, netns) -> None:
    f = run_venv_json(lmdeploy_python, [os.path.join(HERE, "lmdeploy_store.py")], timeout=120, prefix=netns)["facts"]
    assert f["store_class"] == "mooncake_core.store.client.MooncakeDistributedStore"  # through the alias
    assert f["local_hostname"].startswith("127.0.0.1:")
    assert "must be a CUDA tensor" in f["register_kv_caches_cpu"]  # where LMDeploy's own sequence stops on CPU
    assert f["rows"] == [f"cache_pool.0.row.{i}" for i in range(4)]
    assert f["save"]["completed_save_ids"] == [1] and f["save"]["invalid_block_ids"] == []
    assert f["lookup_rpc"] == 48 and f["lookup_reader"] == 48  # 3 full blocks of 16 tokens
    assert f["lookup_rpc_missing"] == 0  # the first block's key is absent: no prefix hit
    assert f["load"]["finished_receiving"] == [21] and f["load"]["invalid_block_ids"] == []
    assert f["load_exact"] is True
    assert f["load_missing"]["invalid_block_ids"] == [7] and f["load_missing_untouched"] is True
    assert f["shutdown"] is True


def test_migration_protocol_and_devices_reach_the_engine(lmdeploy_python) -> None:
    """LMDeploy's DistServeInitRequest through our p2p_initialize: RDMA on MOONCAKE_LMDEPLOY_DEVICE
    starts the engine's UCX transport on exactly that NIC, an unknown NIC is refused naming it,
    TCP starts no UCX; RDMA with no device on a host without RDMA devices runs tcp."""
    env = {k: v for k, v in venv_env(MC_FORCE_TCP="").items() if k not in ("UCX_TLS", "UCX_NET_DEVICES")}
    f = run_venv_json(lmdeploy_python, [os.path.join(HERE, "lmdeploy_protocol.py")], timeout=180, env=env)["facts"]
    assert f["rdma_lo"] == {"ucx_rails": ["lo"]}
    err = f["rdma_unknown_nic"]["error"]
    assert err.startswith("EngineStartError") and "protocol 'rdma', device_name 'no_such_nic0'" in err
    assert "unknown device(s) no_such_nic0" in err  # the engine's own check of the name it was given
    assert f["tcp"] == {"ucx_rails": None}
    if not f["rdma_devices_here"]:
        assert f["rdma_no_device_given"] == {"ucx_rails": None}
    else:  # as LMDeploy's own backend: the RDMA device at rank 0
        assert f["rdma_no_device_given"]["ucx_rails"] == [f["rdma_devices_here"][0]]
