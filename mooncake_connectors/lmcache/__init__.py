"""Mooncake connectors for LMCache (targets LMCache 0.5.6).

* ``MooncakeCoreConnectorAdapter`` -- the native remote connector, enabled in LMCache's config
  with ``remote_storage_plugins: ["mooncake_core"]`` and
  ``extra_config: {"remote_storage_plugin.mooncake_core.module_path": "mooncake_connectors.lmcache",
  "remote_storage_plugin.mooncake_core.class_name": "MooncakeCoreConnectorAdapter", ...}``
  (see docs/lmcache.md). LMCache imports this module and takes the class by name.
* ``MooncakeStoreL2Adapter`` -- the L2 tier of LMCache's multiprocess mode, loaded by its
  ``plugin`` L2 adapter type: ``--l2-adapter '{"type": "plugin", "module_path":
  "mooncake_connectors.lmcache.l2_adapter", "class_name": "MooncakeStoreL2Adapter",
  "adapter_params": {...}}'`` (see docs/lmcache.md).
* LMCache's own ``mooncakestore://`` adapter and ``mooncake_te`` transfer channel need nothing
  from here: they import ``mooncake.store`` / ``mooncake.engine``, which resolve to this package
  once ``mooncake_core.compat.install()`` ran (our vLLM and SGLang plugins do that).

The names resolve lazily, so importing this package does not import LMCache.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PLUGIN_TYPE", "ContiguousCpuKV", "MooncakeCoreConnector", "MooncakeCoreConnectorAdapter",
           "MooncakeStoreL2Adapter"]

PLUGIN_TYPE = "mooncake_core"
_LAZY = {
    "MooncakeCoreConnectorAdapter": "mooncake_connectors.lmcache.adapter",
    "MooncakeCoreConnector": "mooncake_connectors.lmcache.connector",
    "ContiguousCpuKV": "mooncake_connectors.lmcache.cpu_kv",
    "MooncakeStoreL2Adapter": "mooncake_connectors.lmcache.l2_adapter",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
