"""Small networking helpers: host:port parsing, port checks with clear errors, free ports (distinct per process)."""

from __future__ import annotations

import ipaddress
import os
import random
import socket
import subprocess
import threading
import time


def parse_host_port(value: str, default_port: int | None = None, *, what: str = "address") -> tuple[str, int]:
    """Split "host:port" (or "[v6]:port", or "host" with a default port).

    Raises ValueError naming ``what`` and the value when the port is missing or not a number.
    """
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what}: expected 'host:port', got {value!r}")
    value = value.strip()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port_s = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, port_s = value.split(":")
    else:
        host, port_s = value, ""
    if not port_s:
        if default_port is None:
            raise ValueError(f"{what}: missing port in {value!r} (expected 'host:port')")
        return host, default_port
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"{what}: port {port_s!r} in {value!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{what}: port {port} in {value!r} out of range 0..65535")
    return host, port


#: Ports this process has handed out (free_port / listen_port), with the lock that guards it.
#: Why: a port is free when drawn but bound later by whoever asked for it (often a child process),
#: so the kernel may hand the same port to the next ``bind(0)`` -- and vLLM binds with SO_REUSEPORT,
#: so two servers on one port would both look healthy. A port is handed out at most once per process.
_HANDED_OUT: set[int] = set()
_HANDED_OUT_LOCK = threading.Lock()


