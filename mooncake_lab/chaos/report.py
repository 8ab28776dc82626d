"""Turn a run's checker result and process history into the report: a dict (``--json``)
and a text table with one column per implementation (pure, stdlib only)."""

from __future__ import annotations

from typing import Any, Sequence

from mooncake_lab.chaos.stats import slope

S = 1e9


def process_summary(samples: Sequence[tuple[int, str, int, int, int]], lives: dict[str, list[Any]],
                    t_before: int, t_after: int, events: list[dict[str, Any]], t0: int) -> dict[str, Any]:
    """Per slot: RSS (MB) and open fds at ``t_before`` and at the last sample up to
    ``t_after`` (the end of the load, before shutdown), restarts, and the exits the nemesis
    did not cause."""
    out: dict[str, Any] = {}
    for name in sorted(lives):
        mine = [s for s in samples if s[1] == name and s[0] <= t_after and s[3] > 0]
        before = next((s for s in mine if s[0] >= t_before), mine[0] if mine else None)
        after = mine[-1] if mine else None
        out[name] = {
            "rss_mb_before": round(before[3] / 1024, 1) if before else None,
            "rss_mb_after": round(after[3] / 1024, 1) if after else None,
            "fds_before": before[4] if before else None,
            "fds_after": after[4] if after else None,
            "same_process": bool(before and after and before[2] == after[2]),
            "starts": len(lives[name]),
            "unexpected_exits": [{"t_s": round((e["t"] - t0) / S, 2), "event": e["event"], "rc": e.get("rc")}
                                 for e in events if e["slot"] == name],
        }
    return out


def series_summary(samples: Sequence[tuple[int, str, int, int, int]], skip_s: float = 0.0) -> dict[str, Any]:
    """Soak view: per slot and process, first/last RSS and fds and their slopes per minute
    (least squares over the samples after ``skip_s`` of warm-up)."""
    out: dict[str, Any] = {}
    if not samples:
        return out
    t0 = samples[0][0]
    for name in sorted({s[1] for s in samples}):
        mine = [s for s in samples if s[1] == name]
        pid = mine[-1][2]
        mine = [s for s in mine if s[2] == pid]  # the last incarnation only
        steady = [s for s in mine if (s[0] - t0) / S >= skip_s] or mine
        out[name] = {
            "pid": pid,
            "samples": len(mine),
            "rss_mb_start": round(steady[0][3] / 1024, 1), "rss_mb_end": round(steady[-1][3] / 1024, 1),
            "fds_start": steady[0][4], "fds_end": steady[-1][4],
            "rss_mb_per_min": _r(slope([((s[0] - t0) / S / 60, s[3] / 1024) for s in steady]), 3),
            "fds_per_min": _r(slope([((s[0] - t0) / S / 60, s[4]) for s in steady]), 3),
            "curve_rss_mb": [round(s[3] / 1024, 1) for s in _thin(steady, 12)],
            "curve_fds": [s[4] for s in _thin(steady, 12)],
        }
    return out


def _thin(xs: Sequence[Any], n: int) -> list[Any]:
    if len(xs) <= n:
        return list(xs)
    return [xs[round(i * (len(xs) - 1) / (n - 1))] for i in range(n)]


def _r(v: float | None, nd: int = 2) -> float | None:
    return None if v is None else round(v, nd)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def _sum(procs: dict[str, Any], prefix: str, field: str) -> float | None:
    vals = [p[field] for n, p in procs.items() if n.startswith(prefix) and p[field] is not None]
    return round(sum(vals), 1) if vals else None


