"""The proxy's list of prefill/decode instances (addresses, bootstrap ports, in-flight counts).

The scheduler's ``ClusterState`` knows instances by id for decisions; this registry maps those
ids to network addresses. Pure bookkeeping, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlparse

from .handoff import InstanceAddr
from .health_state import InstanceHealth

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")


def normalize_url(url: str) -> str:
    """'host:port' or 'http://host:port/' → 'http://host:port'; ValueError names the bad value."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"instance url: expected 'http://host:port', got {url!r}")
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    p = urlparse(url)
    if p.scheme not in ("http", "https") or not p.hostname:
        raise ValueError(f"instance url {url!r}: expected 'http://host:port'")
    try:
        port = p.port
    except ValueError:
        raise ValueError(f"instance url {url!r}: port is not a number in 0..65535") from None
    if port is None:
        raise ValueError(f"instance url {url!r}: missing port")
    return f"{p.scheme}://{p.netloc}"


@dataclass
class Instance:
    instance_id: str
    role: Role
    url: str
    host: str
    port: int
    bootstrap_port: int | None = None
    in_flight: int = 0
    #: requests using this instance in either stage, until each ends (the drain waits for 0)
    active: int = 0
    #: ``POST /admin/instances/<id>/drain``: no new requests; since when (monotonic), 0 = not draining
    draining_since: float = 0.0
    # Starts UNKNOWN: only an answered /health makes an instance schedulable (health_state.py).
    health: InstanceHealth = field(default_factory=InstanceHealth)

    @property
    def healthy(self) -> bool:
        return self.health.up

    @property
    def draining(self) -> bool:
        return self.draining_since > 0

    def start_drain(self, now: float) -> None:
        if not self.draining:
            self.draining_since = max(now, 1e-9)

    def drain_status(self, now: float) -> dict:
        """What the drain routes answer: safe to stop once draining and no request uses it."""
        return {"id": self.instance_id, "draining": self.draining, "active": self.active,
                "in_flight": self.in_flight, "safe_to_stop": self.draining and self.active == 0,
                "draining_for_s": round(now - self.draining_since, 3) if self.draining else 0.0}

    @property
    def last_error(self) -> str:
        return self.health.last_error

    @property
    def addr(self) -> InstanceAddr:
        return InstanceAddr(self.url, self.host, self.port, self.bootstrap_port)

    def to_json(self) -> dict:
        return {"id": self.instance_id, "role": self.role, "url": self.url,
                "bootstrap_port": self.bootstrap_port, "healthy": self.healthy,
                "state": self.health.state.value, "in_flight": self.in_flight,
                "draining": self.draining, "last_error": self.last_error}


class Registry:
    def __init__(self) -> None:
        self._by_id: dict[str, Instance] = {}

    @staticmethod
    def make_id(role: str, url: str) -> str:
        return f"{role}@{normalize_url(url)}"

    def add(self, role: str, url: str, bootstrap_port: int | None = None) -> Instance:
        """Register an instance; ValueError on a bad role/url or a duplicate."""
        if role not in ROLES:
            raise ValueError(f"role {role!r}: expected one of {list(ROLES)}")
        if bootstrap_port is not None and not (0 < int(bootstrap_port) < 65536):
            raise ValueError(f"bootstrap_port {bootstrap_port!r}: expected 1..65535")
        url = normalize_url(url)
        iid = self.make_id(role, url)
        if iid in self._by_id:
            raise ValueError(f"{role} instance {url} is already registered")
        p = urlparse(url)
        inst = Instance(iid, role, url, p.hostname or "", int(p.port or 0),  # type: ignore[arg-type]
                        None if bootstrap_port is None else int(bootstrap_port))
        self._by_id[iid] = inst
        return inst

    def remove(self, instance_id: str) -> Instance:
        try:
            return self._by_id.pop(instance_id)
        except KeyError:
            raise KeyError(f"no instance {instance_id!r}; known: {sorted(self._by_id)}") from None

    def get(self, instance_id: str) -> Instance | None:
        return self._by_id.get(instance_id)

    def all(self, role: str | None = None) -> list[Instance]:
        return [i for i in self._by_id.values() if role is None or i.role == role]

    def healthy(self, role: str) -> list[Instance]:
        """Instances of ``role`` that may take new requests (up and not draining)."""
        return [i for i in self._by_id.values() if i.role == role and i.healthy and not i.draining]
