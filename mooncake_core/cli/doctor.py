"""``mooncake_doctor``: pre-flight checks of one host before it joins a Mooncake cluster.

Most failures people report are set-up mistakes that show up much later as transfer timeouts:
an advertised address peers cannot reach (Debian's 127.0.1.1, a container bridge address), a
firewalled RPC port, a wrong auth token, a memlock limit too small for RDMA. This tool runs each
step in order, says what it found and, for each failure, the fix:

1. the metadata service answers (``--metadata_server``);
2. the master answers and accepts our auth token (``--master_server_address``; HA forms too);
3. the address this host would advertise (``--local_hostname`` / ``MOONCAKE_LOCAL_HOSTNAME``,
   else the route's source address toward the master) -- loopback while the master is remote,
   not an address of this host, or not the one the route to the master leaves from;
4. a Transfer Engine listens on that address and its RPC port accepts a connection there;
5. with ``--peer SEGMENT``: a 4 KiB read from that peer's first registered buffer (a read, so
   the peer's data is never touched), timed;
6. this host's clock against the master's;
7. the memlock limit (RDMA pins memory) and 8. the transports available (RDMA devices).

Exit code 0 only when no step failed (warnings do not fail it); ``--json`` prints the same as JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import socket
import sys
import time
from typing import Any

from mooncake_core import envs
from mooncake_core.cli.doctor_checks import (
    FAIL, OK, SKIP, WARN, Check, clock_check, exit_code, memlock_check, render_json, render_text,
)
from mooncake_core.utils.net import endpoint_host, is_loopback, local_ip, parse_host_port, route_source

PROBE_BYTES = 4096


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mooncake_doctor",
        description="Pre-flight checks of this host for a Mooncake cluster: metadata service, master and "
                    "auth token, the address this host advertises, its RPC port, a 4 KiB round trip to a "
                    "peer, clock offset, memlock limit and transports. Prints the fix for each failure; "
                    "exit code 0 only when no check failed.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--metadata_server", default="P2PHANDSHAKE",
                   help="metadata service as the engines use it: http://HOST:PORT/metadata, etcd://HOST:PORT, "
                        "redis://HOST:PORT or P2PHANDSHAKE (no service)")
    p.add_argument("--master_server_address", default="",
                   help="the store master: HOST:PORT, or etcd://HOST:PORT for an HA pair (empty: skip the "
                        "master checks)")
    p.add_argument("--peer", default="", metavar="SEGMENT",
                   help="a peer's segment name (HOST:PORT, as in the metadata service) to read 4 KiB from")
    p.add_argument("--local_hostname", default="",
                   help="the address to check as this host's advertised one (default: MOONCAKE_LOCAL_HOSTNAME, "
                        "else the source address of the route toward the master / metadata host)")
    p.add_argument("--protocol", default="tcp", choices=("tcp", "rdma"),
                   help="the protocol the engines will use; the checked engine starts with it (rdma: one-sided "
                        "over UCX, its NICs checked; a small memlock limit is a failure)")
    p.add_argument("--device_name", default="",
                   help="NICs for --protocol rdma, as the engines' device_name (e.g. mlx5_0,mlx5_1; names as "
                        "UCX_NET_DEVICES has them); an unknown one fails the engine check, naming it")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds each network step may take")
    p.add_argument("--log-level", default="error", help="log level of the libraries (their warnings repeat the "
                                                      "checks' findings, hence error)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON instead of text")
    return p


# ----------------------------------------------------------------------------- the steps
def check_metadata(conn: str, timeout: float) -> Check:
    name = "metadata service reachable"
    from mooncake_core.metadata import open_metadata

    try:
        meta = open_metadata(conn, timeout=timeout)
    except ValueError as e:
        return Check(name, FAIL, str(e), "give --metadata_server in one of the forms listed")
    if meta is None:
        return Check(name, SKIP, "P2PHANDSHAKE: no metadata service (peers exchange descriptors directly)")
    t0 = time.monotonic()
    try:
        meta.get("mooncake/doctor/probe")
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        return Check(name, FAIL, f"{conn} does not answer: {e}",
                     f"start the metadata service ({conn}) or fix --metadata_server / "
                     "MOONCAKE_TE_META_DATA_SERVER; check a firewall between this host and it")
    finally:
        meta.close()
    return Check(name, OK, f"{conn} answered in {(time.monotonic() - t0) * 1000:.1f} ms")


def check_master(addr: str, timeout: float) -> tuple[Check, Any, float, float | None]:
    """(check, MasterInfo or None, round-trip seconds, the master's clock minus ours or None)."""
    name = "master reachable, auth accepted"
    if not addr:
        return Check(name, SKIP, "no --master_server_address given"), None, 0.0, None
    from mooncake_core.errors import MooncakeError
    from mooncake_core.store.master_client import MasterClient

    try:
        with MasterClient(addr, timeout=timeout) as c:
            c.ping()  # connect and authenticate first: the timed call below is one round trip
            t0 = time.time()
            info = c.ping()
            t1 = time.time()
    except MooncakeError as e:
        msg = e.message
        if "token" in msg.lower() or "auth" in msg.lower():
            return Check(name, FAIL, f"master {addr} refused us: {msg}",
                         "give this host the master's token: MOONCAKE_AUTH_TOKEN_FILE (or MOONCAKE_AUTH_TOKEN), "
                         "the same on every host (docs/security.md)"), None, 0.0, None
        return Check(name, FAIL, f"master {addr}: {msg}",
                     "start mooncake_master, or fix --master_server_address / MOONCAKE_MASTER (HOST:PORT of "
                     "its --port, or etcd://... for HA); check a firewall between this host and it"), None, 0.0, None
    except (OSError, ValueError) as e:
        return Check(name, FAIL, f"master {addr}: {e}",
                     "fix --master_server_address (HOST:PORT or etcd://HOST:PORT)"), None, 0.0, None
    rtt = t1 - t0
    wall = float(getattr(info, "wall_time", 0.0) or 0.0)
    # the master stamped its clock between our send and our receive: compare with the midpoint
    offset = wall - (t0 + t1) / 2 if wall > 0 else None
    role = "leader" if info.is_leader else "NOT the leader"
    return (Check(name, OK, f"{addr} -> {info.rpc_address} ({role}, protocol {info.version}), "
                            f"{rtt * 1000:.1f} ms", data={"rpc_address": info.rpc_address}),
            info, rtt, offset)


def _bindable(host: str) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, 0))
            return True
        except OSError:
            return False


