"""``mooncake_master`` console script: flags -> state -> RPC server (+ metrics, HA, HTTP metadata).

Exit codes: 0 clean shutdown (SIGTERM/SIGINT), 2 bad command line, 1 startup failure (port
taken, HA backend unreachable...), 3 lost HA leadership (restart it: it re-joins as a follower).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import sys
import threading
from typing import Sequence

from prometheus_client import CollectorRegistry

from mooncake_core import auth
from mooncake_core.store.flags import FlagError, HelpRequested, apply_config_file, master_flagset
from mooncake_core.store.limits import RequestLimits
from mooncake_core.store.master_server import MasterServer
from mooncake_core.store.master_state import MasterConfig, MasterState
from mooncake_core.utils.gcfreeze import freeze_after_full_collections
from mooncake_core.utils.log import get_logger, setup_logging
from mooncake_core.store.ha import check_cluster_id
from mooncake_core.utils.net import endpoint_host, local_ip

log = get_logger("mooncake.store.master")


def config_from_flags(v: dict) -> MasterConfig:
    """Translate parsed flags into the pure state's config (validating combinations)."""
    if v["enable_offload"] and not v["root_fs_dir"]:
        raise FlagError("--enable_offload needs --root_fs_dir=DIR (where the SSD-tier files live)")
    if v["enable_offload"]:
        # what this master does with the SSD tier is the original's offload_on_evict + promotion_on_hit
        # mode; an explicit request for the other mode is refused, not silently served the wrong way
        for name in ("offload_on_evict", "promotion_on_hit"):
            if name in v.get("__explicit__", ()) and not v[name]:
                raise FlagError(f"--{name}=false is not implemented: this master offloads at eviction and "
                                "promotes on a read (the original's --offload_on_evict=true "
                                "--promotion_on_hit=true)")
    if v["enable_ha"]:
        from mooncake_core.store.ha import leader_backend

        try:  # a wrong backend or connection string fails here, before anything binds
            leader_backend(v["ha_backend_type"], v["ha_backend_connstring"], v["etcd_endpoints"])
        except ValueError as e:
            raise FlagError(str(e)) from None
    quota = v["quota_bytes"]
    if v["enable_offload"] and quota == 0:
        os.makedirs(v["root_fs_dir"], exist_ok=True)  # the cluster's subdirectory is made with its first file
        quota = int(shutil.disk_usage(v["root_fs_dir"]).total * 0.9)
    return MasterConfig(
        default_kv_lease_ttl_ms=v["default_kv_lease_ttl"],
        default_kv_soft_pin_ttl_ms=v["default_kv_soft_pin_ttl"],
        allow_evict_soft_pinned_objects=v["allow_evict_soft_pinned_objects"],
        eviction_ratio=v["eviction_ratio"],
        allocation_strategy=v["allocation_strategy"],
        max_keys=v["max_keys"],
        pending_task_timeout_s=float(v["pending_task_timeout_sec"]),
        processing_task_timeout_s=float(v["processing_task_timeout_sec"]),
        max_total_pending_tasks=v["max_total_pending_tasks"],
        max_total_processing_tasks=v["max_total_processing_tasks"],
        max_total_finished_tasks=v["max_total_finished_tasks"],
        eviction_high_watermark_ratio=v["eviction_high_watermark_ratio"],
        client_ttl_s=float(v["client_ttl"]),
        put_start_discard_timeout_s=float(v["put_start_discard_timeout_sec"]),
        put_start_release_timeout_s=float(v["put_start_release_timeout_sec"]),
        enable_offload=v["enable_offload"],
        # the original keeps a cluster's files under <root_fs_dir>/<cluster_id>
        root_fs_dir=os.path.join(os.path.abspath(v["root_fs_dir"]), check_cluster_id(v["cluster_id"]))
        if v["root_fs_dir"] else "",
        disk_quota_bytes=quota,
        recovery_hold_s=v["recovery_hold_ms"] / 1000.0,
        regex_budget_s=v["remove_by_regex_budget_ms"] / 1000.0,
    )


