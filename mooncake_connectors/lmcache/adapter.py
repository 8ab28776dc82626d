"""``MooncakeCoreConnectorAdapter``: how LMCache finds the native connector.

LMCache 0.5.6 loads ``remote_storage_plugins`` by name: for plugin ``mooncake_core`` it
imports ``extra_config["remote_storage_plugin.mooncake_core.module_path"]``, takes
``...class_name`` from it, constructs a ``ConnectorAdapter`` subclass with no arguments and
asks it to ``create_connector(ConnectorContext)`` for the URL ``plugin://mooncake_core``.
"""

from __future__ import annotations

from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext, extract_plugin_type
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from mooncake_connectors.lmcache import PLUGIN_TYPE

__all__ = ["MooncakeCoreConnectorAdapter"]


class MooncakeCoreConnectorAdapter(ConnectorAdapter):
    """Claims ``plugin://mooncake_core`` (and ``plugin://mooncake_core.<instance>``)."""

    def __init__(self) -> None:
        super().__init__(f"plugin://{PLUGIN_TYPE}")

    def can_parse(self, url: str) -> bool:
        return url.startswith("plugin://") and extract_plugin_type(url[len("plugin://"):]) == PLUGIN_TYPE

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        from mooncake_connectors.lmcache.connector import MooncakeCoreConnector

        return MooncakeCoreConnector(loop=context.loop, local_cpu_backend=context.local_cpu_backend,
                                     config=context.config, metadata=context.metadata,
                                     plugin_name=context.plugin_name)