def check_advertised(given: str, toward: str | None) -> tuple[Check, str]:
    """(check, the host part to advertise)."""
    name = "advertised address"
    source = "--local_hostname" if given else ""
    if not given and envs.MOONCAKE_LOCAL_HOSTNAME:
        given, source = envs.MOONCAKE_LOCAL_HOSTNAME, "MOONCAKE_LOCAL_HOSTNAME"
    if given:
        host, _ = parse_host_port(given, 0, what=source)
    else:
        host, source = local_ip(toward=toward), f"route toward {toward}" if toward else "default route"
    data = {"address": host, "source": source}
    try:
        resolved = socket.gethostbyname(host) if ":" not in host else host
    except OSError as e:
        return Check(name, FAIL, f"{host} (from {source}) does not resolve: {e}",
                     "set MOONCAKE_LOCAL_HOSTNAME to this host's IP address", data), host
    if toward and is_loopback(resolved) and not is_loopback(toward):
        better = route_source(toward)
        return Check(name, FAIL, f"{host} (from {source}) is loopback, but the master/metadata host {toward} is "
                                 "not on this host: peers would connect to themselves",
                     f"set MOONCAKE_LOCAL_HOSTNAME={better or 'THIS_HOST_IP'} (the address the route to "
                     f"{toward} leaves from), or unset it", data), host
    if not _bindable(resolved):
        return Check(name, FAIL, f"{host} (from {source}) is not an address of this host (cannot bind it): "
                                 "a NAT or container-bridge address?",
                     "set MOONCAKE_LOCAL_HOSTNAME to an address of this host that peers can reach "
                     "(in Kubernetes: the pod IP from the downward API)", data), host
    route = route_source(toward) if toward else None
    if route is not None and route != resolved and not is_loopback(resolved):
        return Check(name, WARN, f"{host} (from {source}), but the route to {toward} leaves from {route}: peers "
                                 f"on {toward}'s network may not reach {host}",
                     f"check that peers reach {host}; else set MOONCAKE_LOCAL_HOSTNAME={route}", data), host
    return Check(name, OK, f"{host} (from {source})", data=data), host


def check_rpc_port(engine: Any, host: str, timeout: float) -> Check:
    name = "RPC port reachable"
    port = engine.get_rpc_port()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as e:
        return Check(name, FAIL, f"a Transfer Engine listens on {host}:{port}, but connecting there failed: {e}",
                     "open the engines' RPC ports in the host firewall (or set MC_TCP_BIND_ADDRESS / a fixed "
                     "port in MOONCAKE_LOCAL_HOSTNAME=host:port and open that one)", {"port": port})
    return Check(name, OK, f"{host}:{port} accepts connections", data={"port": port})


