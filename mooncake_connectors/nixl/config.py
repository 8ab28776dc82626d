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
}

MAX_WORKERS = 64


@dataclass(frozen=True)
class BackendConfig:
    local_hostname: str
    metadata_server: str
    num_workers: int


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
    return BackendConfig(local_hostname=host, metadata_server=meta, num_workers=workers)
