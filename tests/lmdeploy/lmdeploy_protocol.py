"""LMDeploy's own ``DistServeInitRequest`` (its ``MigrationProtocol``) through our backend's
``p2p_initialize``: which protocol / devices the engine was started with, as the engine itself
reports it (the UCX rails its descriptor publishes, one per NIC group, or its refusal). Facts, no verdicts (test_lmdeploy_backend.py checks).

Each case gets a fresh process engine; ``MOONCAKE_LMDEPLOY_DEVICE`` is set per case.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from mooncake_lab.lmdeploy_node import make_cache_engine  # noqa: F401  (imports the connector, then LMDeploy)

from lmdeploy.pytorch.disagg.config import DistServeEngineConfig  # noqa: E402
from lmdeploy.pytorch.disagg.conn.protocol import DistServeInitRequest, MigrationProtocol  # noqa: E402

from mooncake_connectors.lmdeploy.backend import MooncakeCoreBackend  # noqa: E402
from mooncake_connectors.lmdeploy.process_engine import ProcessEngine  # noqa: E402

LOCAL, REMOTE = "http://127.0.0.1:23333", "http://127.0.0.1:23334"


def init(protocol: MigrationProtocol) -> DistServeInitRequest:
    cfg = DistServeEngineConfig(tp_size=1, ep_size=1, dp_size=1, pp_size=None, dp_rank=0, block_size=16,
                                num_cpu_blocks=0, num_gpu_blocks=4)
    return DistServeInitRequest(protocol=protocol, local_engine_id=LOCAL, remote_engine_id=REMOTE, rank=0,
                                local_engine_config=cfg, remote_engine_config=cfg)


def case(protocol: MigrationProtocol, device: str) -> dict[str, Any]:
    os.environ["MOONCAKE_LMDEPLOY_DEVICE"] = device
    backend = MooncakeCoreBackend(ProcessEngine())
    try:
        backend.p2p_initialize(init(protocol))
    except Exception as e:  # noqa: BLE001 - the refusal is the observation
        return {"error": f"{type(e).__name__}: {e}"}
    desc = backend.links[REMOTE].engine.local_descriptor()
    sec = desc.section("ucx", 1) if desc is not None else None  # what the engine publishes for UCX peers
    out = {"ucx_rails": [r["dev"] for r in sec["rails"]] if sec else None}
    backend.p2p_drop_connect(REMOTE)
    return out


def main() -> int:
    facts = {"rdma_lo": case(MigrationProtocol.RDMA, "lo"),
             "rdma_unknown_nic": case(MigrationProtocol.RDMA, "no_such_nic0"),
             "tcp": case(MigrationProtocol.TCP, "lo"),
             "rdma_no_device_given": case(MigrationProtocol.RDMA, ""),
             "rdma_devices_here": sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir(
                 "/sys/class/infiniband") else []}
    print(json.dumps({"facts": facts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
