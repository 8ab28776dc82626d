"""Every ``MC_*`` / ``MOONCAKE_*`` environment variable of mooncake-core, in one place.

On the model of vLLM's ``envs.py``: each variable is declared once with its type, default
and meaning, and read *at call time* -- ``envs.MC_TRANSFER_TIMEOUT`` looks at ``os.environ``
each time it is evaluated, so a test's ``monkeypatch.setenv`` or a value exported after
import takes effect (no module constants copied at import). ``get(name, env)`` reads from
another mapping (pure tests). Booleans follow one rule, :func:`parse_flag`.

A bad value fails with a ``ValueError`` naming the variable and what was expected. The
README's configuration table is generated from this module (``python -m mooncake_core.envs
--markdown``; ``tests/unit/test_envs.py`` keeps the two, and the code, in sync).

Names follow the original Mooncake where it has them (``MC_*`` of the Transfer Engine,
``MOONCAKE_*`` of the store's ``MooncakeConfig.load_from_env``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

T = TypeVar("T")

#: the one truthy rule (case-insensitive, surrounding blanks ignored); anything else is an error
TRUE_WORDS = frozenset({"1", "true", "yes", "on", "enable"})
FALSE_WORDS = frozenset({"", "0", "false", "no", "off", "disable"})


def parse_flag(raw: str, name: str = "flag") -> bool:
    """``1/true/yes/on/enable`` -> True, ``0/false/no/off/disable`` or empty -> False."""
    s = raw.strip().lower()
    if s in TRUE_WORDS:
        return True
    if s in FALSE_WORDS:
        return False
    raise ValueError(f"{name}={raw!r}: expected a boolean (1/true/yes/on or 0/false/no/off)")


def _int(minimum: int | None = None) -> Callable[[str, str], int]:
    def parse(raw: str, name: str) -> int:
        try:
            v = int(raw.strip())
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not an integer") from None
        if minimum is not None and v < minimum:
            raise ValueError(f"{name}={raw!r} must be >= {minimum}")
        return v
    return parse


def _float(raw: str, name: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


def _str(raw: str, name: str) -> str:
    return raw.strip()


def _secret(raw: str, name: str) -> str:
    return raw  # passwords and tokens are taken verbatim


def _flag(raw: str, name: str) -> bool:
    return parse_flag(raw, name)


def _timeout(raw: str, name: str) -> float:
    """MC_TRANSFER_TIMEOUT: as the engine always read it -- not a positive number means 30."""
    try:
        t = float(raw)
    except ValueError:
        logging.getLogger("mooncake.te").warning("MC_TRANSFER_TIMEOUT is not a number, using 30", extra={"value": raw})
        return 30.0
    return t if t > 0 else 30.0


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One variable: how it is parsed, its default, what it means, where it belongs."""

    name: str
    parse: Callable[[str, str], T]
    default: T
    doc: str
    section: str
    #: how the README shows the default (when ``repr(default)`` would not say it well)
    shown_default: str = ""

    def get(self, env: Mapping[str, str] | None = None) -> T:
        raw = (os.environ if env is None else env).get(self.name)
        if raw is None or not raw.strip():
            return self.default
        return self.parse(raw, self.name)

    def default_text(self) -> str:
        if self.shown_default:
            return self.shown_default
        d = self.default
        if d is None or d == "":
            return "unset"
        if isinstance(d, bool):
            return "1" if d else "0"
        return str(d)


_SEC, _TE, _META, _STORE, _FW, _GEN, _TEST = ("Security", "Transfer Engine", "Metadata service", "Store client",
                                               "Framework connectors", "Logging and compatibility", "Tests and CI")

