"""``mooncake_client`` console script: the store's "real client" as a node's standing service.

It sets up one full store client (segment of ``--global_segment_size``, local buffer, SSD tier
with ``--enable_offload``, master at ``--master_server_address``) and serves dummy clients
(``MooncakeDistributedStore.setup_dummy``) on ``--port``; see real_client.py. Flags as the
original's ``mooncake_client``. Exit codes: 0 clean shutdown (SIGTERM/SIGINT), 2 bad command
line, 1 startup failure (master unreachable, port taken).
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any, Sequence

from mooncake_core import auth
from mooncake_core.store.client import MooncakeDistributedStore
from mooncake_core.store.flags import Flag, FlagError, FlagSet, HelpRequested
from mooncake_core.store.real_client import RealClientService, ServiceConfig
from mooncake_core.utils.log import get_logger, setup_logging
from mooncake_core.utils.net import endpoint_host, local_ip

log = get_logger("mooncake.store.real_client")

#: the service store's local buffer when --local_buffer_size is smaller (see main)
SERVICE_MIN_LOCAL_BUFFER = 16 << 20


def _port(v: int) -> str | None:
    return None if 0 < v <= 65535 else "must be a port number 1..65535"


def client_flagset() -> FlagSet:
    return FlagSet("mooncake_client", "The Mooncake Store's real client as a service: it holds this node's share "
                   "of the pool (segment, local buffer, SSD tier) and serves engine processes that attach with "
                   "setup_dummy(mem_pool_size, local_buffer_size, 'HOST:PORT'), sharing memory with them. Objects "
                   "stay in the pool when an engine exits or crashes.", [
        Flag("host", "str", "0.0.0.0", "Address the service listens on, and this node's hostname in the "
             "store (its segment name; a wildcard publishes this host's IP toward the master)."),
        Flag("port", "int", 50052, "Port dummies attach to (setup_dummy's server_address HOST:PORT); the "
             "local shared-memory socket is named after it.", _port),
        Flag("master_server_address", "str", "127.0.0.1:50051", "The store master (host:port)."),
        Flag("metadata_server", "str", "http://127.0.0.1:8080/metadata", "Transfer Engine metadata: "
             "http://HOST:PORT/metadata, etcd://HOST:PORT, redis://HOST:PORT or P2PHANDSHAKE."),
        Flag("global_segment_size", "size", 4 << 30, "Memory this node contributes to the pool (bytes or "
             "'4 GB'); every object stored through the service or its dummies may live there."),
        Flag("local_buffer_size", "size", 0, "The service's own registered transfer buffer (bytes or '16MB'); "
             "dummies bring their own staging memory."),
        Flag("protocol", "str", "tcp", "Transfer Engine protocol toward other nodes (tcp, rdma...)."),
        Flag("device_names", "str", "", "NICs for the Transfer Engine (e.g. mlx5_0,mlx5_1); empty = auto."),
        Flag("enable_offload", "bool", False, "Use the SSD tier the master offers (the master's "
             "--root_fs_dir): evicted objects spill to this node's files and are promoted on a hit."),
        Flag("threads", "int", 1, "Accepted as the original's; each dummy connection is served on its own "
             "thread here, so this sets nothing."),
        Flag("tenant_id", "str", "default", "Tenant this node's store client belongs to."),
        Flag("enable_http_server", "bool", False, "Serve /health (200 when the store and its master are "
             "healthy, 503 otherwise) and Prometheus /metrics on --http_port."),
        Flag("http_port", "int", 9300, "Port of --enable_http_server.", _port),
        Flag("http_host", "str", "0.0.0.0", "Address of --enable_http_server (ours)."),
        Flag("auth_token_file", "str", "", "File whose first line is the secret dummies must prove (wins over "
             "$MOONCAKE_AUTH_TOKEN_FILE / $MOONCAKE_AUTH_TOKEN, which dummies read). The same secret guards "
             "the master and the Transfer Engine."),
        Flag("log_level", "str", "INFO", "DEBUG, INFO, WARNING or ERROR."),
    ], not_implemented={"start_offload_rpc_server": "disk-tier reads go through the master-assigned owner's "
                                                    "Transfer Engine here; there is no separate RPC server"})


class _Metrics:
    """The service's Prometheus metrics: dummies attached, forwarded calls by method, latency."""

    def __init__(self, service_stats: Any) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self._calls = Counter("mooncake_client_dummy_calls", "Calls dummies forwarded", ["method"],
                              registry=self.registry)
        self._latency = Histogram("mooncake_client_dummy_call_seconds", "Service time of forwarded calls",
                                  registry=self.registry)
        for name, what in (("dummies", "Dummy clients attached"), ("connections", "Dummy connections open"),
                           ("mapped_bytes", "Dummy memory mapped by the service")):
            g = Gauge(f"mooncake_client_{name}", what, registry=self.registry)
            g.set_function(self._reader(service_stats, name))
        self._children: dict[str, Any] = {}

    @staticmethod
    def _reader(service_stats: Any, name: str) -> Any:
        def read() -> float:
            return float(service_stats()[name])
        return read

    def observe(self, method: str, seconds: float) -> None:
        c = self._children.get(method)
        if c is None:
            c = self._children[method] = self._calls.labels(method)
        c.inc()
        self._latency.observe(seconds)


