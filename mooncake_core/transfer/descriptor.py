"""Segment descriptors: what a process publishes about its registered memory.

Stored under ``mooncake/ram/<segment>`` in the metadata service (or served over the rpc
port with P2PHANDSHAKE). The ``version`` field lets two builds refuse each other with a
message naming both versions instead of misreading fields (Mooncake issue #2177).
``boot_id``/``pidns``/``pid`` let a peer decide whether cross-memory attach is possible.
``transports`` holds one section per transport that needs to tell peers something (RDMA
memory keys, CUDA IPC handles...), each with its own ``version`` so a transport can change
its section without a new descriptor version; builds that do not know a section ignore it
(the previous release reads descriptors with it unchanged).
"""

from __future__ import annotations

import bisect
import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Any

from mooncake_core.transfer.memory import Region

DESCRIPTOR_VERSION = 1
RAM_PREFIX = "mooncake/ram/"
RPC_META_PREFIX = "mooncake/rpc_meta/"


def ram_key(segment: str) -> str:
    return RAM_PREFIX + segment


def rpc_meta_key(segment: str) -> str:
    return RPC_META_PREFIX + segment


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def process_start_time(pid: int | str = "self") -> int:
    """Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat), 0 if
    unknown. Together with the pid it names one process even after its pid is reused."""
    raw = _read(f"/proc/{pid}/stat")
    try:
        return int(raw.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return 0


def host_identity() -> tuple[str, str]:
    """(boot_id, pid namespace id): equal on both ends <=> same kernel and pid space."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    return boot, pidns


def _sections(raw: object) -> dict[str, dict[str, Any]]:
    """The ``transports`` field, keeping only well-formed sections (name -> JSON object)."""
    if not isinstance(raw, dict):
        return {}
    return {str(k): v for k, v in raw.items() if isinstance(v, dict)}


class DescriptorError(ValueError):
    """A descriptor that cannot be used (bad JSON shape or version skew)."""


_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")


def check_host(host: str, segment: object) -> str:
    """``host`` if it is an IP literal or a DNS name (RFC 1123 labels, at most 253 bytes); a
    descriptor comes from the peer (or anyone who can write the metadata service), so an
    unusable host must be refused here, not blow up later inside getaddrinfo."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if 0 < len(host) <= 253 and all(_LABEL.match(x) for x in host.rstrip(".").split(".")):
        return host
    raise DescriptorError(f"segment descriptor for {segment!r}: host {host!r:.80} is neither an IP address "
                          "nor a host name")


def _port(v: object, segment: object) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise DescriptorError(f"segment descriptor for {segment!r}: port {v!r:.40} is not a number")
    p = int(v)
    if not 0 < p < 65536:
        raise DescriptorError(f"segment descriptor for {segment!r}: port {p} is outside 1..65535")
    return p


@dataclass
class SegmentDescriptor:
    name: str
    host: str
    port: int
    protocol: str = "tcp"
    buffers: list[Region] = field(default_factory=list)
    boot_id: str = ""
    pidns: str = ""
    pid: int = 0
    start_time: int = 0  # see process_start_time(): guards same-host access against pid reuse
    version: int = DESCRIPTOR_VERSION
    generation: int = 0  # bumped on every (un)registration, so peers can tell staleness
    #: per-transport sections: name -> {"version": N, ...} (see Transport.descriptor_section)
    transports: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict:
        d = {
            "version": self.version, "name": self.name, "protocol": self.protocol,
            "host": self.host, "port": self.port, "tcp_data_port": self.port,
            "buffers": [b.to_json() for b in self.buffers],
            "boot_id": self.boot_id, "pidns": self.pidns, "pid": self.pid, "start_time": self.start_time,
            "generation": self.generation,
        }
        if self.transports:
            d["transports"] = self.transports
        return d

    @classmethod
    def from_json(cls, d: object, *, expect_name: str | None = None) -> "SegmentDescriptor":
        if not isinstance(d, dict):
            raise DescriptorError(f"segment descriptor for {expect_name!r} is not a JSON object: {d!r:.200}")
        ver = d.get("version")
        if ver != DESCRIPTOR_VERSION:
            raise DescriptorError(
                f"segment {expect_name or d.get('name')!r}: descriptor version {ver!r} is not supported "
                f"by this engine (speaks version {DESCRIPTOR_VERSION}); upgrade both peers to the same release")
        try:
            return cls(
                name=str(d.get("name", expect_name or "")), host=check_host(str(d["host"]), expect_name),
                port=_port(d["port"], expect_name),
                protocol=str(d.get("protocol", "tcp")),
                buffers=[Region.from_json(b) for b in d.get("buffers", [])],
                boot_id=str(d.get("boot_id", "")), pidns=str(d.get("pidns", "")),
                pid=int(d.get("pid", 0)), start_time=int(d.get("start_time", 0)), version=ver,
                generation=int(d.get("generation", 0)), transports=_sections(d.get("transports")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise DescriptorError(f"segment descriptor for {expect_name!r} is malformed: {e}") from None

    def find_region(self, addr: int, length: int) -> Region | None:
        """The published buffer wholly containing [addr, addr+length) (bisect over sorted starts)."""
        idx = self.__dict__.get("_index")
        if idx is None or idx[2] != len(self.buffers):
            regs = sorted(self.buffers, key=lambda r: r.addr)
            idx = self.__dict__["_index"] = ([r.addr for r in regs], regs, len(self.buffers))
        i = bisect.bisect_right(idx[0], addr) - 1
        if i < 0 or length < 0:
            return None
        r = idx[1][i]
        return r if addr + length <= r.addr + r.length else None

    def section(self, name: str, version: int | None = None) -> dict[str, Any] | None:
        """The section transport ``name`` published, or None when there is none (or, with
        ``version``, when it has another version: that transport then cannot reach the peer)."""
        s = self.transports.get(name)
        if s is None or (version is not None and s.get("version") != version):
            return None
        return s

    def same_host_as(self, boot_id: str, pidns: str) -> bool:
        return bool(self.boot_id) and self.boot_id == boot_id and self.pidns == pidns and self.pid > 0
