"""Master high availability: leader election and leader discovery through etcd or Redis.

Design: every master started with ``--enable_ha`` campaigns for the key
``leader_key(cluster_id)`` (``mooncake-store/<--cluster_id>/master/leader``, so clusters sharing
one etcd or Redis never see each other's leader) with a *put-if-absent* bound to a short time to
live (``LEADER_TTL_S``): an etcd transaction on a lease, or Redis ``SET key me NX PX ttl``
(``--ha_backend_type``, as the original's). The winner refreshes it (every TTL/3; Redis: a
script that extends the key only while it still holds our address, so a master never extends a
successor's) and serves RPC; the others poll the key and campaign again once it disappears
(leader crashed -> its TTL runs out -> key gone). A leader that cannot refresh its lease (etcd
unreachable, paused process) steps down by itself before its lease can have expired (checked
against a local monotonic deadline), so two masters never both believe they lead for longer than
one keepalive period.

Clients (``MasterClient("etcd://h:p;h2:p")`` or ``MasterClient("redis://h:p[/db]")``) read the
key of their cluster (env ``MC_STORE_CLUSTER_ID``, default ``mooncake_cluster``, as upstream's
clients) to find the leader's ``host:port`` and re-read it when an RPC fails.

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
LEADER_TTL_S = 3  # etcd lease TTL of the leader key (seconds): failover takes about this long
ETCD_TIMEOUT_S = 2.0


def check_cluster_id(value: str) -> str:
    """``--cluster_id`` as upstream accepts it (a trailing '/' dropped): 1-128 characters of
    ``[0-9A-Za-z_.-]`` -- it becomes part of keys and paths, so nothing that could reach into
    another cluster's keys (no '/', no '..' component)."""
    v = value[:-1] if value.endswith("/") else value
    if not v or len(v) > 128 or not set(v) <= _CLUSTER_ID_CHARS or v in (".", ".."):
        raise ValueError(f"cluster_id {value!r}: expected 1-128 characters of [0-9A-Za-z_.-]")
    return v


def leader_key(cluster_id: str = DEFAULT_CLUSTER_ID) -> str:
    """The key the leader of ``cluster_id`` holds (masters of other clusters sharing the etcd or
    Redis never see it)."""
    return f"mooncake-store/{cluster_id}/master/leader"


LEADER_KEY = leader_key()


def _client_cluster_id(cluster_id: str | None) -> str:
    """The cluster a client looks for: ``cluster_id``, else env ``MC_STORE_CLUSTER_ID``."""
    if cluster_id is not None:
        return cluster_id
    from mooncake_core import envs

    return check_cluster_id(envs.MC_STORE_CLUSTER_ID)


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


def redis_spec(conn: str) -> Any:
    """``redis://[[user]:password@]host:port[/db]`` -> the metadata layer's RedisSpec (credentials
    may also come from MC_REDIS_USERNAME / MC_REDIS_PASSWORD, as for redis:// metadata)."""
    from mooncake_core.metadata.conn_string import RedisSpec
    from mooncake_core.metadata.factory import parse_conn_string

    if not isinstance(conn, str) or not conn.strip().lower().startswith("redis://"):
        raise ValueError(f"Redis HA backend: expected 'redis://host:port[/db]', got {conn!r}")
    spec = parse_conn_string(conn.strip())
    assert isinstance(spec, RedisSpec)
    return spec


def _redis(spec: Any, timeout: float) -> Any:
    redis = require("redis", "redis", "master high availability through Redis (redis://)")
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    host, port = spec.endpoints[0]
    return redis.Redis(host=host, port=port, db=spec.db, username=spec.username, password=spec.password,
                       socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0),
                       health_check_interval=0, decode_responses=True)


def resolve_redis_leader(spec: Any, timeout: float = ETCD_TIMEOUT_S, cluster_id: str | None = None) -> str | None:
    """The current leader's RPC address from Redis, or None; ConnectionError names the server.
    ``cluster_id``: whose leader (default: env ``MC_STORE_CLUSTER_ID``)."""
    key = leader_key(_client_cluster_id(cluster_id))
    host, port = spec.endpoints[0]
    try:
        client = _redis(spec, timeout)
        try:
            value = client.get(key)
        finally:
            client.close()
    except Exception as e:  # noqa: BLE001 - redis-py's connection/timeout/auth errors alike
        raise ConnectionError(f"cannot reach Redis {host}:{port}: {e}") from None
    return value or None


