"""The result model of ``mooncake_doctor`` (pure: no I/O): one ``Check`` per step, the report's
exit code and its two renderings (text for a person, JSON for a script).

Why a separate module: the checks' verdicts and the fix each failure names are the contract a
user reads; they are unit-tested without sockets, and the CLI (``doctor.py``) only gathers facts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
_MARK = {OK: "PASS", WARN: "WARN", FAIL: "FAIL", SKIP: "SKIP"}


@dataclass(frozen=True)
class Check:
    """One step: ``status`` ok / warn (works, but worth a look) / fail / skip (not applicable
    or blocked by an earlier failure), what was found, and for warn/fail the fix."""

    name: str
    status: str
    detail: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in _MARK:
            raise ValueError(f"check {self.name!r}: unknown status {self.status!r}")
        if self.status in (WARN, FAIL) and not self.fix:
            raise ValueError(f"check {self.name!r}: a {self.status} must say how to fix it")


def exit_code(checks: list[Check]) -> int:
    """0 only when no check failed (warnings and skips do not fail the run), else 1."""
    return 1 if any(c.status == FAIL for c in checks) else 0


def render_text(checks: list[Check]) -> str:
    lines = []
    for i, c in enumerate(checks, 1):
        lines.append(f"[{_MARK[c.status]}] {i}. {c.name}: {c.detail}")
        if c.fix and c.status in (WARN, FAIL):
            lines.append(f"       fix: {c.fix}")
    failed = [c.name for c in checks if c.status == FAIL]
    lines.append("all checks passed" if not failed else f"{len(failed)} check(s) failed: {', '.join(failed)}")
    return "\n".join(lines)


def render_json(checks: list[Check]) -> str:
    return json.dumps({"ok": exit_code(checks) == 0, "checks": [asdict(c) for c in checks]}, indent=2)


def clock_check(offset_s: float | None, rtt_s: float, *, warn_s: float = 0.5, fail_s: float = 5.0) -> Check:
    """Verdict on this host's clock against the master's (NTP-style: the master's time minus the
    midpoint of the request, within +-rtt/2). Leases are measured on monotonic clocks, but logs,
    the SSD tier's file times and other hosts' wall-clock deadlines are not."""
    if offset_s is None:
        return Check("clock offset against the master", SKIP, "the master does not report its clock (older version)")
    detail = f"{offset_s * 1000:+.1f} ms (+-{rtt_s * 500:.1f} ms)"
    data = {"offset_s": offset_s, "rtt_s": rtt_s}
    fix = "synchronise the clocks (chrony/ntpd on every host, or the cloud's time service)"
    if abs(offset_s) - rtt_s / 2 > fail_s:
        return Check("clock offset against the master", FAIL, detail, fix, data)
    if abs(offset_s) - rtt_s / 2 > warn_s:
        return Check("clock offset against the master", WARN, detail, fix, data)
    return Check("clock offset against the master", OK, detail, data=data)


def memlock_check(soft: int, hard: int, protocol: str) -> Check:
    """RDMA registers (pins) memory: it needs a memlock limit as large as the buffers; tcp does not."""
    unlimited = -1

    def fmt(v: int) -> str:
        return "unlimited" if v == unlimited else f"{v >> 10} KiB"

    detail = f"soft {fmt(soft)}, hard {fmt(hard)}"
    data = {"soft": soft, "hard": hard}
    if soft == unlimited:
        return Check("memlock limit", OK, detail, data=data)
    fix = ("raise it: `ulimit -l unlimited` (limits.conf `* - memlock unlimited`; systemd LimitMEMLOCK=infinity; "
           "Kubernetes: the IPC_LOCK capability)")
    if protocol == "rdma":
        return Check("memlock limit", FAIL, detail + " -- RDMA cannot register buffers larger than this", fix, data)
    return Check("memlock limit", WARN, detail + " -- enough for tcp, too small for RDMA", fix, data)
