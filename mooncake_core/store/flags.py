"""gflags-compatible command-line parsing for ``mooncake_master``.

Users' launch scripts pass flags the way the original (C++ gflags) binary accepts them, so
we accept exactly those forms: ``--flag=value``, ``--flag value``, ``-flag=value``; booleans
as ``--flag``, ``--flag=true|false|1|0|yes|no`` and ``--noflag``. ``-`` and ``_`` in flag
names are interchangeable (``--log-level`` == ``--log_level``). Unknown flags, missing or
malformed values raise ``FlagError`` naming the flag; ``main`` turns that into exit code 2.
argparse is not used because it cannot express ``--noflag`` / single-dash long flags and
would treat ``--flag false`` differently from gflags.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from mooncake_core.utils.sizes import parse_size


class FlagError(ValueError):
    """A command-line error; the message names the flag and what was expected."""


class HelpRequested(Exception):
    pass


_TRUE = {"true", "1", "yes", "y", "on", "t"}
_FALSE = {"false", "0", "no", "n", "off", "f"}


def _parse_bool(name: str, v: str) -> bool:
    lv = v.strip().lower()
    if lv in _TRUE:
        return True
    if lv in _FALSE:
        return False
    raise FlagError(f"--{name}: expected a boolean (true/false), got {v!r}")


def _parse_int(name: str, v: str) -> int:
    try:
        return int(v.strip(), 0)
    except ValueError:
        raise FlagError(f"--{name}: expected an integer, got {v!r}") from None


def _parse_float(name: str, v: str) -> float:
    try:
        return float(v.strip())
    except ValueError:
        raise FlagError(f"--{name}: expected a number, got {v!r}") from None


def _parse_size(name: str, v: str) -> int:
    try:
        return parse_size(v, name=f"--{name}")
    except ValueError as e:
        raise FlagError(str(e)) from None


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "bool": _parse_bool, "int": _parse_int, "float": _parse_float, "str": lambda n, v: v,
    "size": _parse_size,
}


@dataclass
class Flag:
    name: str
    kind: str  # bool | int | float | str | size
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None  # returns an error text or None


class FlagSet:
    """A set of gflags-style flags."""

    def __init__(self, prog: str, description: str, flags: Sequence[Flag],
                 not_implemented: dict[str, str] | None = None):
        self.prog = prog
        self.description = description
        self.flags = {f.name: f for f in flags}
        #: flags of the original program this one does not implement -> why (named in the refusal)
        self.not_implemented = dict(not_implemented or {})

    def _lookup(self, raw: str) -> tuple[Flag | None, bool]:
        """(flag, negated) for a name as typed (without dashes)."""
        name = raw.replace("-", "_")
        f = self.flags.get(name)
        if f is not None:
            return f, False
        if name.startswith("no"):
            f = self.flags.get(name[2:])
            if f is not None and f.kind == "bool":
                return f, True
        return None, False

    def parse(self, argv: Sequence[str]) -> dict[str, Any]:
        """Values of every flag (defaults filled in). Raises FlagError / HelpRequested."""
        values = {n: f.default for n, f in self.flags.items()}
        explicit: set[str] = set()
        args = list(argv)
        i = 0
        while i < len(args):
            a = args[i]
            i += 1
            if a in ("--help", "-help", "-h", "--helpfull"):
                raise HelpRequested()
            if a == "--":
                if i < len(args):
                    raise FlagError(f"unexpected positional argument {args[i]!r} (mooncake_master takes only flags)")
                break
            if not a.startswith("-") or a in ("-",):
                raise FlagError(f"unexpected positional argument {a!r} (flags look like --name=value)")
            body = a.lstrip("-")
            name, eq, val = body.partition("=")
            f, negated = self._lookup(name)
            if f is None:
                why = self.not_implemented.get(name.replace("-", "_"))
                if why is not None:
                    raise FlagError(f"--{name} is a flag of the original {self.prog} that this one does not "
                                    f"implement: {why}")
                raise FlagError(f"unknown flag --{name} (run with --help to list the flags)")
            if f.kind == "bool":
                if negated:
                    if eq:
                        raise FlagError(f"--{name}: a --no<flag> form takes no value")
                    v: Any = False
                elif eq:
                    v = _parse_bool(f.name, val)
                else:
                    v = True
            else:
                if not eq:
                    if i >= len(args):
                        raise FlagError(f"--{f.name}: missing value (use --{f.name}=VALUE)")
                    val = args[i]
                    i += 1
                v = _PARSERS[f.kind](f.name, val)
            if f.check is not None:
                problem = f.check(v)
                if problem:
                    raise FlagError(f"--{f.name}={v!r}: {problem}")
            values[f.name] = v
            explicit.add(f.name)
        values["__explicit__"] = explicit
        return values

    def help_text(self) -> str:
        lines = [f"usage: {self.prog} [--flag=value ...]", "", self.description, "",
                 "Flags (gflags syntax: --flag=value, --flag value, booleans --flag / --noflag / --flag=false):"]
        for f in self.flags.values():
            default = (repr(f.default) if f.kind == "str" else str(f.default).lower() if f.kind == "bool"
                       else str(f.default))
            lines.append(f"  --{f.name} ({f.kind}, default {default})")
            lines.extend(textwrap.wrap(f.help, 88, initial_indent="      ", subsequent_indent="      "))
        return "\n".join(lines) + "\n"


def _port(v: int) -> str | None:
    return None if 0 <= v <= 65535 else "must be a port number 0..65535"


def _ratio(v: float) -> str | None:
    return None if 0.0 <= v <= 1.0 else "must be between 0.0 and 1.0"


def _positive(v: float) -> str | None:
    return None if v > 0 else "must be > 0"


def _non_negative(v: float) -> str | None:
    return None if v >= 0 else "must be >= 0"


def _cluster_id(v: str) -> str | None:
    from mooncake_core.store.ha import check_cluster_id

    try:
        check_cluster_id(v)
    except ValueError as e:
        return str(e).removeprefix(f"cluster_id {v!r}: ")
    return None


def _allocation_strategy(v: str) -> str | None:
    ok = ("random", "free_ratio_first", "local_first")
    if v in ("cxl", "ssd_free_ratio_first"):
        return f"{v} needs a CXL / NVMe-oF tier this master does not have; use one of {', '.join(ok)}"
    return None if v in ok else f"must be one of {', '.join(ok)} (case-sensitive)"


def _log_level(v: str) -> str | None:
    ok = {"debug", "info", "warning", "warn", "error", "critical"}
    return None if v.lower() in ok else f"must be one of {sorted(ok)}"


def _ha_backend_type(v: str) -> str | None:
    return None if v.lower() in ("etcd", "redis") else "must be etcd or redis (k8s leases are not supported)"


MASTER_FLAGS = [
    Flag("config_path", "str", "", "JSON file of master settings (keys = flag names; Mooncake's "
         "'client_live_ttl_sec' also accepted). Flags given on the command line win."),
    Flag("port", "int", 50051, "Port of the master RPC service (clients' master_server_addr "
         "is host:PORT). 0 picks a free port (logged at start).", _port),
    Flag("rpc_port", "int", 0, "Preferred alias of --port; 0 = use --port.", _port),
    Flag("rpc_address", "str", "0.0.0.0", "Address the RPC service binds to. In HA mode it is also "
         "the address published in etcd for clients, so give a reachable one (0.0.0.0 publishes "
         "this host's IP)."),
    Flag("metrics_address", "str", "0.0.0.0", "Address the Prometheus metrics endpoint binds to (ours; the "
         "original always uses all interfaces). Metrics are read-only and unauthenticated: 127.0.0.1 keeps "
         "them on this host."),
    Flag("auth_token_file", "str", "", "File whose first line is the shared secret every client must prove "
         "(master RPC) or send (embedded HTTP metadata server writes); wins over $MOONCAKE_AUTH_TOKEN_FILE "
         "and $MOONCAKE_AUTH_TOKEN. Unset everywhere = no authentication (a loud warning when bound beyond "
         "loopback). Never pass the token itself on a command line (docs/security.md)."),
    Flag("http_metadata_server_tls_cert", "str", "", "PEM certificate: serve the embedded HTTP metadata server "
         "over HTTPS (with --http_metadata_server_tls_key; clients then use https://HOST:PORT/metadata)."),
    Flag("http_metadata_server_tls_key", "str", "", "PEM private key of --http_metadata_server_tls_cert."),
    Flag("max_batch_keys", "int", 1 << 20, "Most keys one batch request may carry; a larger batch is refused "
         "with -600 naming this limit (ours: bounds the time one request holds the master).", _positive),
    Flag("max_value_size", "size", 0, "Largest value (bytes or '1 GB') a put may store; a larger one is "
         "refused with -600 naming this limit. 0 = no limit (a put larger than the free space gets -200).",
         _non_negative),
    Flag("metrics_port", "int", 9003, "HTTP port of the master: Prometheus metrics at /metrics and the live "
         "dashboard at /dashboard (open http://HOST:PORT/dashboard in a browser; add ?token=T when the "
         "services use an auth token). 0 = any free port.", _port),
    Flag("enable_metric_reporting", "bool", True, "Serve /metrics and /dashboard on --metrics_port."),
    Flag("dashboard_te_metrics", "str", "", "Transfer Engine metrics endpoints (host:port or URLs, separated "
         "by ',') whose bytes/s per transport /dashboard shows (engines started with MC_METRICS_PORT); "
         "each is scraped with a 0.5 s timeout per page refresh."),
    Flag("default_kv_lease_ttl", "int", 10000, "Lease (ms) granted to a reader by every "
         "GetReplicaList: the object is neither evicted nor removed (without force) while leased, "
         "and a read that outlives its lease fails with -707.", _positive),
    Flag("default_kv_soft_pin_ttl", "int", 30 * 60 * 1000, "How long (ms) a soft pin protects an "
         "object from eviction when the put does not give soft_pin_ttl_ms; refreshed on each read.", _positive),
    Flag("allow_evict_soft_pinned_objects", "bool", True, "Evict soft-pinned objects (last) when "
         "evicting the others did not free enough."),
    Flag("eviction_high_watermark_ratio", "float", 0.90, "Start evicting when used/capacity of all "
         "segments reaches this ratio.", _ratio),
    Flag("allocation_strategy", "str", "random", "Where a replica goes among the segments a put "
         "does not prefer: random (the default, as in the original: spreads new puts evenly, a node that "
         "rejoined empty gets its 1/N share; a writer that cannot reach the segment it was given -- a dead "
         "node's, still mounted until its client_ttl -- puts again once, away from it), free_ratio_first "
         "(largest free fraction first: fills an empty node first), local_first (segments on the writer's "
         "host first, then random).",
         _allocation_strategy),
    Flag("max_keys", "int", 0, "Most objects the master keeps (its memory grows about 160 bytes per "
         "object plus the key): a put of a new key past it evicts the least recently used evictable "
         "object, or fails with -200 naming this flag when none can go (leased, pinned, grouped, on the "
         "SSD tier). Puts in flight count once published. 0 = no bound. Metrics: "
         "mooncake_master_key_limit_evictions_total, _key_limit_refusals_total.", _non_negative),
    Flag("pending_task_timeout_sec", "int", 300, "A copy/move task (create_copy_task, create_move_task, "
         "a drain's move) that the client holding its source has not picked up within this many seconds "
         "fails. 0 = no timeout.", _non_negative),
    Flag("processing_task_timeout_sec", "int", 300, "A task picked up and not answered within this many "
         "seconds fails (its target ranges are quarantined; the object stays leased until then, so it is "
         "never 0 here).", _positive),
    Flag("max_total_pending_tasks", "int", 10000, "Most tasks waiting to be picked up: create_copy_task / "
         "create_move_task beyond it return -1401 (TASK_PENDING_LIMIT_EXCEEDED).", _positive),
    Flag("max_total_processing_tasks", "int", 10000, "Most tasks carried out at once: heartbeats hand "
         "out no more until some finish.", _positive),
    Flag("max_total_finished_tasks", "int", 10000, "How many finished tasks query_task still knows "
         "(oldest forgotten first: -1400 TASK_NOT_FOUND).", _positive),
    Flag("eviction_ratio", "float", 0.05, "Fraction of the total capacity one eviction round frees "
         "(least recently used objects first).", _ratio),
    Flag("client_ttl", "int", 10, "Seconds without a heartbeat after which a client counts as dead: "
         "its segments are unmounted and the replicas on them dropped.", _positive),
    Flag("put_start_discard_timeout_sec", "int", 30, "A put started but not finished within this many "
         "seconds may be taken over by another put of the same key.", _positive),
    Flag("put_start_release_timeout_sec", "int", 600, "Space of a put never finished is released after "
         "this many seconds.", _positive),
    Flag("recovery_hold_ms", "int", 1000, "After a restart or HA failover, a segment its client re-mounts "
         "takes no new allocation for this long (gets work at once; puts go to other segments or get -200). "
         "A new master does not know the read leases its predecessor granted: with this hold, and readers "
         "whose copy took longer than 80% of it confirming the master's epoch afterwards (-707 if it "
         "changed), no read ever returns memory reused by a new put. Fresh segments are not held. "
         "0 = off, as the original (that race is then possible).", _non_negative),
    Flag("remove_by_regex_budget_ms", "int", 1000, "Longest one remove_by_regex pattern may take to match "
         "every key; a slower (backtracking) pattern is refused with -600 and removes nothing, so a hostile "
         "pattern cannot freeze the master (ours; the original has no bound).", _positive),
    Flag("enable_http_metadata_server", "bool", False, "Also run the HTTP metadata server in this process "
         "(one process gives a whole single-node setup: clients use "
         "metadata_server=http://HOST:PORT/metadata)."),
    Flag("http_metadata_server_host", "str", "0.0.0.0", "Bind address of the embedded HTTP metadata server."),
    Flag("http_metadata_server_port", "int", 8080, "Port of the embedded HTTP metadata server.", _port),
    Flag("http_metadata_server_persist_path", "str", "", "Optional file where the embedded HTTP "
         "metadata server persists its keys, so a restart does not lose segment descriptors."),
    Flag("enable_ha", "bool", False, "High availability: run as one of several masters; the leader is "
         "elected through etcd (--etcd_endpoints) or Redis (--ha_backend_type=redis). Clients use "
         "master_server_addr=etcd://h:p[;h2:p] or redis://h:p."),
    Flag("etcd_endpoints", "str", "", "etcd endpoints for HA, 'host:port;host2:port' (separated by ';')."),
    Flag("cluster_id", "str", "mooncake_cluster", "Name of this cluster (1-128 of [0-9A-Za-z_.-]). It "
         "namespaces what clusters could share: the HA leader key in etcd or Redis (mooncake-store/<id>/master/leader; "
         "clients name the cluster with env MC_STORE_CLUSTER_ID) and the SSD-tier files "
         "(<--root_fs_dir>/<id>/), as the original's.", _cluster_id),
    Flag("ha_backend_type", "str", "etcd", "Where HA masters elect their leader: etcd or redis (the "
         "original also accepts k8s, not supported here).", _ha_backend_type),
    Flag("ha_backend_connstring", "str", "", "Connection string of the HA backend: redis://[[user]:password@]"
         "host:port[/db] for redis (the password may also come from MC_REDIS_PASSWORD), etcd://host:port[;...] "
         "for etcd (default: --etcd_endpoints)."),
    Flag("enable_offload", "bool", False, "SSD tier: evicted objects are written by their owner client to "
         "files under --root_fs_dir and read back (and promoted to memory) on a later get."),
    Flag("offload_on_evict", "bool", False, "Offload to the SSD tier when an object is evicted (the original's "
         "alternative to offloading at put end). This master always offloads at eviction, so with "
         "--enable_offload this must be true (false is refused: offloading every object at put end is not "
         "implemented)."),
    Flag("promotion_on_hit", "bool", False, "Promote an object held only on the SSD tier back to memory when it "
         "is read. This master always promotes on a read, so with --enable_offload this must be true."),
    Flag("promotion_admission_threshold", "int", 1, "Reads of an SSD-only object before it is promoted. Only 1 "
         "(promote on the first read) is implemented; the original's second-touch gating (its default 2) is not.",
         lambda v: None if v == 1 else "only 1 is implemented (promote on the first read)"),
    Flag("root_fs_dir", "str", "", "Directory of the SSD tier, shared by the master and its clients "
         "(local or network file system). Required with --enable_offload."),
    Flag("quota_bytes", "size", 0, "Capacity of the SSD tier (bytes or '10 GB'); least recently used files "
         "are deleted above it. 0 = 90% of the file system's size.", _non_negative),
    Flag("enable_kv_events", "bool", False, "Publish the store's blocks as vLLM-format KV cache events "
         "(BlockStored / BlockRemoved / AllBlocksCleared, medium STORAGE) on a ZMQ PUB socket, for indexers "
         "such as llm-d's prefix-cache scorer or Dynamo's KV router (needs pyzmq: the kv-events extra)."),
    Flag("kv_events_bind_endpoint", "str", "", "ZMQ PUB endpoint the KV events are published on, e.g. "
         "tcp://0.0.0.0:5557; required with --enable_kv_events."),
    Flag("kv_events_replay_endpoint", "str", "", "ZMQ ROUTER endpoint answering replay requests (a subscriber "
         "that missed batches sends the first seq it wants as 8 bytes big-endian and gets the buffered "
         "batches from there, then seq -1), as vLLM's publisher does. Empty = no replay."),
    Flag("kv_events_buffer_steps", "int", 10_000, "Batches kept for replay.", _positive),
    Flag("kv_events_backend_id", "str", "", "Cache-owner identity written into every event as backend_id "
         "(ignored by vLLM's decoder; indexers that know it tell pools apart)."),
    Flag("kv_events_block_size", "int", 0, "block_size written into BlockStored events (the engines' block "
         "size; the master does not know it). 0 = unknown.", _non_negative),
    Flag("kv_events_emit_object_key", "bool", True, "Also write each event's store key as object_key, and "
         "publish keys that are not KV block keys (with no block hash) instead of skipping them."),
    Flag("rpc_busy_poll_us", "int", 100, "After answering requests, keep polling for the next one this many "
         "microseconds before sleeping. Back-to-back calls from one client thread (is_exist loops) then "
         "skip the scheduler wake-up (~10k -> several 10k calls/s on a VM); costs at most this much CPU "
         "after each burst, none while idle. 0 = always sleep.", _non_negative),
    Flag("log_level", "str", "info", "Log level: debug, info, warning, error.", _log_level),
    Flag("max_threads", "int", 4, "Accepted for compatibility; requests are handled on one thread "
         "(the state is small and each request takes microseconds).", _positive),
    Flag("rpc_thread_num", "int", 0, "Accepted for compatibility (see --max_threads).", _non_negative),
]

MASTER_DESCRIPTION = ("Mooncake Store master: keeps object -> replica locations, allocates space in the "
                      "memory segments clients mount, grants read leases, evicts, and tracks client "
                      "liveness. Never on the data path. Live dashboard: http://HOST:METRICS_PORT/dashboard.")


_WHY_SNAPSHOT = "no snapshots of the master's state: a new master rebuilds it from its clients' re-mounts"
_WHY_OPLOG = "no operation log: HA here is leader election through etcd or Redis, the state rebuilt from the clients"
_WHY_NOF = "no NVMe-oF tier (memory and the --root_fs_dir SSD tier only)"
_WHY_RETRIES = ("a failed copy/move task is not retried here: query_task reports it FAILED with why (create it "
                "again), and a drain counts it as a failed unit")
_WHY_KV_EVENTS = ("not written into the events, as in the original (which keeps the flag only for old configs): "
                  "register model, block size, hash namespace, LoRA and data-parallel rank with the indexer")
_WHY_KV_EVENTS_COMPAT = ("events are always vLLM's wire format (the original's legacy-compatible one: type, "
                         "block_hashes)")
_WHY_KV_EVENTS_QUEUE = ("no queue: the publisher follows the master's key-event ring; falling behind it publishes "
                        "AllBlocksCleared + the store's keys")
_WHY_CXL = "no CXL memory segments"
_WHY_TENANTS = "no multi-tenant quotas (tenant_id is accepted by clients but not enforced)"

#: every flag of the original mooncake_master this master does not implement, and why
MASTER_NOT_IMPLEMENTED: dict[str, str] = {
    "metrics_host": "use --metrics_address (this master's name for the metrics/dashboard bind address)",
    "max_kv_soft_pin_ttl": "soft-pin TTLs are not capped here (--default_kv_soft_pin_ttl sets the default)",
    "rpc_interface": "bind with --rpc_address (an address, not an interface name)",
    "rpc_conn_timeout_seconds": "idle RPC connections are kept; clients bound each call by MC_STORE_RPC_TIMEOUT",
    "rpc_enable_tcp_no_delay": "TCP_NODELAY is always on for the master's RPC sockets",
    "offload_force_evict": "an object that cannot be offloaded is not force-evicted; it stays in memory",
    "offloading_queue_limit": "offloads are handed to the owner client on its heartbeat, without a bounded queue",
    "offload_cap_ratio": "the SSD tier is bounded by --quota_bytes instead",
    "promotion_queue_limit": "promotions run on the read itself, without a queue",
    "promotion_max_per_heartbeat": "promotions run on the read itself, not per heartbeat",
    "dynamic_replication_mode": "no heat-based dynamic replication",
    "dynamic_replication_heat_window_seconds": "no heat-based dynamic replication",
    "global_file_segment_size": "no global file (NFS/3FS) segment; the SSD tier lives under --root_fs_dir",
    "memory_allocator": "one allocator (offset-based, first fit in a range tree)",
    "pod_name": "no Kubernetes pod identity in this master",
    "pod_namespace": "no Kubernetes pod identity in this master",
    "enable_disk_eviction": "SSD-tier files are evicted by --quota_bytes (least recently used) always",
    "enable_multi_tenants": _WHY_TENANTS,
    "tenant_quota_connector_type": _WHY_TENANTS,
    "tenant_quota_connector_uri": _WHY_TENANTS,
    "enable_cxl": _WHY_CXL, "cxl_path": _WHY_CXL, "cxl_size": _WHY_CXL,
    **{f: _WHY_NOF for f in ("nof_eviction_ratio", "nof_eviction_high_watermark_ratio", "nof_heartbeat_interval_sec",
                             "nof_heartbeat_probe_timeout_ms")},
    **{f: _WHY_OPLOG for f in ("enable_oplog", "oplog_poll_interval_ms", "oplog_batch_max_entries",
                               "batch_oplog_retry_timeout_sec")},
    **{f: _WHY_SNAPSHOT for f in (
        "enable_snapshot", "enable_snapshot_restore", "snapshot_backup_dir", "snapshot_interval_seconds",
        "snapshot_child_timeout_seconds", "snapshot_retention_count", "snapshot_object_store_type",
        "snapshot_payload_store_type", "snapshot_payload_backend_type", "snapshot_catalog_store_type",
        "snapshot_catalog_backend_type", "snapshot_catalog_store_connstring", "snapshot_catalog_backend_connstring")},
    "max_retry_attempts": _WHY_RETRIES,
    **{f: _WHY_KV_EVENTS for f in ("kv_events_model_name", "kv_events_tenant_id", "kv_events_additional_salt",
                                   "kv_events_lora_name", "kv_events_dp_rank")},
    "kv_events_emit_legacy_compat": _WHY_KV_EVENTS_COMPAT, "kv_events_queue_capacity": _WHY_KV_EVENTS_QUEUE,
}


def master_flagset() -> FlagSet:
    return FlagSet("mooncake_master", MASTER_DESCRIPTION, MASTER_FLAGS, MASTER_NOT_IMPLEMENTED)


#: config-file keys of the original that differ from the flag names
CONFIG_ALIASES = {"client_live_ttl_sec": "client_ttl"}


def apply_config_file(fs: FlagSet, values: dict[str, Any]) -> dict[str, Any]:
    """Fill values from ``--config_path`` (JSON) for flags not given on the command line."""
    import json

    path = values.get("config_path")
    if not path:
        return values
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise FlagError(f"--config_path: cannot read {path!r}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise FlagError(f"--config_path: {path!r} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise FlagError(f"--config_path: {path!r} must hold a JSON object of settings")
    explicit = values.get("__explicit__", set())
    for key, raw in data.items():
        name = CONFIG_ALIASES.get(key, key.replace("-", "_"))
        flag = fs.flags.get(name)
        if flag is None or name == "config_path":
            raise FlagError(f"--config_path: unknown setting {key!r} in {path!r}")
        if name in explicit:
            continue
        if flag.kind == "bool" and isinstance(raw, bool):
            v: Any = raw
        elif flag.kind in ("int", "size") and isinstance(raw, int) and not isinstance(raw, bool):
            v = raw
        elif flag.kind == "float" and isinstance(raw, (int, float)) and not isinstance(raw, bool):
            v = float(raw)
        elif isinstance(raw, str):
            v = _PARSERS[flag.kind](name, raw)
        else:
            raise FlagError(f"--config_path: setting {key!r} in {path!r}: expected {flag.kind}, got {raw!r}")
        if flag.check is not None:
            problem = flag.check(v)
            if problem:
                raise FlagError(f"--config_path: setting {key!r}={v!r}: {problem}")
        values[name] = v
    return values
