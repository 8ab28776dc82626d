"""The KV endpoint a migration backend advertises, and the address this process advertises it on.

Pure logic (no LMDeploy import), unit-tested in tests/lmdeploy/test_lmdeploy_endpoint.py.

Wire format: exactly the fields of LMDeploy 0.18's own ``MooncakeBackend.endpoint_info``
(``lmdeploy/pytorch/disagg/backend/mooncake.py``)::

    {"mr_info": {"<mr_key>": {"addr": int, "length": int, "offset": int}, ...},
     "session_id": "<host>:<rpc_port>"}

``CacheEngine.p2p_initialize`` sends it as a JSON string (``DistServeKVTransferEndpointInfo.
endpoint_info``) next to ``cache_pools``. Keeping the fields identical is what lets a pair with one
side on LMDeploy's backend and the other on ours migrate: either side's engine reaches the other's
through ``session_id`` (a P2PHANDSHAKE segment name) and reads inside ``mr_info``.

Address choice: LMDeploy's backend asks the routing table which source address would reach
8.8.8.8 -- on a host without a default route (air-gapped, a loopback-only namespace) that fails
and the backend refuses to start. We take, in order:

1. ``MOONCAKE_LOCAL_HOSTNAME`` (the same variable our store client and vLLM connector read);
2. the host of this engine's own DistServe URL (``DistServeInitRequest.local_engine_id``, e.g.
   ``http://10.0.0.5:23333``): the proxy reaches the engine there, and LMDeploy's
   ``EngineP2PConnection`` binds its ZMQ socket on that host too, so peers can route to it;
3. the address of a default route, when the host has one (what LMDeploy does), without sending
   anything;
4. ``127.0.0.1``.

An unspecified address (``0.0.0.0``, ``::``, empty) in step 2 is skipped: it is a bind-all, not an
address a peer can connect to.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from mooncake_connectors.lmdeploy.plan import RegionInfo
from mooncake_core.utils.net import default_route_source

_UNSPECIFIED = {"", "0.0.0.0", "::", "[::]", "*"}


class EndpointError(ValueError):
    """Endpoint info from a peer that cannot be used (says which peer and which field)."""


@dataclass(frozen=True)
class Endpoint:
    """A peer's (or our own) KV endpoint: engine session and registered regions by mr_key."""

    session_id: str
    mr_info: dict[str, RegionInfo]

    def to_json(self) -> dict[str, Any]:
        return {"mr_info": {k: {"addr": r.addr, "length": r.length, "offset": r.offset}
                            for k, r in self.mr_info.items()},
                "session_id": self.session_id}


def _int(v: Any, where: str, peer: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise EndpointError(f"endpoint info from {peer}: {where} must be a non-negative integer, got {v!r}")
    return v


def parse_endpoint(raw: str | dict[str, Any], *, peer: str) -> Endpoint:
    """Parse a peer's endpoint info (the JSON string LMDeploy forwards, or its decoded dict)."""
    if isinstance(raw, (str, bytes)):
        try:
            raw = json.loads(raw)
        except ValueError as e:
            raise EndpointError(f"endpoint info from {peer} is not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise EndpointError(f"endpoint info from {peer} must be a JSON object, got {type(raw).__name__}")
    sid = raw.get("session_id")
    if not isinstance(sid, str) or ":" not in sid:
        raise EndpointError(f"endpoint info from {peer}: session_id must be 'host:rpc_port', got {sid!r}")
    host, _, port = sid.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EndpointError(f"endpoint info from {peer}: session_id must be 'host:rpc_port', got {sid!r}")
    mr = raw.get("mr_info")
    if not isinstance(mr, dict):
        raise EndpointError(f"endpoint info from {peer}: mr_info must be an object keyed by mr_key, got {mr!r}")
    regions: dict[str, RegionInfo] = {}
    for key, info in mr.items():
        if not isinstance(info, dict):
            raise EndpointError(f"endpoint info from {peer}: mr_info[{key!r}] must be an object, got {info!r}")
        missing = [f for f in ("addr", "length") if f not in info]
        if missing:
            raise EndpointError(f"endpoint info from {peer}: mr_info[{key!r}] lacks {', '.join(missing)}")
        regions[str(key)] = RegionInfo(_int(info["addr"], f"mr_info[{key!r}].addr", peer),
                                       _int(info["length"], f"mr_info[{key!r}].length", peer),
                                       _int(info.get("offset", 0), f"mr_info[{key!r}].offset", peer))
    return Endpoint(session_id=sid, mr_info=regions)


def local_host(local_engine_id: str | None, env: dict[str, str] | None = None) -> tuple[str, str]:
    """(address peers should use to reach this process's engine, which rule chose it)."""
    env = os.environ if env is None else env
    given = env.get("MOONCAKE_LOCAL_HOSTNAME", "").strip()
    if given:
        host = given.rsplit(":", 1)[0] if given.count(":") == 1 else given  # a port there is not ours to use
        return host.strip("[]"), "MOONCAKE_LOCAL_HOSTNAME"
    if local_engine_id:
        try:
            h = urlparse(local_engine_id if "//" in local_engine_id else f"//{local_engine_id}").hostname
        except ValueError:
            h = None
        if h and h not in _UNSPECIFIED:
            return h, "local_engine_id"
    routed = default_route_source()
    if routed:
        return routed, "default route"
    return "127.0.0.1", "loopback fallback"
