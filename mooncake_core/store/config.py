"""Store client configuration: ``setup`` arguments, ``setup(dict)``, ``MOONCAKE_CONFIG_PATH``
JSON and ``MOONCAKE_*`` environment variables, all validated into one typed object.

Why a module of its own: users reach the store through four doors (positional ``setup``,
``setup(dict)``, a JSON file, env vars, as upstream Mooncake's ``MooncakeConfig`` does) and all
four must accept the same spellings (size strings like "1 GB") and reject the same mistakes
("50%", a negative size, an unknown key) with a message naming the field. This is pure logic:
no sockets, unit-tested in milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mooncake_core import envs
from mooncake_core.envs import FALSE_WORDS, TRUE_WORDS
from mooncake_core.utils.net import endpoint_host, local_ip
from mooncake_core.utils.sizes import parse_size

__all__ = [
    "DEFAULT_GLOBAL_SEGMENT_SIZE",
    "DEFAULT_LOCAL_BUFFER_SIZE",
    "DEFAULT_MASTER_ADDR",
    "MooncakeConfig",
    "MooncakeStoreConfig",
    "DummyAttach",
    "StoreConfig",
    "parse_bool",
]

# Defaults of the positional / dict ``setup`` (upstream store_py.cpp: 16 MiB each).
SETUP_DEFAULT_SEGMENT_SIZE = 16 * 1024 * 1024
SETUP_DEFAULT_LOCAL_BUFFER_SIZE = 16 * 1024 * 1024
# Defaults of the env / JSON-file config (upstream mooncake_config.py).
DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824  # 1 GiB
DEFAULT_MASTER_ADDR = "127.0.0.1:50051"

_KNOWN_PROTOCOLS = frozenset({"tcp", "rdma", "efa", "shm", "cxl", "nvlink", "ascend", "rpc_only"})


def parse_bool(value: Any, *, name: str = "flag") -> bool:
    """A config boolean that may arrive as bool, number or string ("true", "0", "off"...).

    ``bool("false")`` is True, so strings are parsed explicitly; anything else is an error.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if value is None:
        return False
    s = str(value).strip().lower()
    if s in FALSE_WORDS:  # the one truthy rule of mooncake_core.envs
        return False
    if s in TRUE_WORDS:
        return True
    raise ValueError(f"{name}: invalid boolean value {value!r} (use true/false)")


