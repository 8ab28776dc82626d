#!/usr/bin/env python3
"""Write the Grafana dashboards of Mooncake (one per component) from the tables below.

    python3 deploy/grafana/generate.py          # rewrites deploy/grafana/*.json
    python3 deploy/grafana/generate.py --check  # exit 1 if a committed JSON is out of date

Why generated: the boards share a layout, the data-source and instance variables and the unit
conventions; a table of (row, title, unit, expressions) per board keeps them consistent and
reviewable. tests/dashboard/test_grafana.py checks that every metric an expression names is
exported by a running service, and that the JSON files match this script.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
R = "[$__rate_interval]"
# The proxy labels its per-engine series ``instance`` (the engine); Prometheus keeps its own
# target label ``instance`` and renames the exported one ``exported_instance`` (honor_labels
# off, as in deploy/prometheus/prometheus.yml), which is what the proxy board groups by.
SEL = 'instance=~"$instance"'


def sel(m: str, extra: str = "") -> str:
    """``m`` restricted to the chosen instances."""
    return f"{m}{{{SEL}{extra}}}"


def rate(m: str, by: str = "", extra: str = "") -> str:
    inner = f"rate({sel(m, extra)}{R})"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def pq(q: float, m: str, by: str = "") -> str:
    """The ``q`` quantile of histogram ``m`` (a ``_bucket`` series) per ``by``."""
    return f"histogram_quantile({q}, sum by (le{', ' + by if by else ''}) (rate({sel(m)}{R})))"


def ratio(num: str, den: str, by: str = "") -> str:
    return f"{rate(num, by)} / {rate(den, by)}"


PCTS = (0.5, 0.9, 0.99)
M, P, V = "mooncake_master_", "mooncake_proxy_", "vllm:mooncake_core_"
EI = "exported_instance"

#: board -> (title, uid, metric used to list instances, rows of panels);
#: a panel is (title, unit, [(expr, legend), ...]) -- "stat:" before the unit makes a stat panel
BOARDS: dict[str, tuple[str, str, str, list[tuple[str, list[tuple[str, str, list[tuple[str, str]]]]]]]] = {
    "mooncake-master": ("Mooncake master", "mooncake-master", M + "keys", [
        ("Overview", [
            ("Keys", "stat:short", [(f"sum({sel(M + 'keys')})", "keys")]),
            ("Memory used", "stat:percentunit", [(f"sum({sel(M + 'used_bytes')}) / sum({sel(M + 'capacity_bytes')})",
                                                  "used")]),
            ("Clients", "stat:short", [(f"sum({sel(M + 'active_clients')})", "clients")]),
            ("Leader", "stat:short", [(sel(M + "is_leader"), "{{instance}}")]),
        ]),
        ("Capacity", [
            ("Memory used / capacity", "bytes", [(f"sum({sel(M + 'used_bytes')})", "used"),
                                                 (f"sum({sel(M + 'capacity_bytes')})", "capacity")]),
            ("Used per segment", "bytes", [(sel(M + "segment_used_bytes"), "{{segment}}")]),
            ("Segment usage", "percentunit", [(f"{sel(M + 'segment_used_bytes')} / "
                                               f"{sel(M + 'segment_capacity_bytes')}", "{{segment}}")]),
            ("SSD tier", "bytes", [(sel(M + "disk_used_bytes"), "used")]),
        ]),
        ("Traffic", [
            ("Puts and gets", "ops", [(rate(M + "puts_total"), "puts"), (rate(M + "hits_total"), "gets (hit)"),
                                      (rate(M + "misses_total"), "gets (miss)")]),
            ("Hit ratio", "percentunit", [(f"{rate(M + 'hits_total')} / ({rate(M + 'hits_total')} + "
                                           f"{rate(M + 'misses_total')})", "hit ratio")]),
            ("Evictions and refusals", "ops", [
                (rate(M + "evictions_total"), "evictions"), (rate(M + "disk_evictions_total"), "SSD evictions"),
                (rate(M + "lease_refusals_total"), "lease refusals (-706)"),
                (rate(M + "no_space_total"), "no space (-200)"),
                (rate(M + "put_conflicts_total"), "put conflicts (-705)")]),
            ("In flight, offloads, takeovers", "short", [
                (f"sum({sel(M + 'puts_in_flight')})", "puts in flight"),
                (f"sum({sel(M + 'offloads_in_flight')})", "offloads in flight"),
                (rate(M + "offloads_total"), "offloads/s"), (rate(M + "takeovers_total"), "put takeovers/s"),
                (rate(M + "expired_clients_total"), "clients expired/s")]),
        ]),
        ("RPC", [
            ("RPC rate by method", "reqps", [(rate(M + "rpc_seconds_count", "method"), "{{method}}")]),
            ("RPC p99 by method", "s", [(pq(0.99, M + "rpc_seconds_bucket", "method"), "{{method}}")]),
            ("RPC p50 by method", "s", [(pq(0.5, M + "rpc_seconds_bucket", "method"), "{{method}}")]),
        ]),
    ]),
    "mooncake-store-client": ("Mooncake store clients", "mooncake-store-client", "mooncake_store_client_ops_total", [
        ("Operations", [
            ("Operations by op", "ops", [(rate("mooncake_store_client_ops_total", "op"), "{{op}}")]),
            ("Failures by code", "ops", [(rate("mooncake_store_client_ops_total", "op, result", ', result!="ok"'),
                                          "{{op}} {{result}}")]),
            ("Payload bytes by op", "Bps", [(rate("mooncake_store_client_bytes_total", "op"), "{{op}}")]),
        ]),
        ("Latency", [
            (f"p{int(q * 100)} by op", "s", [(pq(q, "mooncake_store_client_latency_seconds_bucket", "op"), "{{op}}")])
            for q in PCTS
        ]),
    ]),
    "mooncake-transfer-engine": ("Mooncake Transfer Engine", "mooncake-transfer-engine", "mooncake_te_bytes_total", [
        ("Throughput", [
            ("Bytes/s by transport", "Bps", [(rate("mooncake_te_bytes_total", "transport, op"),
                                              "{{transport}} {{op}}")]),
            ("Requests/s by transport", "reqps", [(rate("mooncake_te_requests_total", "transport, op"),
                                                   "{{transport}} {{op}}")]),
            ("Served to peers", "Bps", [(rate("mooncake_te_served_bytes_total", "op"), "{{op}}")]),
        ]),
        ("Errors and latency", [
            ("Failed requests", "reqps", [(rate("mooncake_te_errors_total", "transport, op"), "{{transport}} {{op}}")]),
            ("Refused peer requests", "reqps", [(rate("mooncake_te_refused_total", "reason"), "{{reason}}")]),
            ("Batch p99", "s", [(pq(0.99, "mooncake_te_batch_seconds_bucket", "transport"), "{{transport}}")]),
        ]),
    ]),
    "mooncake-proxy": ("Mooncake proxy", "mooncake-proxy", P + "requests_total", [
        ("Requests", [
            ("Requests/s by status", "reqps", [(rate(P + "requests_total", "status"), "{{status}}")]),
            ("Rejections (429 SLO, 503 no instance)", "reqps", [(rate(P + "rejections_total", "reason"),
                                                                 "{{reason}}")]),
            ("Upstream errors", "reqps", [(rate(P + "upstream_errors_total", f"{EI}, kind"),
                                           f"{{{{{EI}}}}} {{{{kind}}}}")]),
            ("Hand-offs without KV (decode recomputes)", "reqps",
             [(rate(P + "decode_recomputes_total", "prefill, reason"), "{{prefill}} {{reason}}")]),
        ]),
        ("Latency", [
            ("TTFT", "s", [(pq(q, P + "ttft_seconds_bucket"), f"p{int(q * 100)}") for q in PCTS]),
            ("TBT", "s", [(pq(q, P + "tbt_seconds_bucket"), f"p{int(q * 100)}") for q in PCTS]),
            ("End to end p99", "s", [(pq(0.99, P + "e2e_seconds_bucket", "route"), "{{route}}")]),
        ]),
        ("Instances", [
            ("Healthy", "short", [(sel(P + "instance_healthy"), f"{{{{role}}}} {{{{{EI}}}}}")]),
            ("In flight", "short", [(sel(P + "instance_in_flight"), f"{{{{role}}}} {{{{{EI}}}}}")]),
            ("Prefill queue (tokens)", "short", [(sel(P + "prefill_queued_tokens"), f"{{{{{EI}}}}}")]),
            ("Decode running", "short", [(sel(P + "decode_running"), f"{{{{{EI}}}}}")]),
        ]),
        ("Scheduler", [
            ("Decisions by pair", "ops", [(rate(P + "scheduler_decisions_total", "prefill, decode"),
                                           "{{prefill}} -> {{decode}}")]),
            ("Prefix-cache hit ratio by prefill", "percentunit", [
                (ratio(P + "prefill_cached_blocks_total", P + "prefill_prompt_blocks_total", EI), f"{{{{{EI}}}}}")]),
            ("KV events applied", "ops", [(rate(P + "kv_events_total", "type"), "{{type}}")]),
        ]),
    ]),
    # vLLM's own /metrics: our connectors' figures through vLLM's KV connector stats hook (docs/vllm.md)
    "mooncake-vllm": ("Mooncake vLLM connectors", "mooncake-vllm", "vllm:num_requests_running", [
        ("P2P hand-off (MooncakeCoreConnector)", [
            ("KV pulled by decodes", "Bps", [(rate(V + "kv_pulled_bytes_total", "instance"), "{{instance}}")]),
            ("Pull latency", "s", [(pq(q, V + "kv_pull_seconds_bucket"), f"p{int(q * 100)}") for q in PCTS]),
            ("Failed pulls by reason", "ops", [(rate(V + "kv_failed_pulls_total", "reason"), "{{reason}}")]),
            ("Prefill: KV held for the decode", "s", [(pq(q, V + "kv_hold_seconds_bucket"), f"p{int(q * 100)}")
                                                      for q in (0.5, 0.99)]),
            ("Prefill: leases expired", "ops", [(rate(V + "kv_leases_expired_total", "instance"), "{{instance}}")]),
            ("Scheduler: hand-offs", "ops", [(rate(V + "kv_remote_requests_total"), "decode: remote prefills"),
                                             (rate(V + "kv_remote_local_hits_total"), "decode: fully cached here"),
                                             (rate(V + "kv_handoff_requests_total"), "prefill: held for a decode")]),
            ("Scheduler: decode wait for KV", "s", [(pq(q, V + "kv_remote_wait_seconds_bucket"), f"p{int(q * 100)}")
                                                    for q in (0.5, 0.99)]),
        ]),
        ("Store (MooncakeCoreStoreConnector)", [
            ("Store hit ratio (blocks)", "percentunit", [
                (f"{rate(V + 'store_hit_blocks_total')} / ({rate(V + 'store_hit_blocks_total')} + "
                 f"{rate(V + 'store_miss_blocks_total')})", "hit ratio")]),
            ("Loaded and saved", "Bps", [(rate(V + "store_loaded_bytes_total"), "loaded"),
                                         (rate(V + "store_saved_bytes_total"), "saved")]),
            ("Load and save p99", "s", [(pq(0.99, V + "store_load_seconds_bucket"), "load (per step)"),
                                        (pq(0.99, V + "store_save_seconds_bucket"), "save (per request)")]),
            ("Failed blocks", "ops", [(rate(V + "store_failed_blocks_total", "reason"), "{{reason}}")]),
        ]),
    ]),
}


def panel(pid: int, title: str, unit: str, targets: list[tuple[str, str]], x: int, y: int, w: int) -> dict:
    kind, _, unit = unit.rpartition(":")
    stat = kind == "stat"
    return {
        "id": pid, "type": "stat" if stat else "timeseries", "title": title, "datasource": DS,
        "gridPos": {"h": 4 if stat else 8, "w": w, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}} if not stat else {"reduceOptions": {
            "calcs": ["lastNotNull"]}},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": e, "legendFormat": lg}
                    for i, (e, lg) in enumerate(targets)],
    }


def board(title: str, uid: str, instance_metric: str, rows: list) -> dict:
    panels: list[dict] = []
    y, pid = 0, 1
    for row_title, row_panels in rows:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        pid, y = pid + 1, y + 1
        w = max(6, 24 // len(row_panels))
        x = 0
        for title_, unit, targets in row_panels:
            if x + w > 24:
                x, y = 0, y + 8
            p = panel(pid, title_, unit, targets, x, y, w)
            panels.append(p)
            pid, x = pid + 1, x + w
        y += max(p["gridPos"]["h"] for p in panels[-len(row_panels):])
    return {
        "title": title, "uid": uid, "schemaVersion": 39, "version": 1, "editable": True,
        "tags": ["mooncake"], "timezone": "browser", "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus"},
            {"name": "instance", "label": "Instance", "type": "query", "datasource": DS,
             "query": {"query": f"label_values({instance_metric}, instance)", "refId": "instances"},
             "definition": f"label_values({instance_metric}, instance)",
             "refresh": 2, "includeAll": True, "multi": True, "current": {"text": "All", "value": "$__all"}},
        ]},
        "panels": panels,
    }


def render() -> dict[Path, str]:
    return {HERE / f"{name}.json": json.dumps(board(*spec), indent=2) + "\n" for name, spec in BOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only check that the JSON files are up to date")
    args = ap.parse_args(argv)
    stale = []
    for path, text in render().items():
        if path.exists() and path.read_text() == text:
            continue
        if args.check:
            stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python3 deploy/grafana/generate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