_VARS: list[EnvVar[Any]] = [
    EnvVar("MOONCAKE_AUTH_TOKEN", _secret, None,
           "shared secret required by the master RPC, the HTTP metadata server, the proxy admin API and the "
           "TE rpc port, and sent by every client (never logged; docs/security.md)", _SEC),
    EnvVar("MOONCAKE_AUTH_TOKEN_FILE", _str, "",
           "file whose first line is that secret (wins over `MOONCAKE_AUTH_TOKEN`; unreadable = error)", _SEC),
    EnvVar("MC_TRANSFER_TIMEOUT", _timeout, 30.0,
           "seconds any transfer may take before it fails (plus 1 s per GiB moved)", _TE),
    EnvVar("MC_FORCE_TCP", _flag, False,
           "never use the same-host (cma) or in-process transports; protocol \"rdma\" runs over tcp "
           "(NICs unused)", _TE),
    EnvVar("MC_TCP_BIND_ADDRESS", _str, "", "where the engine's rpc/data port listens", _TE,
           "the host of `local_hostname`"),
    EnvVar("MC_TCP_CONNECTIONS", _int(1), 2, "tcp connections per peer a batch is spread over", _TE),
    EnvVar("MC_SLICE_SIZE", _int(1), 1 << 20, "bytes per tcp slice (the unit pipelined and spread)", _TE, "1 MiB"),
    EnvVar("MC_TCP_VEC_BYTES", _int(1), 16 << 20, "payload bytes per vectored WRITEV/READV request", _TE, "16 MiB"),
    EnvVar("MC_TCP_RCVLOWAT", _int(0), 1 << 20,
           "bytes a large vectored tcp receive lets arrive before the kernel wakes it (SO_RCVLOWAT; 0 = off)",
           _TE, "1 MiB"),
    EnvVar("MC_TCP_SNDBUF", _int(0), 0, "SO_SNDBUF of each tcp data connection, bytes (0 = kernel autotuning)", _TE),
    EnvVar("MC_TCP_RCVBUF", _int(0), 0, "SO_RCVBUF of each tcp data connection, bytes (0 = kernel autotuning)", _TE),
    EnvVar("MC_TCP_BUSY_POLL_US", _int(0), 50,
           "microseconds a small tcp round trip polls before sleeping (0 = never poll)", _TE),
    EnvVar("MC_TCP_MAX_CONNS_PER_PEER", _int(1), 256,
           "connections one peer address may hold open to this engine's rpc port (more are refused)", _TE),
    EnvVar("MC_DEVICE_STAGING_BYTES", _int(4096), 64 << 20,
           "bytes per pinned host buffer that stages an initiator's GPU memory over tcp/cma (three per "
           "transfer in flight: two on the wire, one being copied)", _TE, "64 MiB"),
    EnvVar("MC_UCX_LIBRARY", _str, "",
           "which UCX (libucp) the `rdma` transport loads: `system`, `nixl`, `wheel` or a path to `libucp.so` "
           "(docs/transfer-engine.md)", _TE, "already loaded, then system, NIXL's, the libucx wheel"),
    EnvVar("MC_UCX_BUSY_POLL_US", _int(0), 50,
           "`rdma`: microseconds a transfer polls its UCX worker before sleeping on its event fd (the "
           "progress thread polls twice as long after serving a peer; both back off on a loaded host; "
           "0 = never poll)", _TE),
    EnvVar("MC_WORKERS_PER_CTX", _int(1), 2,
           "`rdma`: UCP workers per NIC, each with its progress thread; a transfer of at least 2 MiB is split "
           "over them (as the original's worker threads per context)", _TE),
    EnvVar("MC_UCX_PEER_ERRORS", _flag, False,
           "UCX endpoints with peer error handling (a dead peer fails fast; UCX then drops shared-memory "
           "lanes and halves tcp PUT), otherwise a dead peer is found by the transfer deadline", _TE),
    EnvVar("MC_IB_PORT", _int(1), None, "`rdma`: port of an RDMA device named without one (default: all)", _TE),
    EnvVar("MC_GID_INDEX", _int(0), None, "`rdma`: RoCE GID index (UCX_IB_GID_INDEX)", _TE),
    EnvVar("MC_MTU", _int(256), None, "`rdma`: path MTU in bytes (UCX_IB_PATH_MTU)", _TE),
    EnvVar("MC_IB_SL", _int(0), None, "`rdma`: InfiniBand service level (UCX_IB_SL)", _TE),
    EnvVar("MC_IB_TC", _int(0), None, "`rdma`: traffic class (UCX_IB_TRAFFIC_CLASS)", _TE),
    EnvVar("MC_RETRY_CNT", _int(0), None, "`rdma`: RC retry count (UCX_RC_RETRY_COUNT)", _TE),
    EnvVar("MC_SLICE_TIMEOUT", _float, 2.0,
           "`rdma` with several NICs: seconds a NIC may make no progress before it is taken out and its "
           "slices retried on the others (0 = only the transfer deadline)", _TE),
    EnvVar("MC_RDMA_RAIL_PAUSE_SECONDS", _float, 30.0, "`rdma`: seconds a failed NIC stays out before it is "
           "tried again", _TE),
    EnvVar("MC_CUSTOM_TOPO_JSON", _str, "",
           "file with the NIC matrix `{\"cpu:0\": [[preferred NICs], [other NICs]], ...}` used instead of "
           "discovery (`get_local_topology`, which NICs a region's slices go to first)", _TE),
    EnvVar("MC_METRICS_PORT", _int(0), None, "serve the engine's Prometheus `/metrics` on this port", _TE),
    EnvVar("MC_METADATA_REFRESH_S", _float, 2.0,
           "seconds between checks that our segment descriptor is still published", _TE),
    EnvVar("MC_MANAGED_POOL_SIZE", _int(1), 64 << 20,
           "bytes per memfd chunk behind `allocate_managed_buffer`", _TE, "64 MiB"),
    EnvVar("MC_METADATA_HTTP_TOKEN", _secret, None,
           "bearer token the HTTP metadata server requires and clients send", _META),
    EnvVar("MC_METADATA_MAX_KEYS", _int(1), 65536, "keys the HTTP metadata server holds at most (507 above)", _META),
    EnvVar("MC_METADATA_MAX_TOTAL_BYTES", _int(1), 1 << 30,
           "value bytes the HTTP metadata server holds at most (507 above)", _META, "1 GiB"),
    EnvVar("MC_REDIS_USERNAME", _secret, None, "Redis user when the `redis://` string has none", _META),
    EnvVar("MC_REDIS_PASSWORD", _secret, None, "Redis password when the `redis://` string has none", _META),
    EnvVar("MC_REDIS_DB_INDEX", _int(0), 0, "Redis database when the `redis://` string names none", _META),
    EnvVar("MC_STORE_RPC_TIMEOUT", _float, None,
           "seconds a store client waits for the master per call (LMCache: `mooncake_rpc_timeout` in "
           "`extra_config`)", _STORE, "5"),
    EnvVar("MC_STORE_CLUSTER_ID", _str, "mooncake_cluster",
           "cluster whose master a client with master_server_addr=etcd://... looks for (the masters' "
           "--cluster_id)", _STORE),
    EnvVar("MC_STORE_HEARTBEAT_INTERVAL", _float, 1.0, "seconds between a store client's heartbeats", _STORE),
    EnvVar("MC_STORE_PREFAULT", _flag, True,
           "fault pages in before transfers write there (and populate a new segment)", _STORE),
    EnvVar("MC_STORE_HUGEPAGES", _flag, False, "ask for transparent huge pages for the segment", _STORE),
    EnvVar("MC_STORE_PUT_SESSION_MAX_S", _float, 25.0,
           "seconds a put session may write before its writes are refused", _STORE),
    EnvVar("MC_MASTER_BUSY_POLL_US", _int(0), 50,
           "microseconds a master RPC polls for its reply before sleeping (0 = never)", _STORE),
    EnvVar("MOONCAKE_CONFIG_PATH", _str, "", "JSON store config used by `setup()` without arguments", _STORE),
    EnvVar("MOONCAKE_MASTER", _str, "", "master address for `setup()` without arguments", _STORE),
    EnvVar("MOONCAKE_LOCAL_HOSTNAME", _str, "", "the address peers reach this host at (store / connectors); "
           "a loopback one while the master or metadata service is remote is warned about at setup", _STORE,
           "the source address of the route to the master (store), `127.0.0.1` (connectors)"),
    EnvVar("MOONCAKE_TE_META_DATA_SERVER", _str, "", "metadata server of the store's engine", _STORE,
           "P2PHANDSHAKE"),
    EnvVar("MOONCAKE_GLOBAL_SEGMENT_SIZE", _str, "", "bytes this client contributes (e.g. `4GB`)", _STORE,
           "3.125 GiB"),
    EnvVar("MOONCAKE_LOCAL_BUFFER_SIZE", _str, "", "bytes of the local transfer buffer", _STORE,
           "1 GiB"),
    EnvVar("MOONCAKE_PROTOCOL", _str, "", "`tcp` or `rdma`", _STORE, "tcp"),
    EnvVar("MOONCAKE_DEVICE", _str, "", "RDMA device names", _STORE),
    EnvVar("MOONCAKE_OFFLOAD_ENABLED", _str, "", "enable the SSD tier on this client (boolean)", _STORE, "0"),
    EnvVar("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", _str, "", "SSD tier directory", _STORE),
    EnvVar("MOONCAKE_TENANT_ID", _str, "", "tenant of this client", _STORE, "default"),
    EnvVar("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", _str, "", "serve this client's metrics over HTTP (boolean)", _STORE,
           "0"),
    EnvVar("MOONCAKE_CLIENT_HTTP_PORT", _str, "", "port of that HTTP server", _STORE, "9300"),
    EnvVar("MOONCAKE_VLLM_CPU_SHIM", _flag, False,
           "let vLLM's built-in Mooncake connector start on a CPU-only torch", _FW),
    EnvVar("MOONCAKE_LMDEPLOY_BACKEND", _str, "core",
           "`core`: our backend under LMDeploy's `--migration-backend Mooncake`; `lmdeploy`: keep LMDeploy's "
           "own (on our engine)", _FW),
    EnvVar("MOONCAKE_LMDEPLOY_DEVICE", _str, "",
           "NICs our LMDeploy backend's engine uses under `--migration-protocol RDMA` (its `device_name`, e.g. "
           "`mlx5_0,mlx5_1`, as given)", _FW,
           "as LMDeploy's own backend: the RDMA device at index rank mod count, none without RDMA devices"),
    EnvVar("MC_LOG_LEVEL", _str, "INFO", "log level of services (`DEBUG`, `INFO`, ...)", _GEN),
    EnvVar("MC_LOG_JSON", _flag, False, "one JSON object per log line", _GEN),
    EnvVar("MOONCAKE_CORE_COMPAT", _flag, False,
           "make `import mooncake.*` resolve to this package even when the original is installed", _GEN),
    EnvVar("MOONCAKE_TEST_ETCD", _str, "", "`host:port` of a running etcd the tests use instead of their own",
           _TEST),
    EnvVar("MOONCAKE_TEST_REDIS", _str, "", "`host:port` of a running Redis the tests use instead of their own",
           _TEST),
    EnvVar("MOONCAKE_REQUIRE_<FW>", _flag, False,
           "a missing framework venv/binary fails the tests instead of skipping (set by `.ci/run`)", _TEST),
]

