"""``kv_connector_extra_config`` ``protocol`` / ``device_name`` of our vLLM connector reach the
Transfer Engine unchanged (vllm_device_side.py runs in the vLLM venv)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from mooncake_lab.checkout_shim import shim_pythonpath

pytestmark = pytest.mark.integration

SIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_device_side.py")


def test_protocol_and_device_name_reach_the_engine(vllm_py) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("UCX_TLS", "UCX_NET_DEVICES", "MC_FORCE_TCP")}
    env.update(PYTHONPATH=shim_pythonpath(), PYTHONWARNINGS="ignore")
    r = subprocess.run([vllm_py, SIDE], capture_output=True, text=True, timeout=240, env=env, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    f = json.loads(r.stdout.strip().splitlines()[-1])["facts"]
    assert f["lo"] == {"ucx_rails": ["lo"]}  # protocol rdma on exactly the NIC named
    err = f["unknown"]["error"]
    assert "'rdma'" in err and "device_name 'no_such_nic0': unknown device(s) no_such_nic0" in err
