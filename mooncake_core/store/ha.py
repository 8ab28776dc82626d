"""Master high availability through etcd: leader election and leader discovery.

Design: every master started with ``--enable_ha`` campaigns for the key
``leader_key(cluster_id)`` (``mooncake-store/<--cluster_id>/master/leader``, so clusters
sharing one etcd never see each other's leader) with an etcd *transaction put-if-absent*
bound to a short lease (``LEADER_TTL_S``). The winner keeps the lease alive (keepalive
every TTL/3) and serves RPC; the others poll the key and campaign again once it disappears
(leader crashed -> its lease expires -> key gone). A leader that cannot refresh its lease
(etcd unreachable, paused process) steps down by itself before its lease can have expired
(checked against a local monotonic deadline), so two masters never both believe they lead
for longer than one keepalive period.

Clients (``MasterClient("etcd://h:p;h2:p")``) read the key of their cluster (env
``MC_STORE_CLUSTER_ID``, default ``mooncake_cluster``, as upstream's clients) to find the
leader's ``host:port`` and re-read it when an RPC fails.

A new leader starts with an empty state and answers ``need_remount`` to heartbeats of
clients it does not know; they re-mount their segments and re-report their complete
objects, so the state recovers within one heartbeat period (see docs/store-master.md).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from mooncake_core.utils.extras import require
from mooncake_core.utils.log import get_logger
from mooncake_core.utils.net import parse_host_port

log = get_logger("mooncake.store.ha")

DEFAULT_CLUSTER_ID = "mooncake_cluster"
_CLUSTER_ID_CHARS = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_-.")


def check_cluster_id(value: str) -> str:
    """``--cluster_id`` as upstream accepts it (a trailing '/' dropped): 1-128 characters of
    ``[0-9A-Za-z_.-]`` -- it becomes part of etcd keys and paths, so nothing that could
    reach into another cluster's keys (no '/', no '..' component)."""
    v = value[:-1] if value.endswith("/") else value
    if not v or len(v) > 128 or not set(v) <= _CLUSTER_ID_CHARS or v in (".", ".."):
        raise ValueError(f"cluster_id {value!r}: expected 1-128 characters of [0-9A-Za-z_.-]")
    return v


def leader_key(cluster_id: str = DEFAULT_CLUSTER_ID) -> str:
    """The etcd key the leader of ``cluster_id`` holds (masters of other clusters sharing the
    etcd never see it)."""
    return f"mooncake-store/{cluster_id}/master/leader"


LEADER_KEY = leader_key()
LEADER_TTL_S = 3  # etcd lease TTL of the leader key (seconds): failover takes about this long
ETCD_TIMEOUT_S = 2.0