VARIABLES: dict[str, EnvVar[Any]] = {v.name: v for v in _VARS}
SECTIONS: tuple[str, ...] = (_SEC, _TE, _META, _STORE, _FW, _GEN, _TEST)

if TYPE_CHECKING:  # what ``envs.NAME`` evaluates to (read at call time through __getattr__)
    MOONCAKE_AUTH_TOKEN: str | None
    MOONCAKE_AUTH_TOKEN_FILE: str
    MC_TRANSFER_TIMEOUT: float
    MC_FORCE_TCP: bool
    MC_TCP_BIND_ADDRESS: str
    MC_TCP_CONNECTIONS: int
    MC_SLICE_SIZE: int
    MC_TCP_VEC_BYTES: int
    MC_TCP_RCVLOWAT: int
    MC_TCP_SNDBUF: int
    MC_TCP_RCVBUF: int
    MC_TCP_BUSY_POLL_US: int
    MC_TCP_MAX_CONNS_PER_PEER: int
    MC_DEVICE_STAGING_BYTES: int
    MC_UCX_LIBRARY: str
    MC_UCX_BUSY_POLL_US: int
    MC_WORKERS_PER_CTX: int
    MC_UCX_PEER_ERRORS: bool
    MC_IB_PORT: int | None
    MC_GID_INDEX: int | None
    MC_MTU: int | None
    MC_IB_SL: int | None
    MC_IB_TC: int | None
    MC_RETRY_CNT: int | None
    MC_SLICE_TIMEOUT: float
    MC_RDMA_RAIL_PAUSE_SECONDS: float
    MC_CUSTOM_TOPO_JSON: str
    MC_METRICS_PORT: int | None
    MC_METADATA_REFRESH_S: float
    MC_MANAGED_POOL_SIZE: int
    MC_METADATA_HTTP_TOKEN: str | None
    MC_METADATA_MAX_KEYS: int
    MC_METADATA_MAX_TOTAL_BYTES: int
    MC_REDIS_USERNAME: str | None
    MC_REDIS_PASSWORD: str | None
    MC_REDIS_DB_INDEX: int
    MC_STORE_RPC_TIMEOUT: float | None
    MC_STORE_CLUSTER_ID: str
    MC_STORE_HEARTBEAT_INTERVAL: float
    MC_STORE_PREFAULT: bool
    MC_STORE_HUGEPAGES: bool
    MC_STORE_PUT_SESSION_MAX_S: float
    MC_MASTER_BUSY_POLL_US: int
    MOONCAKE_CONFIG_PATH: str
    MOONCAKE_MASTER: str
    MOONCAKE_LOCAL_HOSTNAME: str
    MOONCAKE_TE_META_DATA_SERVER: str
    MOONCAKE_GLOBAL_SEGMENT_SIZE: str
    MOONCAKE_LOCAL_BUFFER_SIZE: str
    MOONCAKE_PROTOCOL: str
    MOONCAKE_DEVICE: str
    MOONCAKE_OFFLOAD_ENABLED: str
    MOONCAKE_OFFLOAD_FILE_STORAGE_PATH: str
    MOONCAKE_TENANT_ID: str
    MOONCAKE_ENABLE_CLIENT_HTTP_SERVER: str
    MOONCAKE_CLIENT_HTTP_PORT: str
    MOONCAKE_VLLM_CPU_SHIM: bool
    MOONCAKE_LMDEPLOY_BACKEND: str
    MOONCAKE_LMDEPLOY_DEVICE: str
    MC_LOG_LEVEL: str
    MC_LOG_JSON: bool
    MOONCAKE_CORE_COMPAT: bool
    MOONCAKE_TEST_ETCD: str
    MOONCAKE_TEST_REDIS: str