def check_peer(engine: Any, peer: str, timeout: float) -> Check:
    name = "4 KiB round trip to the peer"
    if not peer:
        return Check(name, SKIP, "no --peer given")
    buf = ctypes.create_string_buffer(PROBE_BYTES)
    addr = ctypes.addressof(buf)
    if engine.register_memory(addr, PROBE_BYTES, "cpu:0") != 0:
        return Check(name, FAIL, f"could not register a local buffer: {engine.last_error}",
                     "see memlock limit below")
    try:
        remote = engine.get_first_buffer_address(peer)
        if not remote:
            why = engine.last_error or "unknown segment"
            return Check(name, FAIL, f"peer {peer}: no registered buffer found ({why})",
                         "check the segment name (as in the metadata service: HOST:PORT) and that the peer runs "
                         "with the same --metadata_server")
        t0 = time.monotonic()
        rc = engine.transfer_sync_read(peer, addr, remote, PROBE_BYTES)
        took = time.monotonic() - t0
        if rc != 0:
            return Check(name, FAIL, f"reading {PROBE_BYTES} B from {peer} failed: {engine.last_error}",
                         "the peer's advertised address or RPC port is not reachable from here: run "
                         "mooncake_doctor on the peer's host; check the firewall between the hosts")
        transport = engine.transport_for(peer)
        return Check(name, OK, f"read {PROBE_BYTES} B from {peer} over {transport} in {took * 1000:.2f} ms",
                     data={"seconds": took, "transport": transport})
    finally:
        engine.unregister_memory(addr)


def check_clock(info: Any, rtt: float, offset: float | None) -> Check:
    if info is None:
        return Check("clock offset against the master", SKIP, "master not reachable")
    return clock_check(offset, rtt)


def check_transports(engine: Any, protocol: str) -> Check:
    name = "transports"
    try:
        devs = sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        devs = []
    if engine is None:
        return Check(name, SKIP, f"no Transfer Engine started (step 4); RDMA devices: {', '.join(devs) or 'none'}",
                     data={"transports": [], "rdma_devices": devs})
    names = engine.transport_names()
    detail = f"{', '.join(names) or 'none'}; RDMA devices: {', '.join(devs) or 'none'}"
    data = {"transports": names, "rdma_devices": devs}
    if protocol == "rdma" and not {"ucx", "rdma"} & set(names):
        return Check(name, FAIL, detail + " -- rdma requested but no RDMA transport is registered",
                     "install the UCX extra (pip install -e '.[ucx]', docs/transfer-engine.md) or use protocol tcp",
                     data)
    return Check(name, OK, detail, data=data)


def run(a: argparse.Namespace) -> list[Check]:
    from mooncake_core.engine import TransferEngine

    checks = [check_metadata(a.metadata_server, a.timeout)]
    master_check, info, rtt, offset = check_master(a.master_server_address, a.timeout)
    checks.append(master_check)
    toward = endpoint_host(a.master_server_address) or endpoint_host(a.metadata_server)
    adv, host = check_advertised(a.local_hostname, toward)
    checks.append(adv)
    engine = None
    if adv.status != FAIL:
        engine = TransferEngine()
        meta = a.metadata_server if checks[0].status == OK else "P2PHANDSHAKE"
        if engine.initialize(f"{host}:0" if ":" not in host else f"[{host}]:0", meta, a.protocol,
                             a.device_name) != 0:
            checks.append(Check("RPC port reachable", FAIL, f"a Transfer Engine cannot start on {host} (protocol "
                                                            f"{a.protocol!r}, device_name {a.device_name!r}): "
                                                            f"{engine.last_error}",
                                "fix the advertised address (above) or MC_TCP_BIND_ADDRESS"
                                + ("; name existing NICs in --device_name" if a.device_name else "")))
            engine = None
        else:
            checks.append(check_rpc_port(engine, host, a.timeout))
    else:
        checks.append(Check("RPC port reachable", SKIP, "the advertised address failed"))
    try:
        if engine is not None and checks[0].status == OK:
            checks.append(check_peer(engine, a.peer, a.timeout))
        elif a.peer:
            checks.append(Check("4 KiB round trip to the peer", SKIP, "needs a reachable metadata service and engine"))
        else:
            checks.append(Check("4 KiB round trip to the peer", SKIP, "no --peer given"))
        checks.append(check_clock(info, rtt, offset))
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        checks.append(memlock_check(soft, hard, a.protocol))
        checks.append(check_transports(engine, a.protocol))
    finally:
        if engine is not None:
            engine.close()
    return checks


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    from mooncake_core.utils.log import setup_logging

    setup_logging(a.log_level)
    checks = run(a)
    print(render_json(checks) if a.json else render_text(checks))
    return exit_code(checks)


if __name__ == "__main__":
    sys.exit(main())