def _require_str(value: Any, name: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected str, got {type(value).__name__} ({value!r})")
    if not allow_empty and not value.strip():
        raise ValueError(f"{name}: must be a non-empty string")
    return value.strip()


#: ``setup(dict)`` keys that say "attach to the node's mooncake_client as a dummy" (this
#: project's extension: upstream's dict ``setup`` always builds a full client)
DUMMY_KEYS = frozenset({"client_server_address", "mem_pool_size", "local_buffer_size"})
#: keys of a full client's dict that the service, not the dummy, owns (a config file shared
#: with full clients, or LMCache's defaults, carries them): accepted and not used
SERVICE_OWNED_KEYS = frozenset({"local_hostname", "metadata_server", "master_server_address", "master_server_addr",
                                "protocol", "device_name", "rdma_devices", "global_segment_size", "tenant_id",
                                "ipc_socket_path", "enable_ssd_offload", "ssd_offload_path",
                                "enable_client_http_server", "client_http_port"})


@dataclass(frozen=True)
class DummyAttach:
    """``setup_dummy`` arguments read from a ``setup(dict)`` that names ``client_server_address``.

    Why: frameworks that hand the store a dict and never call ``setup_dummy`` themselves
    (LMCache's ``mooncakestore://`` adapter forwards every ``mooncake_``-prefixed extra_config
    key to ``setup(dict)``) can still attach to the node's ``mooncake_client``, the pool that
    outlives them. ``ignored``: the service-owned keys present (logged by the caller)."""

    server_address: str
    mem_pool_size: int
    local_buffer_size: int
    ignored: tuple[str, ...]

    @staticmethod
    def wanted(config: Any) -> bool:
        return isinstance(config, Mapping) and bool(config.get("client_server_address"))

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> DummyAttach:
        unknown = sorted(k for k in config if k not in DUMMY_KEYS and k not in SERVICE_OWNED_KEYS)
        if unknown:
            raise ValueError(f"setup(config) with client_server_address: unknown key(s) {unknown} "
                             f"(a dummy client takes {sorted(DUMMY_KEYS)})")
        addr = _require_str(config["client_server_address"], "client_server_address")
        return cls(server_address=addr,
                   mem_pool_size=parse_size(config.get("mem_pool_size", 0), name="mem_pool_size"),
                   local_buffer_size=parse_size(config.get("local_buffer_size", SETUP_DEFAULT_LOCAL_BUFFER_SIZE),
                                                name="local_buffer_size"),
                   ignored=tuple(sorted(k for k in config if k in SERVICE_OWNED_KEYS)))


@dataclass
class StoreConfig:
    """Validated settings of one ``MooncakeDistributedStore``.

    Field names follow upstream (``master_server_addr`` in ``setup``; the JSON file's
    ``master_server_address`` and ``device_name`` are accepted as aliases).
    """

    local_hostname: str
    metadata_server: str
    global_segment_size: int = SETUP_DEFAULT_SEGMENT_SIZE
    local_buffer_size: int = SETUP_DEFAULT_LOCAL_BUFFER_SIZE
    protocol: str = "tcp"
    rdma_devices: str = ""
    master_server_addr: str = DEFAULT_MASTER_ADDR
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300
    # RPC timeout towards the master, seconds (ours; MC_STORE_RPC_TIMEOUT).
    rpc_timeout: float = 5.0

    def __post_init__(self) -> None:
        self.local_hostname = _require_str(self.local_hostname, "local_hostname")
        self.metadata_server = _require_str(self.metadata_server, "metadata_server")
        self.master_server_addr = _require_str(self.master_server_addr, "master_server_addr")
        self.global_segment_size = parse_size(self.global_segment_size, name="global_segment_size")
        self.local_buffer_size = parse_size(self.local_buffer_size, name="local_buffer_size")
        proto = _require_str(self.protocol, "protocol").lower()
        if proto not in _KNOWN_PROTOCOLS:
            raise ValueError(
                f"protocol: unknown protocol {self.protocol!r} (expected one of {sorted(_KNOWN_PROTOCOLS)})"
            )
        self.protocol = proto
        self.rdma_devices = _require_str(self.rdma_devices or "", "rdma_devices", allow_empty=True)
        self.enable_ssd_offload = parse_bool(self.enable_ssd_offload, name="enable_ssd_offload")
        self.ssd_offload_path = _require_str(self.ssd_offload_path or "", "ssd_offload_path", allow_empty=True)
        self.tenant_id = _require_str(self.tenant_id or "default", "tenant_id")
        self.enable_client_http_server = parse_bool(self.enable_client_http_server,
                                                    name="enable_client_http_server")
        try:
            self.client_http_port = int(self.client_http_port)
        except (TypeError, ValueError):
            raise ValueError(f"client_http_port: expected an integer port, got {self.client_http_port!r}") from None
        try:
            self.rpc_timeout = float(self.rpc_timeout)
        except (TypeError, ValueError):
            raise ValueError(f"rpc_timeout: expected seconds, got {self.rpc_timeout!r}") from None
        if not self.rpc_timeout > 0:
            raise ValueError(f"rpc_timeout: must be > 0 seconds, got {self.rpc_timeout!r}")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_dict(cls, config: Mapping[str, Any], *, defaults: str = "setup") -> StoreConfig:
        """Build from a ``setup(dict)`` / JSON mapping. Unknown keys are rejected by name.

        ``defaults="env"`` uses the larger defaults of upstream's file/env config.
        """
        if not isinstance(config, Mapping):
            raise TypeError(f"setup(config): expected a dict, got {type(config).__name__}")
        aliases = {"master_server_address": "master_server_addr", "device_name": "rdma_devices"}
        ignored = {"ipc_socket_path"}  # accepted by upstream, meaningless here
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for raw_key, value in config.items():
            if not isinstance(raw_key, str):
                raise TypeError(f"setup(config): keys must be str, got {raw_key!r}")
            key = aliases.get(raw_key, raw_key)
            if raw_key in ignored:
                continue
            if key not in fields:
                raise ValueError(
                    f"setup(config): unknown key {raw_key!r} (known: {sorted(fields | set(aliases))})"
                )
            kwargs[key] = value
        for required in ("local_hostname", "metadata_server"):
            if required not in kwargs:
                raise ValueError(f"setup(config): missing required key {required!r}")
        if defaults == "env":
            kwargs.setdefault("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE)
            kwargs.setdefault("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE)
        for key in ("rdma_devices", "ssd_offload_path"):
            if kwargs.get(key) is None:
                kwargs.pop(key, None)
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str) -> StoreConfig:
        """Load a ``MOONCAKE_CONFIG_PATH`` JSON file (upstream ``MooncakeConfig.from_file``)."""
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            raise ValueError(f"MOONCAKE_CONFIG_PATH: file {path!r} does not exist") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"MOONCAKE_CONFIG_PATH: {path!r} is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ValueError(f"MOONCAKE_CONFIG_PATH: {path!r} must hold a JSON object")
        if "master_server_address" not in data and "master_server_addr" not in data:
            raise ValueError(f"MOONCAKE_CONFIG_PATH: {path!r} lacks required field 'master_server_address'")
        return cls.from_dict(data, defaults="env")

    @classmethod
    def load_from_env(cls, environ: Mapping[str, str] | None = None) -> StoreConfig:
        """``MOONCAKE_CONFIG_PATH`` if set, else ``MOONCAKE_MASTER`` and friends (upstream names)."""
        env = os.environ if environ is None else environ

        def var(name: str, default: Any) -> Any:
            return envs.get(name, env) or default

        path = var("MOONCAKE_CONFIG_PATH", "")
        if path:
            return cls.from_file(path)
        master = var("MOONCAKE_MASTER", "")
        if not master:
            raise ValueError(
                "store config: neither MOONCAKE_CONFIG_PATH nor MOONCAKE_MASTER is set "
                "(call setup(...) with arguments, or export one of them)"
            )
        return cls(
            # unset: the address of the route toward the master (utils/net.py), not "localhost",
            # which remote peers cannot reach
            local_hostname=var("MOONCAKE_LOCAL_HOSTNAME", "") or local_ip(toward=endpoint_host(master)),
            metadata_server=var("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=var("MOONCAKE_GLOBAL_SEGMENT_SIZE", DEFAULT_GLOBAL_SEGMENT_SIZE),
            local_buffer_size=var("MOONCAKE_LOCAL_BUFFER_SIZE", DEFAULT_LOCAL_BUFFER_SIZE),
            protocol=var("MOONCAKE_PROTOCOL", "tcp"),
            rdma_devices=var("MOONCAKE_DEVICE", ""),
            master_server_addr=master,
            enable_ssd_offload=var("MOONCAKE_OFFLOAD_ENABLED", "false"),
            ssd_offload_path=var("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=var("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=var("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false"),
            client_http_port=var("MOONCAKE_CLIENT_HTTP_PORT", 9300),
        )

    # upstream name
    @property
    def master_server_address(self) -> str:
        return self.master_server_addr

    @property
    def device_name(self) -> str:
        return self.rdma_devices


# Upstream's Python-side names for the same thing (vLLM's MooncakeStoreConfig); framework code may
# construct these via from_file/load_from_env. The original's mooncake.mooncake_config.MooncakeConfig,
# field for field and as lenient as it is, is mooncake_core.store.mooncake_config.MooncakeConfig.
MooncakeStoreConfig = StoreConfig
MooncakeConfig = StoreConfig
