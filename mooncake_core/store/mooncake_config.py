"""The original Mooncake's ``mooncake.mooncake_config``: ``MooncakeConfig`` field for field.

Why a second config class beside :class:`mooncake_core.store.config.StoreConfig`: code written
for the original constructs ``MooncakeConfig(...)`` with its positional fields
(``device_name``, ``master_server_address``), relies on its leniency (an unknown protocol is
passed through with a warning, the engine then decides; ``"1.5"`` as a size is 1 byte) and on
its exact messages. ``StoreConfig`` is our store's own, stricter validation of the same
settings (it runs in ``setup``). This module keeps the original's contract and hands over to
ours with :meth:`MooncakeConfig.to_store_config`; ``import mooncake.mooncake_config`` resolves
here through :mod:`mooncake_core.compat`. Pure logic apart from reading the file / env.

One deliberate difference: ``load_from_env`` without ``MOONCAKE_LOCAL_HOSTNAME`` advertises
``localhost`` only when the master is addressed by a loopback name (every client is then on
this host); otherwise it takes the address of the route toward the master, since peers on
other hosts cannot reach ``localhost`` (the original always uses ``localhost``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mooncake_core import envs
from mooncake_core.store.config import StoreConfig, parse_bool
from mooncake_core.utils.net import LOOPBACK_NAMES, endpoint_host, local_ip

__all__ = ["DEFAULT_GLOBAL_SEGMENT_SIZE", "DEFAULT_LOCAL_BUFFER_SIZE", "KNOWN_PROTOCOLS", "MooncakeConfig",
           "parse_config_bool", "parse_segment_size"]

logger = logging.getLogger("mooncake.mooncake_config")

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824  # 1 GiB

#: protocols the original's engine and store know (a hint: others are passed on with a warning)
KNOWN_PROTOCOLS = frozenset({
    "tcp", "rdma", "efa", "nvmeof", "nvlink", "musa", "nvlink_intra", "hip", "barex", "cxl",
    "ascend", "ub", "ubshmem", "maca", "sunrise_link", "rpc_only",
})
_REQUIRED = ("local_hostname", "metadata_server", "master_server_address")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40}
_SIZE_RE = re.compile(r"^(?P<num>.*?)\s*(?P<unit>[kmgt]?b?)$")


def parse_segment_size(value: Any) -> int:
    """A size as the original's config reads it: an int as is, a float truncated, a string
    with an optional binary unit (``b``, ``k``/``kb`` ... ``t``/``tb``, any case, spaces
    allowed; the number may be fractional or in e-notation), truncated to whole bytes.
    ValueError for an empty string, a unit without a number, or anything else."""
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return int(value)
    text = value.strip().lower()
    if not text:
        raise ValueError("Invalid segment size: empty string")
    m = _SIZE_RE.match(text)
    assert m is not None  # the pattern matches every string
    num, unit = m.group("num").strip(), m.group("unit")
    if not num:
        raise ValueError(f"Invalid segment size: missing number before '{unit}' in {value!r}")
    try:
        return int(float(num) * _UNITS[unit])
    except ValueError:
        raise ValueError(f"Invalid segment size: {value!r} (a number of bytes, optionally with "
                         f"a unit such as 512MB or 3 GB)") from None


def parse_config_bool(value: Any) -> bool:
    """A boolean from a config file or env var: bool, number, None (False) or one of the usual
    words (``enable``/``disable`` too); ValueError for any other string (``bool("false")``
    would be True). The same words as our store config's."""
    return parse_bool(value, name="config boolean")


