"""The native LMCache connector's configuration: the same keys as LMCache's built-in Mooncake
adapter, validated up front with errors that name the key the user wrote.

Why its own module: LMCache swallows any exception raised while it constructs a remote
connector (the backend silently becomes a miss-everything ``None``), so the only thing a user
gets to see is the log line we write. That line must say *which* key is wrong and what was
expected. This is pure logic (no LMCache, no sockets), unit-tested in milliseconds.

Rules (LMCache 0.5.6, ``mooncakestore_connector.MooncakeStoreConfig``), in order:

* ``MOONCAKE_CONFIG_PATH`` (a JSON file) wins over ``extra_config``;
* keys in ``LMCACHE_ONLY_KEYS`` are LMCache's, never passed to the store;
* ``mooncake_<key>`` is passed to the store as ``<key>`` and overrides a plain ``<key>``;
* the plain legacy keys (``local_hostname``, ``metadata_server``, ``global_segment_size``,
  ``local_buffer_size``, ``protocol``, ``device_name``, ``master_server_address``) pass as is;
* anything else is not the store's business (``remote_storage_plugin.*``, ``save_chunk_meta``...);
* defaults as the built-in: 3355443200-byte segment, 1 GiB local buffer, ``tcp``, no device.

Beyond the built-in: ``mooncake_rpc_timeout`` (seconds per master RPC; default half of
LMCache's ``blocking_timeout_secs``, at most 5 s, so a dead master turns into misses before
LMCache gives up on the call) and an unknown ``mooncake_*`` key is an error, not ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mooncake_core.store.config import StoreConfig, parse_bool

__all__ = [
    "LEGACY_KEYS",
    "LMCACHE_ONLY_KEYS",
    "ConfigError",
    "ConnectorSettings",
    "settings_from",
]

PREFIX = "mooncake_"
LEGACY_KEYS = ("local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
               "protocol", "device_name", "master_server_address")
LMCACHE_ONLY_KEYS = frozenset({"transfer_timeout", "storage_root_dir", "prefer_local_alloc",
                               "mooncake_transfer_timeout", "mooncake_storage_root_dir",
                               "mooncake_prefer_local_alloc"})
DEFAULTS = {"global_segment_size": "3355443200", "local_buffer_size": "1073741824",
            "protocol": "tcp", "device_name": ""}
#: StoreConfig's spelling of a setup key -> the spelling LMCache users write
_STORE_FIELD_ALIASES = {"master_server_addr": "master_server_address", "rdma_devices": "device_name"}


class ConfigError(ValueError):
    """A bad connector setting; ``key`` is the key as the user wrote it."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


@dataclass(frozen=True)
class ConnectorSettings:
    """What the connector needs: the store's ``setup`` dict, where each key came from, and
    LMCache's own knobs."""

    setup: dict[str, Any]
    sources: dict[str, str]  # setup key -> the key the user wrote ("extra_config['x']", ...)
    transfer_timeout: float = 1.0
    storage_root_dir: str = ""
    prefer_local_alloc: bool = False

    def source(self, setup_key: str) -> str:
        return self.sources.get(setup_key, setup_key)


def _load_json(path: str) -> dict[str, Any]:
    where = f"MOONCAKE_CONFIG_PATH={path!r}"
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise ConfigError("MOONCAKE_CONFIG_PATH", f"cannot read {path!r}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError("MOONCAKE_CONFIG_PATH", f"{path!r} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(where, "must hold a JSON object")
    return data


def _collect(raw: Mapping[str, Any], where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(setup dict, setup key -> source key) per LMCache's rules (see the module docstring)."""
    setup: dict[str, Any] = {}
    sources: dict[str, str] = {}
    prefixed: list[tuple[str, Any, str]] = []
    for k, v in raw.items():
        if not isinstance(k, str) or k in LMCACHE_ONLY_KEYS or v is None:
            continue
        if k.startswith(PREFIX) and len(k) > len(PREFIX):
            prefixed.append((k[len(PREFIX):], v, k))
        elif k in LEGACY_KEYS:
            setup[k] = str(v)
            sources[k] = f"{where}[{k!r}]"
    for k, v, src in prefixed:  # prefixed keys win over legacy ones
        setup[k] = v if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
        sources[k] = f"{where}[{src!r}]"
    for k, v in DEFAULTS.items():
        if k not in setup:
            setup[k] = v
            sources[k] = f"{where}[{k!r}] (default {v!r})"
    return setup, sources


def _field_of(message: str) -> str:
    """The setup key a StoreConfig error is about ("global_segment_size: ..." -> that key)."""
    if "unknown key '" in message:
        return message.split("unknown key '", 1)[1].split("'", 1)[0]
    if "missing required key '" in message:
        return message.split("missing required key '", 1)[1].split("'", 1)[0]
    head = message.split(":", 1)[0].strip()
    return _STORE_FIELD_ALIASES.get(head, head)


def settings_from(extra_config: Mapping[str, Any] | None, *, blocking_timeout_secs: float = 10.0,
                  environ: Mapping[str, str] | None = None) -> ConnectorSettings:
    """Validated settings from LMCache's ``extra_config`` (or ``MOONCAKE_CONFIG_PATH``).

    Raises ConfigError naming the offending key; the store's own checks (sizes, protocol,
    unknown keys) run here too, so a bad value is reported before any socket is opened.
    """
    env = os.environ if environ is None else environ
    path = env.get("MOONCAKE_CONFIG_PATH")
    if path:
        raw: Mapping[str, Any] = _load_json(path)
        where = f"MOONCAKE_CONFIG_PATH {path!r}"
    elif extra_config:
        raw, where = extra_config, "extra_config"
    else:
        raise ConfigError("extra_config", "no Mooncake settings: set extra_config.master_server_address, "
                                          "metadata_server, local_hostname (or MOONCAKE_CONFIG_PATH)")
    setup, sources = _collect(raw, where)
    if "rpc_timeout" not in setup:
        setup["rpc_timeout"] = max(0.5, min(5.0, float(blocking_timeout_secs) / 2))
        sources["rpc_timeout"] = f"{where}['mooncake_rpc_timeout'] (default {setup['rpc_timeout']:g})"
    try:
        StoreConfig.from_dict(setup)
    except (TypeError, ValueError) as e:
        field = _field_of(str(e))
        src = sources.get(field) or f"{where}[{(field if field in LEGACY_KEYS else PREFIX + field)!r}]"
        raise ConfigError(src, f"{e}") from None
    timeout_key = "mooncake_transfer_timeout" if "mooncake_transfer_timeout" in raw else "transfer_timeout"
    try:
        transfer_timeout = float(raw.get(timeout_key, 1))
        if not transfer_timeout > 0:
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"{where}[{timeout_key!r}]",
                          f"expected seconds > 0, got {raw.get(timeout_key)!r}") from None
    try:
        prefer_local = parse_bool(raw.get("mooncake_prefer_local_alloc", False),
                                  name="mooncake_prefer_local_alloc")
    except ValueError as e:
        raise ConfigError(f"{where}['mooncake_prefer_local_alloc']", str(e)) from None
    root = raw.get("storage_root_dir", "") or ""
    if not isinstance(root, str):
        raise ConfigError(f"{where}['storage_root_dir']", f"expected a path string, got {root!r}")
    return ConnectorSettings(setup=setup, sources=sources, transfer_timeout=transfer_timeout,
                             storage_root_dir=root, prefer_local_alloc=prefer_local)