def leader_resolver(master_addr: str) -> Callable[[float], str | None] | None:
    """For an HA master address (``etcd://...`` or ``redis://...``) the function ``timeout ->
    leader address or None`` a client re-reads the leader with; None for a plain ``host:port``."""
    if master_addr.startswith("etcd://"):
        endpoints = parse_etcd_endpoints(master_addr)
        return lambda timeout: resolve_leader(endpoints, timeout)
    if master_addr.lower().startswith("redis://"):
        spec = redis_spec(master_addr)
        return lambda timeout: resolve_redis_leader(spec, timeout)
    return None


def resolve_leader(endpoints: list[tuple[str, int]], timeout: float = ETCD_TIMEOUT_S,
                   cluster_id: str | None = None) -> str | None:
    """The current leader's RPC address from etcd, or None if no leader is registered.
    ``cluster_id``: whose leader (default: env ``MC_STORE_CLUSTER_ID``, as upstream's clients).

    Tries each endpoint in turn; raises ConnectionError naming all of them if none answers.
    """
    key = leader_key(_client_cluster_id(cluster_id))
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


class LeadershipLost(RuntimeError):
    """A refresh found the leader key gone or held by another master: step down at once."""


class EtcdLeaderBackend:
    """The leader key on etcd: a lease bound to a put-if-absent transaction."""

    name = "etcd"

    def __init__(self, endpoints: list[tuple[str, int]], cluster_id: str = DEFAULT_CLUSTER_ID) -> None:
        self.endpoints = endpoints
        self.key = leader_key(cluster_id)
        self._client: Any = None
        self._lease: Any = None

    def describe(self) -> str:
        return ";".join(f"{h}:{p}" for h, p in self.endpoints)

    def _connect(self) -> Any:
        errors = []
        for host, port in self.endpoints:
            try:
                c = _client(host, port, ETCD_TIMEOUT_S)
                c.status()
                return c
            except Exception as e:  # noqa: BLE001
                errors.append(f"{host}:{port}: {e}")
        raise ConnectionError("cannot reach any etcd endpoint: " + "; ".join(errors))

    def campaign(self, me: str, ttl_s: int) -> bool:
        if self._client is None:
            self._client = self._connect()
        if self._client.get(self.key):
            return False  # someone leads: no lease churn while following
        lease = self._client.lease(ttl_s)
        if self._client.create(self.key, me, lease=lease):
            self._lease = lease
            return True
        try:
            lease.revoke()
        except Exception:  # noqa: BLE001
            pass
        return False

    def refresh(self, me: str, ttl_s: int) -> None:
        try:
            ttl = self._lease.refresh()
            if ttl is not None and int(ttl) <= 0:
                raise LeadershipLost("leader lease already expired")
        except Exception:
            self._client = None
            try:  # another endpoint may still answer: the next refresh goes through it
                self._client = self._connect()
                self._lease.client = self._client
            except Exception as e2:  # noqa: BLE001 - retried on the next refresh
                log.debug("reconnect to etcd for lease refresh failed", extra={"error": str(e2)})
            raise

    def release(self, me: str) -> None:
        if self._lease is not None:
            self._lease.revoke()

    def reset(self) -> None:
        self._client = None


#: extend the key's TTL only while it holds our address (a successor's key is never extended)
_REDIS_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) " \
               "else return 0 end"
#: delete the key only while it holds our address
_REDIS_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"