def _bindable(host: str, port: int) -> bool:
    """Whether a plain socket (no SO_REUSEADDR/SO_REUSEPORT) can bind ``host:port`` now: it cannot
    while anything listens there, a SO_REUSEPORT listener included."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


#: where the original's store client picks its Transfer Engine port when none is given
SEGMENT_PORT_RANGE = (12300, 14300)


def free_port_in_range(lo: int, hi: int, host: str = "0.0.0.0") -> int:
    """A random free TCP port in ``[lo, hi)`` that this process has not handed out before
    (the original's store clients pick their port this way). RuntimeError after 200 tries."""
    import random

    with _HANDED_OUT_LOCK:
        for _ in range(200):
            port = random.randrange(lo, hi)
            if port in _HANDED_OUT:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free port in [{lo}, {hi}) on {host} (200 tries)")


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on ``host`` that this process has not handed out before (for tests and
    'pick one for me' options): two calls never return the same port, even before either is bound.

    Raises RuntimeError when no new port turns up in 200 tries.
    """
    with _HANDED_OUT_LOCK:
        for _ in range(200):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    raise RuntimeError(f"no free port on {host} that this process has not handed out already (200 tries)")


def ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (``bind(0)`` and outgoing connections use it)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def listen_port(host: str = "127.0.0.1", low: int = 15000) -> int:
    """A free port in ``[low, ephemeral range)`` not handed out before, for a server a test starts.

    Why not ``free_port()``: that returns an ephemeral port, which the kernel may give to any
    ``bind(0)`` (an engine's rpc port, ZMQ sockets) in the gap before the server binds it.
    Raises RuntimeError when no such port turns up in 200 tries.
    """
    high = max(low + 1, min(ephemeral_low(), 32768))
    rng = random.Random()
    with _HANDED_OUT_LOCK:
        for _ in range(200):
            port = rng.randrange(low, high)
            if port not in _HANDED_OUT and _bindable(host, port):
                _HANDED_OUT.add(port)
                return port
    raise RuntimeError(f"no free port on {host} in {low}..{high - 1} (200 tries)")


def bind_listener(host: str, port: int, *, what: str, backlog: int = 512) -> socket.socket:
    """Bind+listen, turning EADDRINUSE and friends into an error that names the flag/service."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError as e:
        s.close()
        raise OSError(e.errno, f"{what}: cannot bind {host}:{port}: {e.strerror} "
                               f"(is another process using it? choose another port, or 0 for any)") from None
    s.listen(backlog)
    return s


def wait_for_port(host: str, port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Block until something accepts TCP connections on ``host:port``.

    Used wherever we start a service as a subprocess and must not talk to it before it
    listens. Polling (rather than reading a "ready" line) works for any binary, ours or not.
    When ``proc`` is given and exits first, fail at once with its return code instead of
    waiting out the timeout -- a crashed service is the common case and should be loud.

    Raises TimeoutError naming ``host:port`` after ``timeout`` seconds, RuntimeError when
    ``proc`` exited early.
    """
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited early with code {proc.returncode} "
                               f"before listening on {host}:{port}")
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            with socket.create_connection((host, port), timeout=min(0.5, max(left, 0.05))):
                return
        except OSError:
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


#: names that always mean this host's loopback (whatever /etc/hosts says)
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
#: public addresses used only to ask the kernel for the default route's source address (a UDP
#: ``connect`` sends nothing)
_DEFAULT_ROUTE_PROBES = ("8.8.8.8", "2001:4860:4860::8888")


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address literal, without a port) means this host's
    loopback: 127.0.0.0/8, ::1, ``localhost``, or a name that resolves only to loopback
    (Debian maps the host's own name to 127.0.1.1). An unresolvable name is not loopback."""
    h = host.strip().strip("[]")
    if not h:
        return False
    if h.lower() in LOOPBACK_NAMES:
        return True
    addr = _literal(h)
    if addr is not None:
        return addr.is_loopback
    addrs = {_literal(a) for a in resolve(h)}
    return bool(addrs) and all(a is not None and a.is_loopback for a in addrs)


def resolve(host: str) -> list[str]:
    """Every address ``host`` (a name or a literal, without a port) resolves to, sorted; [] when
    it does not resolve."""
    h = host.strip().strip("[]")
    if not h:
        return []
    try:
        return sorted({str(i[4][0]) for i in socket.getaddrinfo(h, None, proto=socket.IPPROTO_TCP)})
    except (OSError, UnicodeError):
        return []


_IFF_UP, _IFF_RUNNING, _SIOCGIFFLAGS, _SIOCGIFADDR = 0x1, 0x40, 0x8913, 0x8915


def net_interfaces() -> list[str]:
    """This host's network interface names (sysfs), sorted; [] where sysfs is not readable."""
    try:
        return sorted(os.listdir("/sys/class/net"))
    except OSError:
        return []


def interface_addresses() -> dict[str, list[str]]:
    """This host's active network interfaces (up and running, as the kernel's ioctl flags say --
    sysfs' ``flags`` lack IFF_RUNNING) that have an address -> their IPv4 then IPv6 addresses."""
    import fcntl
    import struct
    v6: dict[str, list[str]] = {}
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                hexaddr, *_, name = line.split()
                v6.setdefault(name, []).append(str(ipaddress.IPv6Address(bytes.fromhex(hexaddr))))
    except (OSError, ValueError):
        pass
    out: dict[str, list[str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in net_interfaces():
            req = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack_from("H", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req), 16)[0]
            except OSError:
                continue
            if flags & (_IFF_UP | _IFF_RUNNING) != (_IFF_UP | _IFF_RUNNING):
                continue
            addrs = list(v6.get(name, []))
            try:
                addrs.insert(0, socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)[20:24]))
            except OSError:  # no IPv4 address
                pass
            if addrs:
                out[name] = addrs
    return out


def endpoint_host(spec: str | None) -> str | None:
    """The host of a master or metadata address -- ``host:port``, ``etcd://h:p[;h2:p]``,
    ``redis://[user:pw@]h:p[/db]``, ``http(s)://h:p/path`` -- or None for ``P2PHANDSHAKE`` and
    empty values. The first endpoint of a list counts (they share a network)."""
    if not isinstance(spec, str):
        return None
    s = spec.strip()
    if not s or s.upper() == "P2PHANDSHAKE":
        return None
    if "://" in s:
        s = s.split("://", 1)[1]
    s = s.split(";", 1)[0].split(",", 1)[0].split("/", 1)[0]
    s = s.rsplit("@", 1)[-1]
    if not s:
        return None
    try:
        host, _ = parse_host_port(s, 0)
    except ValueError:
        return None
    return host or None


def route_source(peer_host: str) -> str | None:
    """The local address the kernel picks to reach ``peer_host`` (its route's source address):
    a UDP socket ``connect`` -- which sends nothing -- then ``getsockname``. None when the host
    does not resolve or no route leads there."""
    h = peer_host.strip().strip("[]")
    try:
        infos = socket.getaddrinfo(h, 9, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    for family, _, _, _, addr in infos:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                s.connect(addr)
                return str(s.getsockname()[0])
            except OSError:
                continue
    return None


def default_route_source() -> str | None:
    """Source address of the default route (IPv4, else IPv6), or None on a host without one."""
    for probe in _DEFAULT_ROUTE_PROBES:
        src = route_source(probe)
        if src is not None:
            return src
    return None


def local_ip(toward: str | None = None) -> str:
    """The address this host should advertise to peers, without sending traffic.

    The source address of the route toward ``toward`` (the master's or metadata service's
    host) when given and routable, else of the default route, else the address the host's name
    resolves to when that is not loopback, else 127.0.0.1. Why not ``gethostbyname(gethostname())``
    first: Debian maps the host name to 127.0.1.1, and a container's name may resolve to a
    bridge address its peers cannot reach; the route is what the kernel will use for real.
    """
    if toward:
        src = route_source(toward)
        if src is not None and not (is_loopback(src) and not is_loopback(toward)):
            return src
    src = default_route_source()
    if src is not None:
        return src
    try:
        named = socket.gethostbyname(socket.gethostname())
    except OSError:
        named = ""
    return named if named and not is_loopback(named) else "127.0.0.1"


def loopback_warning(advertised: str, peer: str | None, *, what: str) -> str | None:
    """The warning to log when ``advertised`` (this process's address as peers will be told,
    ``host`` or ``host:port``) is loopback while ``peer`` (the master/metadata address it is
    published to) is not: every remote peer would then connect to itself and time out much
    later. None when there is nothing to warn about."""
    peer_host = endpoint_host(peer) if peer else None
    if peer_host is None:
        return None
    try:
        host, _ = parse_host_port(advertised, 0)
    except ValueError:
        return None
    if not is_loopback(host) or is_loopback(peer_host):
        return None
    better = route_source(peer_host)
    hint = f" (this host reaches {peer_host} from {better})" if better and not is_loopback(better) else ""
    return (f"{what}: advertising loopback address {advertised!r} to {peer_host}, which is not on this host: "
            f"remote peers cannot reach it. Set MOONCAKE_LOCAL_HOSTNAME (or local_hostname) to an address "
            f"they can reach{hint}, or leave it unset to pick the route's address.")
