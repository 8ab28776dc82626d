"""Our vLLM connector's worker (``MooncakeCoreConnector``) built from a real ``KVTransferConfig``
whose ``kv_connector_extra_config`` names ``protocol`` and ``device_name``: which NICs its engine
was started on (the UCX rails its descriptor publishes) or the refusal. One JSON line of facts;
test_vllm_device_name.py checks them."""

from __future__ import annotations

import json
import sys
import types

from vllm.config import KVTransferConfig

from mooncake_connectors.vllm.p2p_config import P2PConfig
from mooncake_connectors.vllm.p2p_worker import P2PWorker


def case(device: str) -> dict:
    ktc = KVTransferConfig(kv_connector="MooncakeCoreConnector", kv_role="kv_both", engine_id="e1",
                           kv_connector_extra_config={"protocol": "rdma", "device_name": device})
    # only the parts of VllmConfig that P2PConfig.from_vllm reads besides the KV transfer config
    vc = types.SimpleNamespace(kv_transfer_config=ktc, cache_config=types.SimpleNamespace(block_size=16),
                               parallel_config=types.SimpleNamespace(tensor_parallel_size=1))
    try:
        w = P2PWorker(P2PConfig.from_vllm(vc), 0, 1, None)
    except Exception as e:  # noqa: BLE001 - the refusal is the observation
        return {"error": f"{type(e).__name__}: {e}"}
    desc = w.te.local_descriptor()
    sec = desc.section("ucx", 1) if desc is not None else None
    w.te.close()
    return {"ucx_rails": [r["dev"] for r in sec["rails"]] if sec else None}


def main() -> int:
    print(json.dumps({"facts": {"lo": case("lo"), "unknown": case("no_such_nic0")}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