@dataclass
class MooncakeConfig:
    """Store client settings with the original's fields, defaults and validation."""

    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: str | None
    master_server_address: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    def __post_init__(self) -> None:
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError(f"Invalid protocol: {self.protocol!r}. Protocol must be a non-empty string, "
                             f"e.g. 'tcp' or 'rdma'.")
        self.protocol = self.protocol.strip().lower()
        if self.protocol not in KNOWN_PROTOCOLS:
            logger.warning("Unrecognised protocol %r; passing it through to the Mooncake engine unchanged. "
                           "Known protocols are: %s.", self.protocol, ", ".join(sorted(KNOWN_PROTOCOLS)))
        for name in ("global_segment_size", "local_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"Invalid {name}: {getattr(self, name)}. Size must be non-negative.")
        for name in _REQUIRED:
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"Config field {name!r} must be a non-empty string, got {value!r}.")

    @staticmethod
    def from_file(file_path: str) -> MooncakeConfig:
        """Load a JSON config file (``MOONCAKE_CONFIG_PATH``)."""
        with open(file_path, encoding="utf-8") as f:
            config = json.load(f)
        if not isinstance(config, Mapping):
            raise ValueError(f"config file {file_path!r} must hold a JSON object, got {type(config).__name__}")
        for name in _REQUIRED:
            if name not in config:
                raise ValueError(f"Missing required config field: {name} (in {file_path})")
        path, tenant = config.get("ssd_offload_path"), config.get("tenant_id")
        return MooncakeConfig(
            local_hostname=config["local_hostname"],
            metadata_server=config["metadata_server"],
            global_segment_size=parse_segment_size(config.get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE)),
            local_buffer_size=parse_segment_size(config.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE)),
            protocol=config.get("protocol", "tcp"),
            device_name=config.get("device_name", ""),
            master_server_address=config["master_server_address"],
            enable_ssd_offload=parse_config_bool(config.get("enable_ssd_offload", False)),
            ssd_offload_path="" if path is None else str(path),
            tenant_id="default" if tenant is None else str(tenant),
            enable_client_http_server=parse_config_bool(config.get("enable_client_http_server", False)),
            client_http_port=int(config.get("client_http_port", 9300)),
        )

    @staticmethod
    def load_from_env(environ: Mapping[str, str] | None = None) -> MooncakeConfig:
        """``MOONCAKE_CONFIG_PATH`` if set, else ``MOONCAKE_MASTER`` and the other ``MOONCAKE_*``
        variables (the original's names and defaults)."""

        def var(name: str, default: str) -> str:
            value: str = envs.get(name, environ)  # "" when unset or blank
            return value or default

        path = var("MOONCAKE_CONFIG_PATH", "")
        if path:
            return MooncakeConfig.from_file(path)
        master = var("MOONCAKE_MASTER", "")
        if not master:
            raise ValueError("Neither the environment variable 'MOONCAKE_CONFIG_PATH' nor 'MOONCAKE_MASTER' is set.")
        master_host = endpoint_host(master)
        hostname = var("MOONCAKE_LOCAL_HOSTNAME", "") or (
            "localhost" if master_host in LOOPBACK_NAMES else local_ip(toward=master_host))
        return MooncakeConfig(
            local_hostname=hostname,
            metadata_server=var("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=parse_segment_size(
                var("MOONCAKE_GLOBAL_SEGMENT_SIZE", str(DEFAULT_GLOBAL_SEGMENT_SIZE))),
            local_buffer_size=parse_segment_size(var("MOONCAKE_LOCAL_BUFFER_SIZE", str(DEFAULT_LOCAL_BUFFER_SIZE))),
            protocol=var("MOONCAKE_PROTOCOL", "tcp"),
            device_name=var("MOONCAKE_DEVICE", ""),
            master_server_address=master,
            enable_ssd_offload=parse_config_bool(var("MOONCAKE_OFFLOAD_ENABLED", "false")),
            ssd_offload_path=var("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=var("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=parse_config_bool(var("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false")),
            client_http_port=int(var("MOONCAKE_CLIENT_HTTP_PORT", "9300")),
        )

    def to_store_config(self) -> StoreConfig:
        """Our store's validated config of the same settings (raises where ours is stricter,
        e.g. a protocol this package has no transport for)."""
        return StoreConfig(
            local_hostname=self.local_hostname, metadata_server=self.metadata_server,
            global_segment_size=self.global_segment_size, local_buffer_size=self.local_buffer_size,
            protocol=self.protocol, rdma_devices=self.device_name or "",
            master_server_addr=self.master_server_address, enable_ssd_offload=self.enable_ssd_offload,
            ssd_offload_path=self.ssd_offload_path, tenant_id=self.tenant_id,
            enable_client_http_server=self.enable_client_http_server, client_http_port=self.client_http_port,
        )


# the original's private spellings, which its users and tests call
_parse_segment_size = parse_segment_size
_parse_bool = parse_config_bool
