"""SGLang's own ``MooncakeTransferEngine`` (what ``--disaggregation-ib-device`` and
``MOONCAKE_PROTOCOL`` feed) on our engine through the plugin's alias: which NICs the engine was
started on, as the engine reports it (the UCX rails its descriptor publishes, or its refusal on
stderr). Prints one JSON line of facts; test_sglang_plugin.py checks them."""

from __future__ import annotations

import json
import os
import sys

from mooncake_connectors.sglang.plugin import register

from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import MooncakeTransferEngine


def case(ib_device: str) -> dict:
    try:
        te = MooncakeTransferEngine("127.0.0.1", gpu_id=0, ib_device=ib_device)
    except Exception as e:  # noqa: BLE001 - SGLang's refusal is the observation (the reason is on stderr)
        return {"error": f"{type(e).__name__}: {e}"}
    desc = te.engine.local_descriptor()
    sec = desc.section("ucx", 1) if desc is not None else None
    out = {"engine": type(te.engine).__module__, "ucx_rails": [r["dev"] for r in sec["rails"]] if sec else None}
    te.engine.close()
    return out


def main() -> int:
    os.environ["MOONCAKE_PROTOCOL"] = "rdma"  # SGLang's own variable (its default too)
    facts = {"alias": register(), "plain": case("lo"), "per_gpu_json": case('{"0": "lo", "1": "eth9"}'),
             "unknown": case("no_such_nic0")}
    print(json.dumps({"facts": facts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
