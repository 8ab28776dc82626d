"""The nemesis: injects one fault at a time, at random, and heals it.

Kinds: ``kill-client`` (SIGKILL, restart after a while), ``pause-client`` (SIGSTOP /
SIGCONT), ``kill-master`` (the leader in HA mode; restarted as a follower there),
``pause-master``, ``pause-etcd-leader`` (HA only: the raft leader of the etcd cluster), and
the network kinds of netlab (``partition``, ``isolate``, ``slow-link``, ``delay``, ``loss``).
Kinds are dealt from a shuffled deck (every enabled kind once per round, in random order),
so a short run still sees each of them. After each heal the nemesis waits until every
client has succeeded again (bounded) plus a random gap, so recovery is measured per fault.

It records what the checker needs: each fault's inject/heal times, whether a master lost
its state because of it, the spans in which a client was stopped (own ops do not count as
hangs then) or could not hear the master (stale-read explanations).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable

from mooncake_lab.chaos.checker import Fault
from mooncake_lab.chaos.cluster import Cluster
from mooncake_lab.chaos.netlab import NET_KINDS, Capabilities, NetError, NetLab
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.chaos.nemesis")

PROCESS_KINDS = ("kill-client", "pause-client", "kill-master", "pause-master", "pause-etcd-leader")
ALL_KINDS = PROCESS_KINDS + NET_KINDS


def enabled_kinds(requested: list[str], ha: bool, caps: Capabilities | None,
                  ha_backend: str = "etcd") -> tuple[list[str], dict[str, str]]:
    """(kinds to inject, {kind: why skipped}) -- pure."""
    on, off = [], {}
    for k in requested:
        if k not in ALL_KINDS:
            raise ValueError(f"unknown fault kind {k!r} (known: {', '.join(ALL_KINDS)})")
        if k == "pause-etcd-leader" and not ha:
            off[k] = "needs --ha (no etcd without it)"
        elif k == "pause-etcd-leader" and ha_backend != "etcd":
            off[k] = f"no etcd with --ha-backend {ha_backend}"
        elif k in NET_KINDS and (caps is None or k not in caps.allowed):
            off[k] = (caps.reasons.get(k) if caps else None) or "network namespaces not in use (--net none)"
        else:
            on.append(k)
    return on, off


class Deck:
    """Every kind once per round, in a fresh random order each round."""

    def __init__(self, kinds: list[str], rng: random.Random):
        self.kinds, self.rng, self.hand = list(kinds), rng, []

    def draw(self) -> str:
        if not self.hand:
            self.hand = self.kinds[:]
            self.rng.shuffle(self.hand)
        return self.hand.pop()


@dataclass
class NemesisConfig:
    kinds: list[str]
    gap_s: tuple[float, float] = (1.0, 3.0)
    down_s: tuple[float, float] = (0.5, 2.0)  # kill -> restart
    pause_s: tuple[float, float] = (0.5, 12.0)  # a client (beyond client_ttl / transfer timeout now and then)
    master_pause_s: tuple[float, float] = (0.5, 4.0)  # below the clients' RPC timeout
    etcd_pause_s: tuple[float, float] = (1.0, 4.0)
    net_s: tuple[float, float] = (1.0, 12.0)
    recover_timeout_s: float = 30.0


@dataclass
class Record:
    faults: list[Fault] = field(default_factory=list)
    pauses: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    deaf: list[tuple[int, int]] = field(default_factory=list)
    master_failures: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Nemesis:
    def __init__(self, cluster: Cluster, net: NetLab | None, cfg: NemesisConfig, rng: random.Random):
        self.c, self.net, self.cfg, self.rng = cluster, net, cfg, rng
        self.deck = Deck(cfg.kinds, rng)
        self.rec = Record()
        self.current = ""

    def _u(self, span: tuple[float, float]) -> float:
        """A random hold time, cut short so that the fault heals by the end of the run."""
        d = self.rng.uniform(*span)
        if self._until:
            d = max(0.0, min(d, (self._until - time.monotonic_ns()) / 1e9))
        return d

    def _client(self) -> int:
        live = [c.index for c in self.c.clients if c.alive() and not c.down and not c.paused]
        return self.rng.choice(live) if live else self.rng.randrange(len(self.c.clients))

    def run(self, until_ns: int, stopping: Callable[[], bool]) -> None:
        self._until = until_ns
        while not stopping() and time.monotonic_ns() < until_ns:
            kind = self.deck.draw()
            try:
                self.one(kind, until_ns)
            except (NetError, OSError, RuntimeError) as e:
                self.rec.errors.append(f"{kind}: {e}")
                log.warning("fault injection failed", extra={"kind": kind, "error": str(e)})
            self.current = ""
            self._sleep(self._u(self.cfg.gap_s), until_ns)
        self._until = 0

    @staticmethod
    def _sleep(seconds: float, until_ns: int) -> None:
        time.sleep(max(0.0, min(seconds, (until_ns - time.monotonic_ns()) / 1e9)))

    def one(self, kind: str, until_ns: int = 0) -> Fault:
        c, cfg = self.c, self.cfg
        before = c.master_identity() if kind in ("kill-master", "pause-master", "pause-etcd-leader") else None
        note = ""
        self.current = kind
        t0 = time.monotonic_ns()
        if kind == "kill-client":
            i = self._client()
            target = c.clients[i].name
            c.kill(c.clients[i])
            time.sleep(self._u(cfg.down_s))
            c.restart(c.clients[i])
        elif kind == "pause-client":
            i = self._client()
            target = c.clients[i].name
            d = self._u(cfg.pause_s)
            c.pause(c.clients[i])
            time.sleep(d)
            c.resume(c.clients[i])
            note = f"{d:.1f}s"
        elif kind in ("kill-master", "pause-master"):
            m = c.leader_master() or c.masters[0]
            target = m.name
            if kind == "kill-master":
                c.kill(m)
                time.sleep(self._u(cfg.down_s))
                c.restart(m)
            else:
                d = self._u(cfg.master_pause_s)
                c.pause(m)
                time.sleep(d)
                c.resume(m)
                note = f"{d:.1f}s"
        elif kind == "pause-etcd-leader":
            e = c.etcd_leader()
            if e is None:
                raise RuntimeError("no etcd leader found")
            target = e.name
            d = self._u(cfg.etcd_pause_s)
            c.pause(e)
            time.sleep(d)
            c.resume(e)
            note = f"{d:.1f}s"
        else:
            assert self.net is not None
            d = self._u(cfg.net_s)
            i = self._client()
            if kind == "partition":
                j = self.rng.choice([x for x in range(len(c.clients)) if x != i])
                target = f"client{i}<->client{j}"
                self.net.partition(i, j)
                time.sleep(d)
                self.net.heal_partition(i, j)
            elif kind == "isolate":
                target = f"client{i}"
                self.net.isolate(i)
                time.sleep(d)
                self.net.unisolate(i)
            else:
                target = f"client{i}"
                self.net.shape(i, kind)
                time.sleep(d)
                self.net.unshape(i)
            note = f"{d:.1f}s"
        t1 = time.monotonic_ns()
        if kind == "pause-client":
            self.rec.pauses.setdefault(i, []).append((t0, t1))
        if kind in ("pause-client", "isolate"):
            self.rec.deaf.append((t0, t1))
        recovered = self._wait_recovered(t1, until_ns)
        f = Fault(kind, target, t0, t1, note + ("" if recovered else "; no recovery seen"))
        if before is not None and (kind == "kill-master" or c.master_identity() != before):
            f.master_change = True
            f.note = (f.note + "; " if f.note else "") + "master changed"
            self.rec.master_failures.append(t0)
        self.rec.faults.append(f)
        log.info("fault healed", extra={"kind": kind, "target": target, "held_s": round((t1 - t0) / 1e9, 2),
                                        "recovered": recovered, "note": f.note})
        return f

    def _wait_recovered(self, t1: int, until_ns: int) -> bool:
        """Until every load thread of every client finished a success begun after ``t1``
        (the checker's definition of recovery), bounded by ``recover_timeout_s``."""
        deadline = time.monotonic() + self.cfg.recover_timeout_s
        while time.monotonic() < deadline and (not until_ns or time.monotonic_ns() < until_ns + 10**10):
            if all(c.ready.is_set() and c.progress.get("ok_since", 0) >= t1 for c in self.c.clients):
                return True
            time.sleep(0.1)
        return False
