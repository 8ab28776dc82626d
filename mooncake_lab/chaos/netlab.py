"""Network namespaces for the chaos clients, joined by veth pairs on one bridge, and the
network faults the nemesis injects between them.

Topology: a bridge ``<tag>br`` in the root namespace carries ``10.<a>.<b>.1/24`` (the master,
etcd and metadata server listen there); client ``i`` lives in namespace ``<tag>-c<i>`` with
``10.<a>.<b>.<10+i>`` on ``eth0``, whose peer ``<tag>v<i>`` is enslaved to the bridge.

Faults (each probed at start, see :func:`probe`; a kind the kernel refuses is skipped with
the kernel's reason, never silently):

* ``partition`` -- two clients' packets to each other go to a MAC address nobody has
  (static neighbour entries, both directions): they are dropped silently, connections stall as across a real partition, the master still
  reaches both;
* ``isolate`` -- one client's link down: it loses the master and every peer;
* ``slow-link`` -- ``tc tbf`` rate limit on both ends of one client's link: queueing delay
  and tail drops under load (works without sch_netem);
* ``delay`` / ``loss`` -- ``tc netem`` (50 ms +- 20 ms / 5 % loss) on one client's link.

Everything created carries the run's tag; :func:`cleanup_stale` removes what a killed
earlier run left behind (its tag names a pid that no longer exists).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field

from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.chaos.net")

NET_KINDS = ("partition", "isolate", "slow-link", "delay", "loss")
TAG_RE = re.compile(r"^mcx(\d+)")
BOGUS_MAC = "02:00:00:00:de:ad"  # locally administered, never assigned here


class NetError(RuntimeError):
    pass


def ip(*args: str, ns: str | None = None, check: bool = True, timeout: float = 10.0) -> str:
    """Run ``ip``/``tc`` (``args[0]`` picks which), optionally inside namespace ``ns``."""
    cmd = list(args)
    if ns:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetError(f"{' '.join(cmd)}: {e}") from None
    if check and p.returncode != 0:
        raise NetError(f"{' '.join(cmd)}: {(p.stderr or p.stdout).strip()}")
    return p.stdout


@dataclass
class Capabilities:
    """What this machine lets the harness do (``reasons[kind]`` says why a kind is off)."""

    netns: bool = False
    allowed: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"netns": self.netns, "allowed": self.allowed, "skipped": self.reasons}


def probe() -> Capabilities:
    """Try each building block in a scratch namespace and report what works."""
    caps = Capabilities()
    tag = f"mcx{os.getpid()}p"
    ns, va, vb, br = f"{tag}-ns", f"{tag}a", f"{tag}b", f"{tag}br"
    try:
        ip("ip", "netns", "add", ns)
    except NetError as e:
        why = f"network namespaces unavailable: {e}"
        for k in NET_KINDS:
            caps.reasons[k] = why
        return caps
    try:
        try:
            ip("ip", "link", "add", br, "type", "bridge")
            ip("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
            ip("ip", "link", "set", vb, "netns", ns)
            ip("ip", "link", "set", va, "master", br)
            ip("ip", "link", "set", vb, "up", ns=ns)
            ip("ip", "neigh", "replace", "10.254.254.254", "lladdr", BOGUS_MAC, "nud", "permanent", "dev", vb,
               ns=ns)
        except NetError as e:
            why = f"veth/bridge/neighbour setup refused: {e}"
            for k in NET_KINDS:
                caps.reasons[k] = why
            return caps
        caps.netns = True
        caps.allowed += ["partition", "isolate"]
        for kind, qdisc in (("slow-link", ["tbf", "rate", "8mbit", "burst", "32kb", "latency", "100ms"]),
                            ("delay", ["netem", "delay", "50ms", "20ms"]),
                            ("loss", ["netem", "loss", "5%"])):
            try:
                ip("tc", "qdisc", "add", "dev", va, "root", *qdisc)
                ip("tc", "qdisc", "del", "dev", va, "root")
                caps.allowed.append(kind)
            except NetError as e:
                caps.reasons[kind] = f"tc qdisc {qdisc[0]} refused by this kernel: {e}"
    finally:
        ip("ip", "link", "del", va, check=False)
        ip("ip", "link", "del", br, check=False)
        ip("ip", "netns", "del", ns, check=False)
    return caps


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def cleanup_stale() -> list[str]:
    """Delete namespaces and links of earlier runs whose process is gone."""
    removed = []
    try:
        names = [ln.split()[0] for ln in ip("ip", "netns", "list", check=False).splitlines() if ln.strip()]
        links = re.findall(r"^\d+: ([^:@]+)", ip("ip", "-o", "link", "show", check=False), re.M)
    except NetError:
        return removed
    for name in names:
        m = TAG_RE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            ip("ip", "netns", "del", name, check=False)
            removed.append(name)
    for name in links:
        m = TAG_RE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            ip("ip", "link", "del", name, check=False)
            removed.append(name)
    return removed


def _free_subnet() -> str:
    """A 10.x.y.0/24 no interface on this host uses yet."""
    used = set(re.findall(r"inet 10\.(\d+)\.(\d+)\.", ip("ip", "-4", "addr", check=False)))
    for a in range(213, 240):
        for b in range(1, 255):
            if (str(a), str(b)) not in used:
                return f"10.{a}.{b}"
    raise NetError("no free 10.x.y.0/24 subnet")


class NetLab:
    """The namespaces of one run. Use as a context manager: leaves nothing behind."""

    def __init__(self, n_clients: int, caps: Capabilities):
        if not caps.netns:
            raise NetError("network namespaces unavailable on this machine")
        self.caps = caps
        self.tag = f"mcx{os.getpid()}"
        self.n = n_clients
        self.prefix = _free_subnet()
        self.bridge = f"{self.tag}br"
        self.host_ip = f"{self.prefix}.1"
        self.ns = [f"{self.tag}-c{i}" for i in range(n_clients)]
        self.ips = [f"{self.prefix}.{10 + i}" for i in range(n_clients)]
        self.veth = [f"{self.tag}v{i}" for i in range(n_clients)]
        self._cut: set[tuple[int, int]] = set()
        self._qdisc: set[int] = set()

    def __enter__(self) -> "NetLab":
        try:
            self.create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def create(self) -> None:
        ip("ip", "link", "add", self.bridge, "type", "bridge")
        ip("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        ip("ip", "link", "set", self.bridge, "up")
        for i in range(self.n):
            ns, v, peer = self.ns[i], self.veth[i], f"{self.tag}p{i}"
            ip("ip", "netns", "add", ns)
            ip("ip", "link", "add", v, "type", "veth", "peer", "name", peer)
            ip("ip", "link", "set", peer, "netns", ns)
            ip("ip", "link", "set", peer, "name", "eth0", ns=ns)
            ip("ip", "addr", "add", f"{self.ips[i]}/24", "dev", "eth0", ns=ns)
            ip("ip", "link", "set", "eth0", "up", ns=ns)
            ip("ip", "link", "set", "lo", "up", ns=ns)
            ip("ip", "link", "set", v, "master", self.bridge)
            ip("ip", "link", "set", v, "up")
        log.info("network namespaces ready", extra={"clients": self.n, "subnet": f"{self.prefix}.0/24",
                                                   "bridge": self.bridge})

    def destroy(self) -> None:
        for i in range(self.n):
            ip("ip", "link", "del", self.veth[i], check=False)
            ip("ip", "netns", "del", self.ns[i], check=False)
        ip("ip", "link", "del", self.bridge, check=False)

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns[i]]

    # ------------------------------------------------------------------ faults
    def partition(self, i: int, j: int) -> None:
        """Packets between clients ``i`` and ``j`` go to a MAC address nobody has: they leave
        and are silently lost, as across a real partition (a blackhole route would fail the
        sender at once with EINVAL instead)."""
        for a, b in ((i, j), (j, i)):
            ip("ip", "neigh", "replace", self.ips[b], "lladdr", BOGUS_MAC, "nud", "permanent", "dev", "eth0",
               ns=self.ns[a])
            self._cut.add((a, b))

    def heal_partition(self, i: int, j: int) -> None:
        for a, b in ((i, j), (j, i)):
            if (a, b) in self._cut:
                ip("ip", "neigh", "del", self.ips[b], "dev", "eth0", ns=self.ns[a], check=False)
                self._cut.discard((a, b))

    def isolate(self, i: int) -> None:
        ip("ip", "link", "set", self.veth[i], "down")

    def unisolate(self, i: int) -> None:
        ip("ip", "link", "set", self.veth[i], "up")

    def shape(self, i: int, kind: str) -> None:
        """``slow-link`` / ``delay`` / ``loss`` on both ends of client ``i``'s link."""
        qdisc = {"slow-link": ["tbf", "rate", "8mbit", "burst", "32kb", "latency", "100ms"],
                 "delay": ["netem", "delay", "50ms", "20ms"],
                 "loss": ["netem", "loss", "5%"]}[kind]
        ip("tc", "qdisc", "add", "dev", self.veth[i], "root", *qdisc)
        self._qdisc.add(i)
        ip("tc", "qdisc", "add", "dev", "eth0", "root", *qdisc, ns=self.ns[i])

    def unshape(self, i: int) -> None:
        if i in self._qdisc:
            ip("tc", "qdisc", "del", "dev", self.veth[i], "root", check=False)
            ip("tc", "qdisc", "del", "dev", "eth0", "root", ns=self.ns[i], check=False)
            self._qdisc.discard(i)

    def heal_all(self) -> None:
        for a, b in list(self._cut):
            self.heal_partition(a, b)
        for i in range(self.n):
            ip("ip", "link", "set", self.veth[i], "up", check=False)
            self.unshape(i)
