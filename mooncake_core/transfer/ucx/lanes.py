"""Pure helpers of the UCX transport: device names, lanes, the "no RDMA here" message.

Kept apart from the I/O so they are unit-tested with plain strings (tests/unit/test_ucx_lanes.py):
what UCX printed is parsed here, never in the transport.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

__all__ = ["ORIGINAL_TO_UCX", "RDMA_TLS", "TCP_TUNING", "Resource", "default_tcp_interface", "ep_lanes", "is_rdma",
           "mc_config", "net_devices", "no_rdma_warning", "resources", "tcp_device_count", "tuning"]

#: UCX transports that run on an RDMA NIC (InfiniBand, RoCE, EFA): one-sided in hardware
RDMA_TLS = frozenset({"rc", "rc_v", "rc_verbs", "rc_x", "rc_mlx5", "dc", "dc_x", "dc_mlx5", "ud", "ud_v",
                      "ud_verbs", "ud_x", "ud_mlx5", "srd", "efa", "gga", "gga_mlx5"})

_RESOURCE = re.compile(r"resource\s+\d+\s*:.*--\s+([\w.-]+)/(\S+)")
_LANE = re.compile(r"lane\[(\d+)\]:\s+\d+:([\w.-]+)/([^\s]+?)(?:\.\d+)?\s+md\[\d+\][^>]*->\s*(.*)$")
_ROLE = re.compile(r"^(am|wireup|keepalive|cm|rma(_bw)?#\d+|amo#\d+|tag_\w+)$")


@dataclass(frozen=True)
class Resource:
    tl: str      # UCX transport: tcp, posix, cma, rc_mlx5, ...
    dev: str     # its device: eth0, memory, mlx5_0:1, ...

    @property
    def lane(self) -> str:
        return f"{self.tl}/{self.dev}"


def resources(context_info: str) -> list[Resource]:
    """The transports/devices a UCP context found (``ucp_context_print_info`` text)."""
    return [Resource(m.group(1), m.group(2)) for m in _RESOURCE.finditer(context_info)]


def is_rdma(tl: str) -> bool:
    return tl in RDMA_TLS


#: UCX transports that read and write GPU memory
CUDA_TLS = frozenset({"cuda_copy", "cuda_ipc", "gdr_copy"})


def has_cuda(found: Sequence[Resource]) -> bool:
    """True when the context found a lane that moves GPU memory (cuda_copy at least)."""
    return any(r.tl in CUDA_TLS for r in found)


@dataclass(frozen=True)
class Lane:
    index: int
    tl: str
    dev: str
    roles: tuple[str, ...]  # am, rma_bw#0, wireup, ...

    @property
    def name(self) -> str:
        return f"{self.tl}/{self.dev}"


def ep_lanes(ep_info: str) -> list[Lane]:
    """The lanes of one endpoint (``ucp_ep_print_info`` text)."""
    out = []
    for line in ep_info.splitlines():
        m = _LANE.search(line)
        if m:
            roles = tuple(t for t in m.group(4).split() if _ROLE.match(t))
            out.append(Lane(int(m.group(1)), m.group(2), m.group(3), roles))
    return out


def rma_lanes(lanes: Sequence[Lane]) -> list[str]:
    """Names of the lanes that carry one-sided data (``rma_bw``), else every lane (sorted, unique)."""
    rma = sorted({ln.name for ln in lanes if any(r.startswith("rma") for r in ln.roles)})
    return rma or sorted({ln.name for ln in lanes})


#: the original's RDMA variables that have a UCX equivalent (UCX name without ``UCX_``); the
#: others size queues and work requests, which UCX sizes itself (docs/transfer-engine.md lists
#: them), and MC_IB_PORT is the port given to a device named without one (``net_devices``)
ORIGINAL_TO_UCX: dict[str, str] = {"MC_GID_INDEX": "IB_GID_INDEX", "MC_MTU": "IB_PATH_MTU", "MC_IB_SL": "IB_SL",
                             "MC_IB_TC": "IB_TRAFFIC_CLASS", "MC_RETRY_CNT": "RC_RETRY_COUNT"}


#: our defaults for UCX's tcp lane, each unless the user set its ``UCX_*``; RDMA lanes do not
#: read these. Why the segments: the tcp lane moves an emulated GET's reply (a tcp lane has no
#: one-sided read) in ``TX_SEG_SIZE`` pieces, 8 KiB by default, one target progress call each;
#: with 1 MiB pieces a 64 MiB read over loopback went from 1.1 to 3.9 GB/s
#: (bench/transfer/bench_ucx.py). ``TCP_PUT_ENABLE``: see ``tuning``.
TCP_TUNING: dict[str, str] = {"TCP_TX_SEG_SIZE": "1M", "TCP_RX_SEG_SIZE": "1M"}


def tuning(env: Mapping[str, str], tcp_devices: int = 1) -> dict[str, str]:
    """``TCP_TUNING`` (plus ``TCP_PUT_ENABLE=n`` when a context sees ``tcp_devices`` > 1) less
    what the user set as ``UCX_*`` in ``env``.

    Why PUT off with several tcp devices: UCX 1.22 then gives an endpoint two tcp lanes (one
    for active messages and RMA, one for wire-up and a second RMA lane), and its tcp PUT zcopy
    crashes the *target* (SIGSEGV in ``uct_tcp_ep_progress_put_rx``) when puts and emulated
    gets run at once -- four threads writing and reading 4 MiB each did it within a few rounds
    (tests/transfer/test_ucx.py::test_large_transfers_from_many_threads_byte_exact) with
    ``eth0,lo`` or two veths, never with one device (60 rounds each on ``lo`` and ``eth0``).
    Without PUT, UCX emulates it as it does GET, through 1 MiB segments: a 64 MiB write over
    loopback 0.94x -> 0.82x our tcp. Hence one tcp device per context where we can
    (``default_tcp_interface``), PUT kept there.
    """
    want = dict(TCP_TUNING)
    if tcp_devices > 1:
        want["TCP_PUT_ENABLE"] = "n"
    return {k: v for k, v in want.items() if not env.get(f"UCX_{k}", "").strip()}


def tcp_device_count(net_devices: str, tcp_interfaces: Iterable[str]) -> int:
    """How many of ``tcp_interfaces`` (the host's active interfaces with an address) a context
    restricted to ``net_devices`` (``UCX_NET_DEVICES`` text; "" or "all": every device) uses."""
    ifaces = list(tcp_interfaces)
    text = net_devices.strip()
    if not text or text == "all":
        return len(ifaces)
    named = {n.strip().split(":", 1)[0] for n in text.split(",") if n.strip()}
    return sum(1 for i in ifaces if i in named)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text.split("%", 1)[0])  # "fe80::1%eth0": the scope is not part of it


def default_tcp_interface(interfaces: Mapping[str, Sequence[str]], host_addresses: Sequence[str],
                          default_route_source: str | None) -> str | None:
    """The one tcp interface a context gets when ``device_name`` is empty on a host without RDMA
    devices, so that UCX keeps tcp PUT (see ``tuning``); None: leave UCX every device.

    ``interfaces``: active interface -> its addresses. Loopback-only interfaces are left out
    (an endpoint from ``lo`` cannot reach a peer's non-loopback address, so an engine named
    127.0.0.1 could not talk to one named by the host's address). Of the rest: the only one;
    else the one holding ``host_addresses`` (the engine's own host name, resolved); else the one
    holding ``default_route_source`` (the default route's source address).
    """
    real = {name: {_ip(a) for a in addrs} for name, addrs in interfaces.items()
            if addrs and not all(_ip(a).is_loopback for a in addrs)}
    if len(real) == 1:
        return next(iter(real))
    for wanted in ({_ip(a) for a in host_addresses}, {_ip(default_route_source)} if default_route_source else set()):
        holding = [name for name, addrs in real.items() if addrs & wanted]
        if len(holding) == 1:
            return holding[0]
    return None


def mc_config(env: Mapping[str, str]) -> dict[str, str]:
    """UCX settings from the original's ``MC_*`` variables in ``env``; a ``UCX_*`` the user set
    for the same knob wins (UCX reads it itself)."""
    out: dict[str, str] = {}
    for mc, ucx in ORIGINAL_TO_UCX.items():
        v = env.get(mc, "").strip()
        if v and not env.get(f"UCX_{ucx}", "").strip():
            out[ucx] = v
    return out


def net_devices(device_name: str, rdma_ports: Mapping[str, Sequence[int]], netdevs: Iterable[str],
                default_port: int | None = None) -> str:
    """``device_name`` as Mooncake takes it ("mlx5_0,mlx5_1") -> ``UCX_NET_DEVICES`` ("mlx5_0:1,mlx5_1:1").

    An RDMA device without a port gets each of its ports (or ``default_port``: MC_IB_PORT, as
    the original); "dev:port" is checked; a network
    interface (eth0) passes as is. An unknown name is a ValueError naming it and what exists.
    Empty: "" (UCX picks every device).
    """
    names = [n.strip() for n in device_name.replace(";", ",").split(",") if n.strip()]
    nets = set(netdevs)
    out: list[str] = []
    unknown: list[str] = []
    for n in names:
        dev, _, port = n.partition(":")
        if dev in rdma_ports:
            ports = [int(p) for p in rdma_ports[dev]] or [1]
            if port:
                if not port.isdigit() or int(port) not in ports:
                    unknown.append(n)
                    continue
                out.append(n)
            elif default_port is not None:
                if default_port not in ports:
                    unknown.append(f"{dev}:{default_port} (MC_IB_PORT)")
                    continue
                out.append(f"{dev}:{default_port}")
            else:
                out += [f"{dev}:{p}" for p in ports]
        elif not port and dev in nets:
            out.append(dev)
        else:
            unknown.append(n)
    if unknown:
        raise ValueError(f"device_name {device_name!r}: unknown device(s) {', '.join(unknown)} (RDMA devices here: "
                         f"{', '.join(sorted(rdma_ports)) or 'none'}; network interfaces: "
                         f"{', '.join(sorted(nets)) or 'none'}); name devices as UCX_NET_DEVICES does "
                         f"(mlx5_0, mlx5_0:1, eth0)"
                         + ("" if rdma_ports else "; on a host without RDMA use protocol 'tcp' or set MC_FORCE_TCP=1"))
    return ",".join(dict.fromkeys(out))


#: below this locked-memory limit an RDMA engine cannot register a useful KV cache
MEMLOCK_MIN = 1 << 30


def memlock_warning(soft_limit: int, hard_limit: int, found: Sequence[Resource]) -> str | None:
    """The start-up message when RDMA lanes exist but ``ulimit -l`` would make registering memory
    fail (RDMA pins what it registers); None when unlimited (-1) or large enough, or no RDMA."""
    if not any(is_rdma(r.tl) for r in found) or soft_limit < 0 or soft_limit >= MEMLOCK_MIN:
        return None
    raise_to = "unlimited" if hard_limit < 0 else f"{hard_limit} bytes (the hard limit)"
    return (f"locked-memory limit (ulimit -l) is {soft_limit >> 10} KiB: RDMA pins every registered buffer, so "
            f"registering KV memory will fail. Raise it: ulimit -l unlimited (hard limit here: {raise_to}), "
            "LimitMEMLOCK=infinity in a systemd unit, or docker run --ulimit memlock=-1")


def no_rdma_warning(found: Sequence[Resource], library_source: str, library_path: str,
                    rdma_devices: Sequence[str]) -> str | None:
    """The one loud message when ``protocol="rdma"`` has no RDMA lane; None when one exists."""
    if any(is_rdma(r.tl) for r in found):
        return None
    lanes = ", ".join(sorted({r.lane for r in found})) or "none"
    if not rdma_devices:
        why = "this host has no RDMA device (/sys/class/infiniband is empty)"
        fix = ("run on a host with an RDMA NIC (InfiniBand, RoCE or EFA) and its driver (MOFED/DOCA, rdma-core)")
    elif library_source == "wheel":
        why = (f"RDMA devices {', '.join(rdma_devices)} exist, but the UCX loaded ({library_path}) is the libucx "
               "wheel, built without verbs")
        fix = ("install a verbs-capable UCX -- MOFED/DOCA or the distribution's ucx + rdma-core (system), HPC-X, "
               "or the NIXL wheel (pip install nixl-cu12) -- or point MC_UCX_LIBRARY at one")
    else:
        why = (f"RDMA devices {', '.join(rdma_devices)} exist, but the UCX loaded ({library_path}) found no lane on "
               "them (libibverbs / the provider missing, UCX_TLS or device_name excluding them, or memlock too low)")
        fix = ("check `ucx_info -d`, `ibv_devinfo`, `ulimit -l` (unlimited), UCX_TLS, and device_name")
    return (f"protocol 'rdma' asked, but UCX has no RDMA lane: {why}; lanes found: {lanes}. Transfers run "
            f"one-sided through UCX over those lanes, not at RDMA speed (with one NIC, protocol 'tcp' is faster; "
            f"several NICs in device_name are used at once). To get RDMA: {fix}.")
