"""Backend parameters of the NIXL ``MooncakeCore`` backend (pure logic, no I/O).

NIXL hands a backend a ``{str: str}`` map (Python ``agent.create_backend(name, params)``,
SGLang ``SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS``). These are the keys we understand; an
unknown key or a bad value is refused with a message naming it, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

#: key -> (default shown by ``get_plugin_params``, meaning)
PARAMS: dict[str, tuple[str, str]] = {
    "local_hostname": ("", "host (or host:port) of this Transfer Engine; default MOONCAKE_LOCAL_HOSTNAME, "
                           "else this host's address"),
    "metadata_server": ("P2PHANDSHAKE", "TE metadata service: P2PHANDSHAKE (peers exchange descriptors "
                                        "directly), http://..., etcd://..., redis://..."),
    "num_workers": ("2", "threads that run posted transfers (1-64)"),
    "protocol": ("tcp", "Transfer Engine protocol: tcp, or rdma (one-sided over UCX: RDMA NICs where present)"),
    "device_name": ("", "NICs for protocol rdma, as the original's device_name / UCX_NET_DEVICES name them "
                        "(e.g. mlx5_0,mlx5_1); empty: every NIC UCX finds"),
}

MAX_WORKERS = 64
#: the Transfer Engine's protocols (``mooncake_core.engine.SUPPORTED_PROTOCOLS``; not imported: pure module)
PROTOCOLS = ("tcp", "rdma")


@dataclass(frozen=True)
class BackendConfig:
    local_hostname: str
    metadata_server: str
    num_workers: int
    protocol: str = "tcp"
    device_name: str = ""


def parse_params(params: Mapping[str, str], *, env: Mapping[str, str] | None = None,
                 default_host: str = "127.0.0.1") -> BackendConfig:
    """Validate NIXL backend params; ValueError naming the key on anything unexpected."""
    env = os.environ if env is None else env
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise ValueError(f"MooncakeCore: unknown backend parameter(s) {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(sorted(PARAMS))}")
    host = (params.get("local_hostname") or env.get("MOONCAKE_LOCAL_HOSTNAME") or default_host).strip()
    if not host or any(c.isspace() for c in host):
        raise ValueError(f"MooncakeCore: local_hostname {host!r} is not a host or host:port")
    meta = (params.get("metadata_server") or PARAMS["metadata_server"][0]).strip()
    raw = params.get("num_workers") or PARAMS["num_workers"][0]
    try:
        workers = int(raw)
    except ValueError:
        raise ValueError(f"MooncakeCore: num_workers must be an integer 1-{MAX_WORKERS}, got {raw!r}") from None
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"MooncakeCore: num_workers must be 1-{MAX_WORKERS}, got {workers}")
    protocol = (params.get("protocol") or PARAMS["protocol"][0]).strip().lower()
    if protocol not in PROTOCOLS:
        raise ValueError(f"MooncakeCore: protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    device = (params.get("device_name") or "").strip()  # as given: the engine checks the names
    return BackendConfig(local_hostname=host, metadata_server=meta, num_workers=workers, protocol=protocol,
                         device_name=device)