def loopback_advertise_warning(bind_host: str, advertised: str) -> str | None:
    """The warning for a master bound beyond loopback that advertises a loopback address
    (this host's name resolves to 127.x, as on many VMs and containers): clients elsewhere, and
    the HA record in etcd, would be handed an address that only works on this host. None when
    the advertised address is reachable as far as the bind is."""
    if bind_host not in ("0.0.0.0", "::", ""):
        return None
    host = advertised.rsplit(":", 1)[0].strip("[]")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        return None
    return (f"the master RPC listens on {bind_host or '0.0.0.0'} but advertises {advertised}: this host's "
            f"name resolves to a loopback address, so clients on other hosts cannot use it; pass "
            f"--rpc_address=<an address of this host they reach> (clients then set master_server_address "
            f"to it, and each client host its own MOONCAKE_LOCAL_HOSTNAME)")


def start_kv_events(v: dict, server: MasterServer, state: MasterState):
    """The ZMQ KV-event publisher (kv_events_zmq.py), following the state's key events under the
    server's lock."""
    from mooncake_core.store.kv_events_zmq import EventFormat, KvEventPublisher, follow_reply

    if not v["kv_events_bind_endpoint"]:
        raise FlagError("--enable_kv_events needs --kv_events_bind_endpoint=tcp://HOST:PORT")

    def watch(after: int | None, epoch: int):
        with server.lock:
            return follow_reply(state.key_events, state.objects, state.epoch, after, epoch)

    try:
        pub = KvEventPublisher(watch, v["kv_events_bind_endpoint"], replay_endpoint=v["kv_events_replay_endpoint"],
                               fmt=EventFormat(v["kv_events_block_size"], v["kv_events_backend_id"],
                                               v["kv_events_emit_object_key"]),
                               buffer_steps=v["kv_events_buffer_steps"])
    except ImportError as e:
        raise FlagError(f"--enable_kv_events needs pyzmq (pip install 'mooncake-core[kv-events]'): {e}") from e
    return pub.start()