class RedisLeaderBackend:
    """The leader key on Redis: ``SET NX PX`` to win, a compare-and-extend script to keep it."""

    name = "redis"

    def __init__(self, spec: Any, cluster_id: str = DEFAULT_CLUSTER_ID) -> None:
        self.spec = spec
        self.key = leader_key(cluster_id)
        self._client: Any = None

    def describe(self) -> str:
        host, port = self.spec.endpoints[0]
        return f"redis://{host}:{port}/{self.spec.db}"

    def _c(self) -> Any:
        if self._client is None:
            self._client = _redis(self.spec, ETCD_TIMEOUT_S)
        return self._client

    def campaign(self, me: str, ttl_s: int) -> bool:
        return bool(self._c().set(self.key, me, nx=True, px=int(ttl_s * 1000)))

    def refresh(self, me: str, ttl_s: int) -> None:
        if not self._c().eval(_REDIS_RENEW, 1, self.key, me, int(ttl_s * 1000)):
            raise LeadershipLost("the leader key expired or holds another master")

    def release(self, me: str) -> None:
        self._c().eval(_REDIS_RELEASE, 1, self.key, me)

    def reset(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001
                pass
        self._client = None


LeaderBackend = EtcdLeaderBackend | RedisLeaderBackend


def leader_backend(backend_type: str, connstring: str, etcd_endpoints: str,
                   cluster_id: str = DEFAULT_CLUSTER_ID) -> LeaderBackend:
    """The election backend of ``--ha_backend_type`` / ``--ha_backend_connstring`` (etcd falls back
    to ``--etcd_endpoints``, as the original does). ValueError names the flag to fix."""
    kind = (backend_type or "etcd").strip().lower()
    if kind == "etcd":
        spec = connstring or etcd_endpoints
        if not spec:
            raise ValueError("--enable_ha with --ha_backend_type=etcd needs --etcd_endpoints (or "
                             "--ha_backend_connstring=etcd://host:port)")
        return EtcdLeaderBackend(parse_etcd_endpoints(spec), cluster_id)
    if kind == "redis":
        if not connstring:
            raise ValueError("--ha_backend_type=redis needs --ha_backend_connstring=redis://host:port[/db]")
        return RedisLeaderBackend(redis_spec(connstring), cluster_id)
    raise ValueError(f"--ha_backend_type={backend_type!r}: expected etcd or redis (k8s leases: not supported)")


class LeaderElection:
    """Campaign for leadership in a background thread, through ``backend`` (etcd or Redis).

    ``on_elected()`` is called (from the election thread) when this master becomes leader,
    ``on_lost()`` when it loses leadership (its key could not be refreshed in time). The
    master process exits on loss (as the original does): a fresh start re-campaigns with
    an empty state, which is what the recovery protocol expects.
    """

    def __init__(self, backend: "LeaderBackend | list[tuple[str, int]]", my_address: str, *,
                 on_elected: Callable[[], None], on_lost: Callable[[], None],
                 ttl_s: int = LEADER_TTL_S, poll_s: float = 0.5, cluster_id: str = DEFAULT_CLUSTER_ID) -> None:
        self.backend: LeaderBackend = (EtcdLeaderBackend(backend, cluster_id) if isinstance(backend, list)
                                       else backend)
        self.my_address = my_address
        self.on_elected = on_elected
        self.on_lost = on_lost
        self.ttl_s = ttl_s
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.is_leader = False
        self.valid_until = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mc-leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self.is_leader:
            try:  # hand leadership over at once instead of waiting for the key to expire
                self.backend.release(self.my_address)
            except Exception as e:  # noqa: BLE001 - it then expires after ttl_s
                log.warning("could not release the leader key on stop", extra={"error": str(e)})

    def is_valid(self) -> bool:
        """True while this master may act as leader: elected and its key surely not expired
        (monotonic deadline computed from the time each refresh was *sent*). A leader that was
        paused (SIGSTOP, VM freeze) past its TTL fails this check at once on resuming, before it
        could serve a stale request (Mooncake issue #2253; docs/store-master.md)."""
        return self.is_leader and time.monotonic() < self.valid_until - 0.2

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                t0 = time.monotonic()
                if self.backend.campaign(self.my_address, self.ttl_s):
                    self.valid_until = t0 + self.ttl_s
                    break
                failures = 0
            except Exception as e:  # noqa: BLE001 - backend down: keep trying, say why (not too often)
                self.backend.reset()
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning(f"leader campaign failed ({self.backend.name} unreachable?)",
                                extra={"error": str(e), "attempts": failures, "backend": self.backend.describe()})
            self._stop.wait(self.poll_s)
        if self._stop.is_set():
            return
        self.is_leader = True
        log.info("elected leader", extra={"rpc_address": self.my_address, "key": self.backend.key,
                                          "backend": self.backend.describe()})
        self.on_elected()
        # keepalive: refresh well within the TTL; step down if we cannot for too long
        interval = max(self.ttl_s / 3.0, 0.2)
        while not self._stop.wait(interval):
            if time.monotonic() >= self.valid_until:
                break  # paused past our TTL: another master may lead by now
            try:
                t0 = time.monotonic()
                self.backend.refresh(self.my_address, self.ttl_s)
                self.valid_until = t0 + self.ttl_s
            except LeadershipLost as e:
                log.warning("leader key lost", extra={"error": str(e), "backend": self.backend.name})
                break
            except Exception as e:  # noqa: BLE001
                log.warning("leader key refresh failed", extra={"error": str(e), "backend": self.backend.name})
            if time.monotonic() > self.valid_until - interval:
                break
        if self._stop.is_set():
            return
        self.is_leader = False
        log.error(f"lost leadership: could not refresh the {self.backend.name} leader key in time")
        self.on_lost()
