"""Two "hosts" on one machine: network + pid + UTS namespaces joined by one plain link (the
hosts' own addresses: control channel, handshake) and two data NICs, each a veth pair shaped
with ``tc tbf`` to the same rate on both ends (netem is not in every kernel; tbf is).

Nothing same-host applies between them (another pid namespace: no cross-memory attach; another
network namespace: no loopback), so a transfer between them crosses the data NICs the way it
would cross two hosts' RDMA NICs. A NIC fails with ``ip link set DEV down`` (both ends).

Used by tests/transfer/test_ucx_nics.py and bench/transfer/bench_ucx.py --nics. Needs root and
iproute2; :func:`available` says why not otherwise. Everything is named after the creating
process (``mcn<pid>``) and removed on exit.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

__all__ = ["TwoHosts", "available"]


def _run(*cmd: str, ns: str | None = None, check: bool = True) -> str:
    argv = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {(p.stderr or p.stdout).strip()}")
    return p.stdout


def available() -> str | None:
    """None when namespaces, veth and tbf work here; else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (iproute2 / util-linux)"
    tag = f"mcn{os.getpid()}probe"
    try:
        _run("ip", "link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b")
        _run("tc", "qdisc", "add", "dev", f"{tag}a", "root", "tbf", "rate", "100mbit", "burst", "64kb",
             "latency", "50ms")
    except RuntimeError as e:
        return f"veth / tc tbf refused: {e}"
    finally:
        _run("ip", "link", "del", f"{tag}a", check=False)
    return None


def _free_prefix() -> str:
    used = set(re.findall(r"inet 10\.(\d+)\.", _run("ip", "-4", "addr", check=False)))
    for a in range(150, 200):
        if str(a) not in used:
            return f"10.{a}"
    raise RuntimeError("no free 10.x.0.0/16 here")


class TwoHosts:
    """Hosts ``a`` and ``b``: ``eth0`` (10.P.0.1/.2, unshaped) and data NICs ``d0``, ``d1``
    (10.P.1.x, 10.P.2.x), each shaped to ``rate`` both ways. A context manager."""

    def __init__(self, rate: str = "400mbit", nics: int = 2) -> None:
        self.tag = f"mcn{os.getpid()}"
        self.rate = rate
        self.nics = [f"d{i}" for i in range(nics)]
        self.prefix = _free_prefix()
        self.ns = {"a": f"{self.tag}a", "b": f"{self.tag}b"}
        self.ip = {"a": f"{self.prefix}.0.1", "b": f"{self.prefix}.0.2"}

    def __enter__(self) -> "TwoHosts":
        try:
            self._create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def _pair(self, name: str, net: int, shaped: bool) -> None:
        a, b = f"{self.tag}{name}a", f"{self.tag}{name}b"
        _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        for side, dev, host in (("a", a, 1), ("b", b, 2)):
            ns = self.ns[side]
            _run("ip", "link", "set", dev, "netns", ns)
            _run("ip", "link", "set", dev, "name", name, ns=ns)
            _run("ip", "addr", "add", f"{self.prefix}.{net}.{host}/24", "dev", name, ns=ns)
            _run("ip", "link", "set", name, "up", ns=ns)
            if shaped:
                _run("tc", "qdisc", "add", "dev", name, "root", "tbf", "rate", self.rate, "burst", "256kb",
                     "latency", "100ms", ns=ns)

    def _create(self) -> None:
        for ns in self.ns.values():
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "set", "lo", "up", ns=ns)
        self._pair("eth0", 0, shaped=False)
        for i, nic in enumerate(self.nics):
            self._pair(nic, i + 1, shaped=True)

    def destroy(self) -> None:
        for ns in self.ns.values():
            _run("ip", "netns", "del", ns, check=False)

    def argv(self, host: str, cmd: list[str]) -> list[str]:
        """``cmd`` run on ``host``: its network namespace plus fresh pid and UTS namespaces."""
        return ["ip", "netns", "exec", self.ns[host], "unshare", "--pid", "--uts", "--fork", "--kill-child", *cmd]

    def link(self, nic: str, up: bool) -> None:
        """Take a data NIC down (or up) on both hosts."""
        for ns in self.ns.values():
            _run("ip", "link", "set", nic, "up" if up else "down", ns=ns)