def main(argv: Sequence[str] | None = None) -> int:
    fs = client_flagset()
    try:
        v = fs.parse(sys.argv[1:] if argv is None else argv)
        token = auth.resolve_token(_read_token_file(v["auth_token_file"]) if v["auth_token_file"] else None)
    except HelpRequested:
        sys.stdout.write(fs.help_text())
        return 0
    except (FlagError, auth.AuthConfigError) as e:
        sys.stderr.write(f"mooncake_client: error: {e}\n")
        return 2
    setup_logging(v["log_level"])
    host = v["host"]
    node = host if host not in ("0.0.0.0", "::", "") else local_ip(toward=endpoint_host(v["master_server_address"]))
    store = MooncakeDistributedStore()
    # dummies' puts need no buffer of the service (they are stored from shared memory), but a
    # service store with none would refuse the rest of the bytes API the way upstream does
    local_buffer = max(v["local_buffer_size"], SERVICE_MIN_LOCAL_BUFFER)
    rc = store.setup(node, v["metadata_server"], v["global_segment_size"], local_buffer, v["protocol"],
                     v["device_names"], v["master_server_address"], enable_ssd_offload=v["enable_offload"],
                     tenant_id=v["tenant_id"])
    if rc != 0:
        log.error("mooncake_client: store setup failed (%d): is the master at %s running?", rc,
                  v["master_server_address"])
        return 1
    services: list[RealClientService] = []
    def stats() -> dict[str, int]:
        return services[0].stats()
    metrics = _Metrics(stats) if v["enable_http_server"] else None
    service = RealClientService(store, ServiceConfig(host=host, port=v["port"], auth_token=token), metrics)
    services.append(service)
    warning = auth.exposure_warning("mooncake_client", host, token)
    if warning:
        log.warning("%s", warning)
    try:
        service.start()
        if metrics is not None:
            from mooncake_core.utils.metrics import start_metrics_server

            def health(_environ: dict) -> tuple[int, dict[str, str], bytes]:
                ok = store.health_check() == 0
                return (200 if ok else 503), {"Content-Type": "text/plain"}, b"OK\n" if ok else b"UNHEALTHY\n"
            start_metrics_server(v["http_port"], v["http_host"], metrics.registry, routes={"/health": health})
    except OSError as e:
        log.error("%s", e)
        store.close()
        return 1
    log.info("mooncake_client serving on %s:%d (segment %s, %d bytes)", host, v["port"], store.get_hostname(),
             v["global_segment_size"])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    service.stop()
    store.close()
    return 0


def _read_token_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
    except OSError as e:
        raise FlagError(f"--auth_token_file={path}: cannot read it ({e.strerror or e})") from None
    if not token:
        raise FlagError(f"--auth_token_file={path}: the file is empty (its first line is the token)")
    return token


if __name__ == "__main__":
    sys.exit(main())
