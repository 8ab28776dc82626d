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

from mooncake_core.errors import ErrorCode
from mooncake_core.store.config import StoreConfig, parse_bool

__all__ = [
    "LEGACY_KEYS",
    "LMCACHE_ONLY_KEYS",
    "ConfigError",
    "ConnectorSettings",
    "L2Settings",
    "code_name",
    "l2_settings_from",
    "settings_from",
    "setup_error",
]

PREFIX = "mooncake_"
LEGACY_KEYS = ("local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
               "protocol", "device_name", "master_server_address")
LMCACHE_ONLY_KEYS = frozenset({"transfer_timeout", "storage_root_dir", "prefer_local_alloc",
                               "mooncake_transfer_timeout", "mooncake_storage_root_dir",
                               "mooncake_prefer_local_alloc"})
DEFAULTS = {"global_segment_size": "3355443200", "local_buffer_size": "1073741824",
            "protocol": "tcp", "device_name": ""}
RPC_FAIL = int(ErrorCode.RPC_FAIL)
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
ALREADY_EXISTS = int(ErrorCode.OBJECT_ALREADY_EXISTS)
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
                  environ: Mapping[str, str] | None = None, where: str = "extra_config") -> ConnectorSettings:
    """Validated settings from LMCache's ``extra_config`` (or ``MOONCAKE_CONFIG_PATH``).

    ``where`` is how errors name the mapping the user wrote (``extra_config`` for the remote
    connector, ``adapter_params`` for the multiprocess mode's L2 adapter).
    Raises ConfigError naming the offending key; the store's own checks (sizes, protocol,
    unknown keys) run here too, so a bad value is reported before any socket is opened.
    """
    env = os.environ if environ is None else environ
    path = env.get("MOONCAKE_CONFIG_PATH")
    if path:
        raw: Mapping[str, Any] = _load_json(path)
        where = f"MOONCAKE_CONFIG_PATH {path!r}"
    elif extra_config:
        raw = extra_config
    else:
        raise ConfigError(where, f"no Mooncake settings: set {where}.master_server_address, "
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


#: ``adapter_params`` keys of the multiprocess mode's L2 adapter that are LMCache-side, not the store's
L2_OWN_KEYS = ("num_workers",)
L2_WHERE = "adapter_params"


@dataclass(frozen=True)
class L2Settings:
    """The multiprocess mode's L2 adapter settings: the store's, plus its worker threads."""

    store: ConnectorSettings
    num_workers: int = 2


def l2_settings_from(params: Mapping[str, Any] | None, *,
                     environ: Mapping[str, str] | None = None) -> L2Settings:
    """Validated settings from the ``adapter_params`` of LMCache's ``plugin`` L2 adapter spec.

    Stricter than ``extra_config``: that mapping is shared with the rest of LMCache, so keys
    that are not ours must pass; ``adapter_params`` is ours alone, so an unknown key (a typo of
    ``master_server_address``...) is an error naming it rather than a silent default.
    """
    raw = dict(params or {})
    for k in raw:
        if not (k in LEGACY_KEYS or k in L2_OWN_KEYS or (isinstance(k, str) and k.startswith(PREFIX))):
            raise ConfigError(f"{L2_WHERE}[{k!r}]",
                              f"unknown key; expected one of {', '.join(LEGACY_KEYS + L2_OWN_KEYS)} "
                              f"or a mooncake_<store setup key>")
    workers = raw.pop("num_workers", 2)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"{L2_WHERE}['num_workers']", f"expected a positive integer, got {workers!r}")
    env = os.environ if environ is None else environ
    named = {"master_server_address", "mooncake_master_server_address", "mooncake_master_server_addr"} & set(raw)
    if not named and not env.get("MOONCAKE_CONFIG_PATH"):
        raise ConfigError(f"{L2_WHERE}['master_server_address']",
                          "missing: the store master's host:port (mooncake_master --port)")
    return L2Settings(store=settings_from(raw, environ=environ, where=L2_WHERE), num_workers=workers)


def code_name(rc: int) -> str:
    """``-200 NO_AVAILABLE_HANDLE`` (the store's code and its upstream name)."""
    try:
        return f"{rc} {ErrorCode(rc).name}"
    except ValueError:
        return str(rc)


def setup_error(settings: ConnectorSettings, rc: int) -> str:
    """The key to blame for a failed ``store.setup`` return code."""
    if rc == RPC_FAIL:
        return (f"{settings.source('master_server_address')}="
                f"{settings.setup.get('master_server_address')!r}: the store master is unreachable "
                f"(store.setup returned {rc}; is mooncake_master running there?)")
    return (f"store.setup returned {rc}: check {settings.source('local_hostname')}, "
            f"{settings.source('metadata_server')}={settings.setup.get('metadata_server')!r} and "
            f"{settings.source('protocol')} (the store's log line above says which failed)")