def parse_etcd_endpoints(spec: str) -> list[tuple[str, int]]:
    """``"h:p;h2:p"`` (optionally prefixed with ``etcd://``; ``,`` also accepted) -> list."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("etcd endpoints: expected 'host:port[;host2:port2]', got an empty value")
    s = spec.strip()
    if s.startswith("etcd://"):
        s = s[len("etcd://"):]
    out = []
    for part in s.replace(",", ";").split(";"):
        part = part.strip().rstrip("/")
        if part.startswith("http://"):
            part = part[len("http://"):]
        if part:
            out.append(parse_host_port(part, 2379, what="etcd endpoint"))
    if not out:
        raise ValueError(f"etcd endpoints: no endpoint in {spec!r}")
    return out


def _client(host: str, port: int, timeout: float):
    # imported lazily: only HA setups need it (the `etcd` extra)
    etcd3gw = require("etcd3gw", "etcd", "master high availability through etcd (etcd://)")
    return etcd3gw.client(host=host, port=port, timeout=timeout)


def resolve_leader(endpoints: list[tuple[str, int]], timeout: float = ETCD_TIMEOUT_S,
                   cluster_id: str | None = None) -> str | None:
    """The current leader's RPC address from etcd, or None if no leader is registered.
    ``cluster_id``: whose leader (default: env ``MC_STORE_CLUSTER_ID``, as upstream's clients).

    Tries each endpoint in turn; raises ConnectionError naming all of them if none answers.
    """
    if cluster_id is None:
        from mooncake_core import envs

        cluster_id = check_cluster_id(envs.MC_STORE_CLUSTER_ID)
    key = leader_key(cluster_id)
    errors = []
    for host, port in endpoints:
        try:
            vals = _client(host, port, timeout).get(key)
        except Exception as e:  # noqa: BLE001 - any transport error: try the next endpoint
            errors.append(f"{host}:{port}: {e}")
            continue
        if not vals:
            return None
        v = vals[0]
        return v.decode() if isinstance(v, bytes) else str(v)
    raise ConnectionError("cannot reach any etcd endpoint: " + "; ".join(errors))


class LeaderElection:
    """Campaign for leadership in a background thread.

    ``on_elected()`` is called (from the election thread) when this master becomes leader,
    ``on_lost()`` when it loses leadership (lease could not be refreshed in time). The
    master process exits on loss (as the original does): a fresh start re-campaigns with
    an empty state, which is what the recovery protocol expects.
    """

    def __init__(self, endpoints: list[tuple[str, int]], my_address: str, *,
                 on_elected: Callable[[], None], on_lost: Callable[[], None],
                 ttl_s: int = LEADER_TTL_S, poll_s: float = 0.5, cluster_id: str = DEFAULT_CLUSTER_ID) -> None:
        self.endpoints = endpoints
        self.key = leader_key(cluster_id)
        self.my_address = my_address
        self.on_elected = on_elected
        self.on_lost = on_lost
        self.ttl_s = ttl_s
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lease: Any = None   # etcd3gw lease and client once connected
        self._client: Any = None
        self.is_leader = False
        self.valid_until = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mc-leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self.is_leader and self._lease is not None:
            try:  # hand leadership over at once instead of waiting for the lease to expire
                self._lease.revoke()
            except Exception as e:  # noqa: BLE001 - it then expires after ttl_s
                log.warning("could not revoke the leader lease on stop", extra={"error": str(e)})

    # -------------------------------------------------------------- internals
    def _connect(self):
        errors = []
        for host, port in self.endpoints:
            try:
                c = _client(host, port, ETCD_TIMEOUT_S)
                c.status()
                return c
            except Exception as e:  # noqa: BLE001
                errors.append(f"{host}:{port}: {e}")
        raise ConnectionError("cannot reach any etcd endpoint: " + "; ".join(errors))

    def is_valid(self) -> bool:
        """True while this master may act as leader: elected and its etcd lease surely not
        expired (monotonic deadline computed from the time each refresh was *sent*). A
        leader that was paused (SIGSTOP, VM freeze) past its lease fails this check at once
        on resuming, before it could serve a stale request (Mooncake issue #2253; docs/store-master.md)."""
        return self.is_leader and time.monotonic() < self.valid_until - 0.2

    def _campaign(self) -> bool:
        if self._client is None:
            self._client = self._connect()
        if self._client.get(self.key):
            return False  # someone leads: no lease churn while following
        t0 = time.monotonic()
        lease = self._client.lease(self.ttl_s)
        if self._client.create(self.key, self.my_address, lease=lease):
            self._lease = lease
            self.valid_until = t0 + self.ttl_s
            return True
        try:
            lease.revoke()
        except Exception:  # noqa: BLE001
            pass
        return False

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                if self._campaign():
                    break
                failures = 0
            except Exception as e:  # noqa: BLE001 - etcd down: keep trying, say why (not too often)
                self._client = None
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning("leader campaign failed (etcd unreachable?)",
                                extra={"error": str(e), "attempts": failures})
            self._stop.wait(self.poll_s)
        if self._stop.is_set():
            return
        self.is_leader = True
        log.info("elected leader", extra={"rpc_address": self.my_address, "key": self.key})
        self.on_elected()
        # keepalive: refresh well within the TTL; step down if we cannot for too long
        interval = max(self.ttl_s / 3.0, 0.2)
        while not self._stop.wait(interval):
            if time.monotonic() >= self.valid_until:
                break  # paused past our lease: another master may lead by now
            try:
                t0 = time.monotonic()
                ttl = self._lease.refresh()
                if ttl is not None and int(ttl) <= 0:
                    raise RuntimeError("leader lease already expired")
                self.valid_until = t0 + self.ttl_s
            except Exception as e:  # noqa: BLE001
                log.warning("leader lease refresh failed", extra={"error": str(e)})
                self._client = None
                try:  # another endpoint may still answer: refresh the same lease through it
                    self._client = self._connect()
                    self._lease.client = self._client
                except Exception as e2:  # noqa: BLE001 - retried on the next refresh
                    log.debug("reconnect to etcd for lease refresh failed", extra={"error": str(e2)})
            if time.monotonic() > self.valid_until - interval:
                break
        if self._stop.is_set():
            return
        self.is_leader = False
        log.error("lost leadership: could not refresh the etcd lease in time")
        self.on_lost()
