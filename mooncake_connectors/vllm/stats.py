"""What the vLLM connectors count, and how one interval's counts combine (pure: no vLLM, no I/O).

vLLM 0.32's KV connector stats hook (``KVConnectorBase_V1.get_kv_connector_stats``) collects
each connector's figures every engine step -- from every worker and from the scheduler -- sends
them as a plain dict from the engine core to the API server, aggregates them there and hands
them to the connector's Prometheus metrics (``build_prom_metrics``) and to the periodic
``KV Transfer metrics:`` log line (``reduce``). This module is that dict: ``{"counts": {name:
int}, "times": {name: [seconds, ...]}}`` -- only str keys, ints and float lists, because it
crosses processes (msgpack) -- the recorder that fills it on a connector side, and the merge and
summary vLLM asks for. ``connector_stats.py`` wraps it in vLLM's classes.
"""

from __future__ import annotations

from typing import Any

COUNTS, TIMES = "counts", "times"

# ---------------------------------------------------------------- MooncakeCoreConnector (P2P)
PULLED_BYTES = "pulled_bytes"      # decode: KV bytes read from prefills
PULLED_BLOCKS = "pulled_blocks"    # decode: KV blocks read from prefills
PULL_SECONDS = "pull_seconds"      # decode: one request's read, submit to completion
HOLD_SECONDS = "hold_seconds"      # prefill: blocks held for a decode, until released
LEASES_EXPIRED = "leases_expired"  # prefill: blocks freed by the lease, no decode confirmed
#: decode: why a request's KV did not arrive (then ``kv_load_failure_policy`` applies)
P2P_FAILURES = ("start", "read", "lease", "no_ready", "bad_ready", "unreachable")
# scheduler side of the P2P connector (vLLM's scheduler calls get_kv_connector_stats too)
REMOTE_REQUESTS = "remote_requests"          # decode: requests scheduled to load their KV from a prefill
REMOTE_BLOCKS = "remote_blocks"              # decode: blocks allocated for those loads
REMOTE_LOCAL_HITS = "remote_local_hits"      # decode: remote-prefill requests fully cached here (released)
REMOTE_WAIT_SECONDS = "remote_wait_seconds"  # decode: blocks allocated -> worker reports the KV received
HANDOFF_REQUESTS = "handoff_requests"        # prefill: finished requests whose blocks it holds for a decode
HANDOFF_BLOCKS = "handoff_blocks"            # prefill: blocks promised to decodes

# ---------------------------------------------------------------- MooncakeCoreStoreConnector
LOOKUP_HIT_BLOCKS = "lookup_hit_blocks"    # scheduler: blocks the store had (leading prefix)
LOOKUP_MISS_BLOCKS = "lookup_miss_blocks"  # scheduler: blocks looked up and not found
LOADED_BYTES = "loaded_bytes"
LOADED_BLOCKS = "loaded_blocks"
LOAD_SECONDS = "load_seconds"              # one step's batch of block reads
SAVED_BYTES = "saved_bytes"
SAVED_BLOCKS = "saved_blocks"
SAVE_SECONDS = "save_seconds"              # one request's save (existence check + puts)
STORE_FAILURES = ("load", "save")          # counted per block

FAILED = "failed_"  # prefix of the failure counts: ``failed_<reason>``


def failure(reason: str) -> str:
    """The count name of failures for ``reason``."""
    return FAILED + reason


def empty() -> dict[str, Any]:
    return {COUNTS: {}, TIMES: {}}


def is_empty(data: dict[str, Any]) -> bool:
    return not any(data.get(COUNTS, {}).values()) and not any(data.get(TIMES, {}).values())


def check(data: Any) -> dict[str, Any]:
    """``data`` if it has the shape above (it came over the wire from another process), else a
    ValueError saying which part is wrong -- a version skew between processes, not a silent zero."""
    if not isinstance(data, dict) or set(data) - {COUNTS, TIMES}:
        raise ValueError(f"connector stats: expected a dict with keys {COUNTS!r}, {TIMES!r}, got {data!r:.200}")
    counts, times = data.setdefault(COUNTS, {}), data.setdefault(TIMES, {})
    for k, v in counts.items():
        if not isinstance(k, str) or not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"connector stats: count {k!r} must be a non-negative int, got {v!r}")
    for k, v in times.items():
        if not isinstance(k, str) or not isinstance(v, list) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in v):
            raise ValueError(f"connector stats: times {k!r} must be a list of non-negative seconds, got {v!r:.200}")
    return data


def merge(into: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Add ``other``'s counts to ``into`` and append its observations (in place; returns ``into``)."""
    counts, times = into.setdefault(COUNTS, {}), into.setdefault(TIMES, {})
    for k, v in other.get(COUNTS, {}).items():
        counts[k] = counts.get(k, 0) + v
    for k, v in other.get(TIMES, {}).items():
        times.setdefault(k, []).extend(v)
    return into


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summarize(data: dict[str, Any]) -> dict[str, int | float]:
    """One interval in a few figures for vLLM's log line: every count, and per timing its number,
    mean and p90 in milliseconds."""
    out: dict[str, int | float] = dict(sorted(data.get(COUNTS, {}).items()))
    for k, xs in sorted(data.get(TIMES, {}).items()):
        if not xs:
            continue
        base = k.removesuffix("_seconds")
        out[f"{base}_n"] = len(xs)
        out[f"{base}_avg_ms"] = round(sum(xs) / len(xs) * 1e3, 3)
        out[f"{base}_p90_ms"] = round(_quantile(xs, 0.9) * 1e3, 3)
    return out


class StatsRecorder:
    """One connector side's figures since vLLM last collected them (single-threaded use: the
    connectors record from the thread vLLM calls them on)."""

    def __init__(self) -> None:
        self.data = empty()

    def add(self, name: str, n: int = 1) -> None:
        if n:
            self.data[COUNTS][name] = self.data[COUNTS].get(name, 0) + n

    def observe(self, name: str, seconds: float) -> None:
        self.data[TIMES].setdefault(name, []).append(max(0.0, seconds))

    def take(self) -> dict[str, Any] | None:
        """The figures since the last ``take`` (None when there are none), and start afresh."""
        if is_empty(self.data):
            return None
        out, self.data = self.data, empty()
        return out
