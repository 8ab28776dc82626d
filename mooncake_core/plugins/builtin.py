"""The built-in plugins of mooncake_core, registered like any third-party plugin.

Each is a small object whose hook imports its module only when called, so creating the
plugin manager stays cheap and an optional client library (etcd, Redis: the ``etcd`` and
``redis`` extras) is needed only by whoever opens that backend -- and its absence is an error
naming the extra to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import pluggy

from mooncake_core.plugins.hookspecs import hookimpl
from mooncake_core.plugins.specs import MetadataBackendPlugin
from mooncake_core.utils.extras import require

if TYPE_CHECKING:
    from mooncake_core.metadata.base import MetadataBackend
    from mooncake_core.transfer.base import Transport


class LocalTransportPlugin:
    """memmove when the target segment lives in this very process."""

    @hookimpl
    def mooncake_transports(self) -> "list[type[Transport]]":
        from mooncake_core.transfer.local import LocalTransport
        return [LocalTransport]


class CmaTransportPlugin:
    """Cross-memory attach (process_vm_readv/writev) to a process on the same host."""

    @hookimpl
    def mooncake_transports(self) -> "list[type[Transport]]":
        from mooncake_core.transfer.cma import CmaTransport
        return [CmaTransport]


class TcpTransportPlugin:
    """TCP to any peer (the fallback every engine can use)."""

    @hookimpl
    def mooncake_transports(self) -> "list[type[Transport]]":
        from mooncake_core.transfer.tcp import TcpTransport
        return [TcpTransport]


class CudaTransportPlugin:
    """GPU memory (``cuda:N`` regions) and same-host CUDA IPC, where ``cuda-python`` is installed.

    Why the spec check: the hook runs for every engine, and the CPU-only install must never
    import CUDA -- without ``cuda.bindings`` the plugin offers nothing; with it but no device,
    its transport stays inert (``mooncake_core/transfer/cuda/ipc.py``)."""

    @hookimpl
    def mooncake_transports(self) -> "list[type[Transport]]":
        import importlib.util
        try:
            if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None:
                return []
        except (ImportError, ValueError):
            return []
        from mooncake_core.transfer.cuda.ipc import CudaIpcTransport
        return [CudaIpcTransport]


class UcxTransportPlugin:
    """One-sided transfers through UCX (``protocol="rdma"``; RDMA NICs, or tcp / shared memory).

    Always offered: the transport loads libucp only when an engine asks for ``rdma``, and stays
    inert otherwise (``mooncake_core/transfer/ucx/``)."""

    @hookimpl
    def mooncake_transports(self) -> "list[type[Transport]]":
        from mooncake_core.transfer.ucx.transport import UcxTransport
        return [UcxTransport]


def _open_http(spec: Any, timeout: float) -> "MetadataBackend":
    from mooncake_core.metadata.http_backend import HttpMetadataBackend
    return HttpMetadataBackend(spec, timeout=timeout)


def _open_etcd(spec: Any, timeout: float) -> "MetadataBackend":
    require("etcd3gw", "etcd", "the etcd metadata backend (etcd://)")
    from mooncake_core.metadata.etcd_backend import EtcdMetadataBackend
    return EtcdMetadataBackend(spec, timeout=timeout)


def _open_redis(spec: Any, timeout: float) -> "MetadataBackend":
    require("redis", "redis", "the Redis metadata backend (redis://)")
    from mooncake_core.metadata.redis_backend import RedisMetadataBackend
    return RedisMetadataBackend(spec, timeout=timeout)


def _parse_http(conn: str, env: Mapping[str, str]) -> Any:
    from mooncake_core.metadata.conn_string import parse_http
    return parse_http(conn)


def _parse_etcd(conn: str, env: Mapping[str, str]) -> Any:
    from mooncake_core.metadata.conn_string import parse_etcd
    return parse_etcd(conn)


def _parse_redis(conn: str, env: Mapping[str, str]) -> Any:
    from mooncake_core.metadata.conn_string import parse_redis
    return parse_redis(conn, env)


class HttpMetadataPlugin:
    """Our HTTP metadata server (``mooncake_http_metadata_server``), as Mooncake's."""

    @hookimpl
    def mooncake_metadata_backends(self) -> list[MetadataBackendPlugin]:
        return [MetadataBackendPlugin(("http", "https"), _parse_http, _open_http,
                                      "http://host:port/metadata, https://host:port/metadata")]


class EtcdMetadataPlugin:
    """etcd through its v3 JSON gateway; also what a string without ``scheme://`` means."""

    @hookimpl
    def mooncake_metadata_backends(self) -> list[MetadataBackendPlugin]:
        return [MetadataBackendPlugin(("etcd",), _parse_etcd, _open_etcd,
                                      "etcd://host:port[;host2:port2], host:port[;host2:port2] (etcd)")]


class RedisMetadataPlugin:
    """Redis (``MC_REDIS_*`` credentials as in Mooncake)."""

    @hookimpl
    def mooncake_metadata_backends(self) -> list[MetadataBackendPlugin]:
        return [MetadataBackendPlugin(("redis",), _parse_redis, _open_redis, "redis://[:password@]host:port[/db]")]


#: (plugin name, plugin) in registration order
BUILTINS: tuple[tuple[str, object], ...] = (
    ("mooncake_core.transport.local", LocalTransportPlugin()),
    ("mooncake_core.transport.cma", CmaTransportPlugin()),
    ("mooncake_core.transport.tcp", TcpTransportPlugin()),
    ("mooncake_core.transport.ucx", UcxTransportPlugin()),
    ("mooncake_core.transport.cuda", CudaTransportPlugin()),
    ("mooncake_core.metadata.http", HttpMetadataPlugin()),
    ("mooncake_core.metadata.etcd", EtcdMetadataPlugin()),
    ("mooncake_core.metadata.redis", RedisMetadataPlugin()),
)


def register_builtins(pm: pluggy.PluginManager) -> None:
    for name, plugin in BUILTINS:
        if pm.get_plugin(name) is None and not pm.is_blocked(name):
            pm.register(plugin, name=name)