def get(name: str, env: Mapping[str, str] | None = None) -> Any:
    """The current value of variable ``name`` (from ``env``, default ``os.environ``)."""
    try:
        var = VARIABLES[name]
    except KeyError:
        raise AttributeError(f"{name} is not a mooncake-core environment variable (see mooncake_core/envs.py)") \
            from None
    return var.get(env)


def require(framework: str) -> bool:
    """``MOONCAKE_REQUIRE_<FRAMEWORK>``: must a missing framework fail (CI) rather than skip?"""
    name = f"MOONCAKE_REQUIRE_{framework.upper()}"
    raw = os.environ.get(name)
    return False if raw is None else parse_flag(raw, name)


def __getattr__(name: str) -> Any:
    if name in VARIABLES:
        return VARIABLES[name].get()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *VARIABLES])


def markdown_table() -> str:
    """The README's configuration table (one section per component)."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for section in SECTIONS:
        lines.append(f"| **{section}** | | |")
        for v in _VARS:
            if v.section == section:
                lines.append(f"| `{v.name}` | {v.default_text()} | {v.doc} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m mooncake_core.envs",
                                description="List mooncake-core's environment variables with their current values.")
    p.add_argument("--markdown", action="store_true", help="print the README's configuration table instead")
    a = p.parse_args(argv)
    if a.markdown:
        sys.stdout.write(markdown_table())
        return 0
    for v in _VARS:
        if "<" in v.name:
            continue
        raw = os.environ.get(v.name)
        shown = "(unset)" if raw is None else ("***" if v.parse is _secret else repr(raw))
        print(f"{v.name:<36} {shown:<20} {v.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