def render(runs: list[dict[str, Any]]) -> str:
    """The side-by-side table (one column per run)."""
    label = {"ours": "ours", "ref": "original 0.3.13"}
    cols = [label.get(r["impl"], r["impl"]) for r in runs]
    rows: list[tuple[str, list[Any]]] = []

    def row(name: str, fn) -> None:
        vals = []
        for r in runs:
            try:
                vals.append(fn(r))
            except (KeyError, TypeError, IndexError):
                vals.append(None)
        rows.append((name, vals))

    row("operations", lambda r: r["check"]["ops_total"])
    row("  ops/s", lambda r: round(r["check"]["ops_total"] / max(1e-9, r["run"]["load_s"])))
    for k in ("latest", "in_flight", "stale", "miss", "error"):
        row(f"  reads: {k.replace('_', ' ')}", lambda r, k=k: r["check"]["reads"][k])
    row("  writes acknowledged", lambda r: sum(v for op in ("put", "upsert") for n, v in r["check"]["ops"].get(op, {}).items() if n == "ok"))
    row("  writes failed", lambda r: sum(v for op in ("put", "upsert") for n, v in r["check"]["ops"].get(op, {}).items() if n != "ok"))
    row("FOREIGN BYTES (must be 0)", lambda r: r["check"]["foreign_bytes"])
    row("stale reads (explained/unexpl.)", lambda r: f"{r['check']['stale_explained']}/{r['check']['stale_unexplained']}")
    row("HANGS (must be 0)", lambda r: r["check"]["hangs"])
    row("  slowest op s (own pauses excluded)", lambda r: r["check"]["slowest_op_s"])
    row("  ops over the transfer timeout", lambda r: r["check"]["ops_over_transfer_timeout"])
    row("  machine stalls (n, total s)", lambda r: f"{r['run']['harness_stalls']['n']}, "
                                                   f"{r['run']['harness_stalls']['total_s']:.1f}")
    row("faults injected", lambda r: sum(r["faults"].values()))
    kinds = sorted({k for r in runs for k in r["check"]["recovery"]["by_kind"]})
    for k in kinds:
        row(f"  {k}: n, recovery p50/p99 s",
            lambda r, k=k: "{n}  {p50}/{p99}".format(
                n=r["check"]["recovery"]["by_kind"][k]["n"],
                p50=_fmt(r["check"]["recovery"]["by_kind"][k]["p50_s"]),
                p99=_fmt(r["check"]["recovery"]["by_kind"][k]["p99_s"]))
            + ("" if r["check"]["recovery"]["by_kind"][k]["recovered"] == r["check"]["recovery"]["by_kind"][k]["n"]
               else f" ({r['check']['recovery']['by_kind'][k]['n'] - r['check']['recovery']['by_kind'][k]['recovered']} unrec.)"))
    row("  all faults: recovery p50/p99 s",
        lambda r: f"{_fmt(r['check']['recovery']['all']['p50_s'])}/{_fmt(r['check']['recovery']['all']['p99_s'])}")
    row("client exits not injected", lambda r: sum(len(p["unexpected_exits"]) for n, p in r["procs"].items() if n.startswith("client")))
    row("master exits not injected (step-downs)", lambda r: sum(len(p["unexpected_exits"]) for n, p in r["procs"].items() if n.startswith("master")))
    row("master RSS MB before->after", lambda r: _arrow(r["procs"], "master", "rss_mb"))
    row("clients RSS MB (sum) before->after", lambda r: _arrow(r["procs"], "client", "rss_mb"))
    row("master fds before->after", lambda r: _arrow(r["procs"], "master", "fds"))
    row("clients fds (sum) before->after", lambda r: _arrow(r["procs"], "client", "fds"))
    w0 = max(len(n) for n, _ in rows) + 2
    w = max(16, *(len(c) + 2 for c in cols))
    lines = [" " * w0 + "".join(c.rjust(w) for c in cols)]
    for name, vals in rows:
        lines.append(name.ljust(w0) + "".join(_fmt(v).rjust(w) for v in vals))
    return "\n".join(lines)


def _arrow(procs: dict[str, Any], prefix: str, field: str) -> str:
    b, a = _sum(procs, prefix, f"{field}_before"), _sum(procs, prefix, f"{field}_after")
    fmt = (lambda v: f"{v:.0f}") if field == "fds" else (lambda v: f"{v:.1f}")
    return f"{fmt(b) if b is not None else '-'} -> {fmt(a) if a is not None else '-'}"
