"""The vLLM plugin entry point, run in the real vLLM venv: idempotent registration, lookup by
name and through ``kv_connector_module_path``, and the ``mooncake`` alias for vLLM's built-ins."""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = pytest.mark.integration

SCRIPT = r"""
import json, importlib.metadata as md
eps = [e for e in md.entry_points(group="vllm.general_plugins") if e.value.startswith("mooncake_connectors")]
from vllm.plugins import load_general_plugins
load_general_plugins(); load_general_plugins()          # vLLM may call it more than once per process
from mooncake_connectors.vllm import register
again = register()                                       # and a direct call after that: no error, no-op
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.config.kv_transfer import KVTransferConfig
by_name = {n: KVConnectorFactory.get_connector_class_by_name(n).__name__
           for n in ("MooncakeCoreConnector", "MooncakeCoreStoreConnector")}
via_path = KVConnectorFactory.get_connector_class(KVTransferConfig(
    kv_connector="MooncakeCoreConnector", kv_role="kv_both",
    kv_connector_module_path="mooncake_connectors.vllm")).__name__
import mooncake.engine, mooncake.store
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as builtin
print(json.dumps({"eps": [e.value for e in eps], "again": again, "by_name": by_name, "via_path": via_path,
                  "alias": mooncake.engine.TransferEngine.__module__,
                  "store_alias": mooncake.store.MooncakeDistributedStore.__module__,
                  "builtin_engine": builtin.TransferEngine.__module__}))
"""


def test_plugin_registers_idempotently_and_installs_the_alias(vllm_py):
    r = subprocess.run([vllm_py, "-c", SCRIPT], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["eps"] == ["mooncake_connectors.vllm.plugin:register"]
    assert out["again"] == []
    assert out["by_name"] == {"MooncakeCoreConnector": "MooncakeCoreConnector",
                              "MooncakeCoreStoreConnector": "MooncakeCoreStoreConnector"}
    assert out["via_path"] == "MooncakeCoreConnector"
    assert out["alias"] == "mooncake_core.engine"
    assert out["store_alias"].startswith("mooncake_core.store")
    assert out["builtin_engine"] == "mooncake_core.engine"  # vLLM's own connector imports ours
