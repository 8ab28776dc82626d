"""Classify every operation of a chaos run (pure: records and a fault timeline in, a report out).

A read of key ``k`` over ``[rs, re]`` that returned write ``W`` is

* **foreign** when the bytes are not a value ever written to ``k``: bad magic/length/
  checksum, another key's value, a WriteId nobody began, or a write begun after the read
  ended -- must never happen;
* **stale** when ``W`` was superseded before the read began: an acknowledged upsert or
  remove ``X`` of ``k`` started after ``W`` finished and finished before ``rs``. (A put
  returning 0 does not supersede: it keeps an existing value.) Each stale read is explained
  when a master lost its state soon after ``X`` (within a heartbeat plus slack, or while a
  client was cut off from it since ``X``): the documented window in docs/store-master.md,
  where the owner re-reports a copy whose removal notice it never got. Otherwise it is
  **unexplained**;
* **latest** when ``W`` is acknowledged and not superseded, **in flight** when ``W`` had
  not been acknowledged yet (or never was: its call failed or its process was killed);
* **miss** (not found / empty), or **error** (any other code).

A **hang** is an operation that ran longer than ``hang_after`` once the time its own process
spent stopped (SIGSTOP), and any time the harness itself got no CPU (a starved machine), is
taken off -- finished, still running at shutdown, or running
when its process died. **Recovery** after a fault is the time from its heal until every
load thread has finished, begun after the heal, an acknowledged write and an answered read.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Iterable

from mooncake_lab.chaos.payload import FOREIGN
from mooncake_lab.chaos.stats import merge_spans, overlap, percentile

FOREIGN_STATUSES = FOREIGN
NOT_FOUND = -704
EXISTS = -705
LEASED = -706
WRITES = ("put", "upsert")
READS = ("get", "get_into")
MS = 1_000_000
S = 1_000_000_000
SIGNAL_LAG_NS = 100 * MS


@dataclass
class Fault:
    """One injected fault: ``t0`` injected, ``t1`` healed (ns, CLOCK_MONOTONIC)."""

    kind: str
    target: str
    t0: int
    t1: int
    note: str = ""
    master_change: bool = False  # a master lost its state because of it (restart, failover)


@dataclass
class Timeline:
    """What the harness knows about the run besides the operation logs."""

    t_start: int
    t_end: int
    faults: list[Fault] = field(default_factory=list)
    deaths: dict[tuple[int, int], int] = field(default_factory=dict)  # (writer, incarnation) -> ns
    pauses: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # writer -> SIGSTOP spans
    deaf: list[tuple[int, int]] = field(default_factory=list)  # spans a client could not hear the master
    master_failures: list[int] = field(default_factory=list)  # ns a master lost its state
    #: a leading master stopped serving somewhere in (lo, hi): last seen leading, first seen not
    #: (its gauge is polled, and a loaded machine delays the answers)
    master_failure_spans: list[tuple[int, int]] = field(default_factory=list)
    #: spans in which the harness itself got no CPU (a starved machine): no process of the run
    #: could make progress then, so they do not count towards hangs either
    stalls: list[tuple[int, int]] = field(default_factory=list)


def timeline_to_dict(tl: Timeline) -> dict[str, Any]:
    """JSON-able form (saved next to the op logs so a run can be checked again offline)."""
    return {"t_start": tl.t_start, "t_end": tl.t_end, "faults": [vars(f) for f in tl.faults],
            "deaths": [[w, i, t] for (w, i), t in tl.deaths.items()],
            "pauses": {str(k): v for k, v in tl.pauses.items()}, "deaf": tl.deaf,
            "master_failures": tl.master_failures, "master_failure_spans": tl.master_failure_spans,
            "stalls": tl.stalls}


def timeline_from_dict(d: dict[str, Any]) -> Timeline:
    return Timeline(t_start=d["t_start"], t_end=d["t_end"], faults=[Fault(**f) for f in d["faults"]],
                    deaths={(w, i): t for w, i, t in d["deaths"]},
                    pauses={int(k): [tuple(x) for x in v] for k, v in d["pauses"].items()},
                    deaf=[tuple(x) for x in d["deaf"]], master_failures=list(d["master_failures"]),
                    stalls=[tuple(x) for x in d.get("stalls", [])],
                    master_failure_spans=[tuple(x) for x in d.get("master_failure_spans", [])])


@dataclass
class Config:
    hang_after_ns: int = 20 * S
    transfer_timeout_ns: int = 10 * S  # ops slower than this are counted (not failed)
    notice_window_ns: int = 2 * S  # heartbeat (1 s) + slack for a loaded machine
    unfinished_margin_ns: int = 1 * S  # a killed writer's last request may still land


@dataclass
class Op:
    op: str
    key: str
    writer: int
    inc: int
    thread: int
    n: int
    ts: int
    te: int | None = None  # None: never finished (process died, or stuck at shutdown)
    rc: int | None = None
    wid: str | None = None  # writes: the WriteId written
    got: str | None = None  # reads: the WriteId read
    st: str | None = None  # reads: "ok", "miss", "error" or a foreign status
    why: str | None = None  # reads: the decoder's detail on foreign bytes
    stuck_at: int | None = None


def load_ops(records: Iterable[dict[str, Any]]) -> list[Op]:
    """Merge begin/end/stuck records into one Op per operation."""
    ops: dict[tuple[int, int, int, int], Op] = {}
    for r in records:
        ident = (r["w"], r["i"], r["t"], r["n"])
        o = ops.get(ident)
        if o is None:
            o = ops[ident] = Op(r["op"], r["k"], r["w"], r["i"], r["t"], r["n"], r["ts"])
        if "stuck" in r:
            o.stuck_at = r["tn"]
        elif "b" in r:
            o.wid = r.get("v")
        else:
            o.te, o.rc = r["te"], r["rc"]
            o.wid = r.get("v", o.wid)
            o.got, o.st, o.why = r.get("got"), r.get("st"), r.get("why")
    return sorted(ops.values(), key=lambda o: o.ts)


def _whose(o: Op, w: Op | None, prev: str | None, t_start: int) -> str:
    """What a foreign read returned, as far as the bytes tell: the decoder's detail, and the
    write whose header they start with -- its key, when it began, and whether it is what the
    same thread read last (a read that left the buffer as it was)."""
    parts = [o.why] if o.why else []
    if not o.got:
        parts.append("no write id")
    elif w is None:
        parts.append(f"header of {o.got}, a write never begun")
    else:
        parts.append(f"header of write {o.got} to {w.key!r} begun at {(w.ts - t_start) / S:.3f} s")
    if o.got and o.got == prev:
        parts.append("the bytes this thread's previous read returned")
    return "; ".join(parts)


def _rc_name(o: Op) -> str:
    if o.te is None:
        return "unfinished"
    if o.op in READS:
        return o.st if o.st in ("ok", "miss") else ("foreign" if o.st in FOREIGN_STATUSES else f"rc {o.rc}")
    return "ok" if o.rc == 0 else f"rc {o.rc}"


class _Supersede:
    """Per key: acknowledged upserts/removes sorted by start, with the suffix minimum of
    their end times, to answer "did something start after t and finish before u?" fast."""

    def __init__(self, ops: list[Op]):
        self.ops = sorted(ops, key=lambda o: o.ts)
        self.starts = [o.ts for o in self.ops]
        self.best: list[int] = [0] * len(self.ops)  # index of the min-te op in the suffix
        for i in range(len(self.ops) - 1, -1, -1):
            nxt = self.best[i + 1] if i + 1 < len(self.ops) else None
            self.best[i] = i if nxt is None or self.ops[i].te <= self.ops[nxt].te else nxt

    def first(self, after: int, before: int) -> Op | None:
        i = bisect.bisect_right(self.starts, after)
        if i >= len(self.ops):
            return None
        o = self.ops[self.best[i]]
        return o if o.te < before else None

    def all_between(self, after: int, before: int) -> list[Op]:
        i = bisect.bisect_right(self.starts, after)
        return [o for o in self.ops[i:] if o.ts < before and o.te < before]


def check(ops: list[Op], tl: Timeline, cfg: Config | None = None) -> dict[str, Any]:
    """The report of one run (see the module docstring for the categories)."""
    cfg = cfg or Config()
    writes: dict[str, Op] = {o.wid: o for o in ops if o.op in WRITES and o.wid}
    by_key: dict[str, list[Op]] = {}
    for o in ops:
        if o.te is not None and ((o.op == "upsert" and o.rc == 0) or (o.op == "remove" and o.rc == 0)):
            by_key.setdefault(o.key, []).append(o)
    sup = {k: _Supersede(v) for k, v in by_key.items()}

    def write_end(w: Op) -> int:
        if w.te is not None:
            return w.te
        died = tl.deaths.get((w.writer, w.inc), tl.t_end)
        return died + cfg.unfinished_margin_ns

    counts: dict[str, dict[str, int]] = {}
    reads = {"latest": 0, "in_flight": 0, "stale": 0, "miss": 0, "error": 0, "foreign": 0}
    foreign: list[dict[str, Any]] = []
    stale: list[dict[str, Any]] = []
    hangs: list[dict[str, Any]] = []
    stale_lag: list[float] = []  # seconds from the last master failure to each stale read
    slowest = 0
    over_tt = 0
    merged: dict[int, list[tuple[int, int]]] = {}

    def excluded(writer: int) -> list[tuple[int, int]]:
        if writer not in merged:
            merged[writer] = merge_spans(list(tl.pauses.get(writer, [])) + list(tl.stalls))
        return merged[writer]

    last_read: dict[tuple[int, int, int], str | None] = {}  # thread -> whose bytes its previous read got

    for o in ops:
        c = counts.setdefault(o.op, {})
        name = _rc_name(o)
        c[name] = c.get(name, 0) + 1
        # --- hangs
        end = o.te if o.te is not None else (o.stuck_at or tl.deaths.get((o.writer, o.inc)))
        if end is not None:
            took = end - o.ts - overlap(o.ts, end, excluded(o.writer))
            slowest = max(slowest, took)
            over_tt += took > cfg.transfer_timeout_ns
            if took > cfg.hang_after_ns:
                hangs.append({"op": o.op, "key": o.key, "client": o.writer, "incarnation": o.inc,
                              "t_s": round((o.ts - tl.t_start) / S, 2),
                              "seconds": round(took / S, 2), "finished": o.te is not None,
                              "rc": o.rc})
        if o.op not in READS or o.te is None:
            continue
        # --- reads
        if o.st == "miss":
            reads["miss"] += 1
            continue
        if o.st != "ok" and o.st not in FOREIGN_STATUSES:
            reads["error"] += 1
            continue
        w = writes.get(o.got) if o.got else None
        why = ""
        prev = last_read.get((o.writer, o.inc, o.thread))
        last_read[(o.writer, o.inc, o.thread)] = o.got
        if o.st in FOREIGN_STATUSES:
            why = f"{o.st} ({_whose(o, w, prev, tl.t_start)})"
        elif w is None:
            why = f"write {o.got} was never begun"
        elif w.key != o.key:
            why = f"write {o.got} was to {w.key!r}"
        elif w.ts > o.te:
            why = f"write {o.got} began {(w.ts - o.te) / MS:.1f} ms after the read ended"
        if why:
            reads["foreign"] += 1
            if len(foreign) < 50:
                foreign.append({"key": o.key, "client": o.writer, "thread": o.thread, "op": o.op, "rc": o.rc,
                                "t_s": round((o.ts - tl.t_start) / S, 3),
                                "ms": round((o.te - o.ts) / MS, 1) if o.te is not None else None, "why": why})
            continue
        assert w is not None
        s = sup.get(o.key)
        x = s.first(write_end(w), o.ts) if s else None
        if x is None:
            reads["latest" if (w.te is not None and w.rc == 0 and w.te <= o.ts) else "in_flight"] += 1
            continue
        reads["stale"] += 1
        expl = explain_stale(s.all_between(write_end(w), o.ts), tl, cfg, o.te) if s else ""
        prior = [f for f in tl.master_failures if f <= o.ts]
        if prior:
            stale_lag.append((o.ts - max(prior)) / S)
        stale.append({"key": o.key, "client": o.writer, "t_s": round((o.ts - tl.t_start) / S, 3),
                      "read": o.got, "superseded_by": f"{x.op} at {(x.te - tl.t_start) / S:.3f}s",
                      "explained": bool(expl), "why": expl or "unexplained"})

    return {
        "ops": counts,
        "ops_total": len(ops),
        "reads": reads,
        "foreign_bytes": reads["foreign"],
        "foreign": foreign,
        "stale_reads": reads["stale"],
        "stale_explained": sum(1 for x in stale if x["explained"]),
        "stale_unexplained": sum(1 for x in stale if not x["explained"]),
        "stale": [x for x in stale if not x["explained"]][:50] + [x for x in stale if x["explained"]][:20],
        "stale_after_failure_s": {"p50": _r(percentile(stale_lag, 50)), "max": _r(max(stale_lag, default=None))},
        "hangs": len(hangs),
        "slowest_op_s": round(slowest / S, 2),
        "ops_over_transfer_timeout": over_tt,
        "hang_list": hangs[:50],
        "recovery": recovery(ops, tl),
    }


def explain_stale(superseders: list[Op], tl: Timeline, cfg: Config, read_end: int) -> str:
    """Why a superseded value could be served: a master lost its state before the removal /
    overwrite notice reached the owner of the old copy (see docs/store-master.md)."""
    for x in superseders:
        for f in tl.master_failures:
            # the master may have processed the op just before it failed and the reply
            # arrived after: the op only has to have begun before the failure (plus the few
            # ms a SIGKILL takes to stop a process after it is sent)
            if not x.ts - SIGNAL_LAG_NS <= f <= read_end:
                continue
            if f - x.te <= cfg.notice_window_ns:
                when = (f"finished {(f - x.te) / MS:.0f} ms before" if f >= x.te
                        else f"was acknowledged {(x.te - f) / MS:.0f} ms after")
                return (f"{x.op} {when} a master lost its state (< heartbeat + slack): its notice "
                        f"had not reached the owner")
            for g0, g1 in tl.deaf:
                if g0 <= x.te + cfg.notice_window_ns and g1 >= f:
                    return (f"{x.op} finished, then a client was cut off from the master until it "
                            f"lost its state {(f - x.te) / MS:.0f} ms later: the notice never arrived")
        for lo, hi in tl.master_failure_spans:
            # the leader stopped serving at some moment in (lo, hi): one that fits the window
            if x.ts - SIGNAL_LAG_NS <= hi and lo <= read_end and lo - x.te <= cfg.notice_window_ns:
                return (f"{x.op} ended at {(x.te - lo) / MS:+.0f} ms of the {(hi - lo) / MS:.0f} ms in which "
                        f"the leading master stopped serving (< heartbeat + slack): its notice had not "
                        f"reached the owner")
    return ""


def recovery(ops: list[Op], tl: Timeline) -> dict[str, Any]:
    """Per fault kind: seconds from heal until every load thread has had, begun after the
    heal, an acknowledged write and a read that got an answer (hit or miss) -- so a store
    that answers reads with misses but cannot take writes has not recovered."""
    slots = sorted({(o.writer, o.thread) for o in ops})
    # per slot and need: (start, end) of the ops meeting it, sorted (a slot's ops are sequential)
    good: dict[tuple[int, int, str], list[tuple[int, int]]] = {(w, t, k): [] for w, t in slots for k in "wr"}
    for o in ops:
        if o.te is None:
            continue
        if o.op in WRITES and o.rc == 0:
            good[(o.writer, o.thread, "w")].append((o.ts, o.te))
        elif o.op in READS and o.st in ("ok", "miss"):
            good[(o.writer, o.thread, "r")].append((o.ts, o.te))
    for v in good.values():
        v.sort()
    starts = {k: [a for a, _ in v] for k, v in good.items()}
    faults = sorted(tl.faults, key=lambda f: f.t0)
    stalls = merge_spans(tl.stalls)  # time the machine did not run us does not count
    per_kind: dict[str, list[float]] = {}
    unrecovered: dict[str, int] = {}
    detail = []
    for idx, f in enumerate(faults):
        horizon = faults[idx + 1].t0 if idx + 1 < len(faults) else tl.t_end
        worst = 0
        ok = True
        for key, v in good.items():
            i = bisect.bisect_left(starts[key], f.t1)
            if i >= len(v) or v[i][1] > horizon:
                ok = False
                break
            worst = max(worst, v[i][1] - f.t1 - overlap(f.t1, v[i][1], stalls))
        if ok:
            per_kind.setdefault(f.kind, []).append(worst / S)
        else:
            unrecovered[f.kind] = unrecovered.get(f.kind, 0) + 1
        detail.append({"kind": f.kind, "target": f.target, "t_s": round((f.t0 - tl.t_start) / S, 2),
                       "held_s": round((f.t1 - f.t0) / S, 2),
                       "recovery_s": round(worst / S, 3) if ok else None, "note": f.note})
    out: dict[str, Any] = {"by_kind": {}, "faults": detail}
    all_vals: list[float] = []
    for kind in sorted(set(per_kind) | set(unrecovered)):
        vals = per_kind.get(kind, [])
        all_vals += vals
        out["by_kind"][kind] = {"n": len(vals) + unrecovered.get(kind, 0), "recovered": len(vals),
                                "p50_s": _r(percentile(vals, 50)), "p99_s": _r(percentile(vals, 99))}
    out["all"] = {"n": len(faults), "recovered": len(all_vals),
                  "p50_s": _r(percentile(all_vals, 50)), "p99_s": _r(percentile(all_vals, 99))}
    return out


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)