def main(argv: Sequence[str] | None = None) -> int:
    fs = master_flagset()
    try:
        v = apply_config_file(fs, fs.parse(sys.argv[1:] if argv is None else argv))
        cfg = config_from_flags(v)
    except HelpRequested:
        sys.stdout.write(fs.help_text())
        return 0
    except FlagError as e:
        sys.stderr.write(f"mooncake_master: error: {e}\n")
        return 2
    setup_logging(v["log_level"])
    port = v["rpc_port"] or v["port"]
    host = v["rpc_address"]
    stop = threading.Event()
    exit_code = [0]

    def _on_signal(signum, _frame) -> None:
        log.info("signal received, shutting down", extra={"signal": signum})
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    try:
        token = auth.resolve_token(None, {auth.TOKEN_FILE_VAR: v["auth_token_file"]}) if v["auth_token_file"] \
            else auth.resolve_token()
    except auth.AuthConfigError as e:
        sys.stderr.write(f"mooncake_master: error: {e}\n")
        return 2
    registry = CollectorRegistry()
    state = MasterState(cfg)
    advertise = None
    if host in ("0.0.0.0", "::", ""):
        # the route's source address toward etcd (HA: what clients read there), else the default route's
        ha_conn = v["ha_backend_connstring"] or v["etcd_endpoints"]
        advertise_host = local_ip(toward=endpoint_host(ha_conn) if v["enable_ha"] else None)
    else:
        advertise_host = host
    server = MasterServer(state, host or "0.0.0.0", port, registry=registry,
                          busy_poll_us=v["rpc_busy_poll_us"], auth_token=token,
                          limits=RequestLimits(v["max_batch_keys"], v["max_value_size"]))
    http_meta = None
    election = None
    kv_events = None
    try:
        server.bind()  # bind early (also in HA) so a taken port fails fast, with a clear message
        advertise = (f"[{advertise_host}]:{server.port}" if ":" in advertise_host
                     else f"{advertise_host}:{server.port}")
        server.advertise_address = advertise
        warn = loopback_advertise_warning(host, advertise)
        if warn:
            log.warning(warn, extra={"address": f"{host}:{server.port}", "advertised": advertise})
        if v["enable_metric_reporting"]:
            from mooncake_core.store.master_admin import admin_routes
            from mooncake_core.store.master_dashboard import MasterDashboard, routes
            from mooncake_core.utils.metrics import start_metrics_server

            mhost = v["metrics_address"] or "0.0.0.0"
            dash = MasterDashboard(server, ha_enabled=v["enable_ha"],
                                   te_endpoints=v["dashboard_te_metrics"].split(",")).start()
            mport = start_metrics_server(v["metrics_port"], host=mhost, registry=registry,
                                         routes={**admin_routes(server), **routes(dash)})
            log.info("metrics listening (read-only, no authentication); dashboard at /dashboard",
                     extra={"url": f"http://{mhost}:{mport}/metrics", "port": mport})
        if v["enable_http_metadata_server"]:
            from mooncake_core.metadata.http_server import HttpMetadataServer

            http_meta = HttpMetadataServer(v["http_metadata_server_host"], v["http_metadata_server_port"],
                                           persist_path=v["http_metadata_server_persist_path"] or None,
                                           auth_token=token,
                                           tls_cert=v["http_metadata_server_tls_cert"] or None,
                                           tls_key=v["http_metadata_server_tls_key"] or None).start()
            log.info("HTTP metadata server started", extra={"url": http_meta.url})
        if v["enable_kv_events"]:  # before serving: its first batch is the store as it starts
            kv_events = start_kv_events(v, server, state)
        if v["enable_ha"]:
            from mooncake_core.store.ha import LeaderElection, leader_backend

            def _lost() -> None:
                exit_code[0] = 3
                stop.set()

            def _elected() -> None:
                with server.lock:
                    state.begin_leadership()

            backend = leader_backend(v["ha_backend_type"], v["ha_backend_connstring"], v["etcd_endpoints"],
                                     check_cluster_id(v["cluster_id"]))
            election = LeaderElection(backend, advertise, on_elected=_elected, on_lost=_lost)
            # serve at once: a follower answers ping (is_leader=False) and refuses the rest
            # with -900 "not the leader", so a client given its address fails fast and clearly
            server.leader_check = election.is_valid
            server.start()
            election.start()
            log.info("HA: campaigning for leadership", extra={"rpc_address": advertise,
                                                             "backend": backend.describe()})
        else:
            server.start()
        freeze_after_full_collections()  # millions of records: keep full GCs short
        log.info("mooncake_master ready", extra={
            "rpc_address": advertise, "port": server.port, "ha": v["enable_ha"],
            "offload": cfg.enable_offload, "lease_ttl_ms": cfg.default_kv_lease_ttl_ms,
            "client_ttl_s": cfg.client_ttl_s})
    except FlagError as e:
        sys.stderr.write(f"mooncake_master: error: {e}\n")
        server.stop()
        if http_meta is not None:
            http_meta.stop()
        return 2
    except (OSError, ValueError, ImportError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else e  # without "[Errno 98]"
        sys.stderr.write(f"mooncake_master: error: {why}\n")
        if kv_events is not None:
            kv_events.close()
        server.stop()
        if http_meta is not None:
            http_meta.stop()
        return 1
    while not stop.wait(0.5):
        pass
    if election is not None:
        election.stop()
    if kv_events is not None:
        kv_events.close()
    server.stop()
    if http_meta is not None:
        http_meta.stop()
    return exit_code[0]


if __name__ == "__main__":
    sys.exit(main())
