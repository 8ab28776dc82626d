#!/usr/bin/env python3
"""Chaos run of Mooncake Store: faults injected at random under a checked put/upsert/get/remove load.

A ``mooncake_master`` (or, with ``--ha``, two masters on a real etcd cluster), several store
clients that contribute segments and run load threads through the public
``MooncakeDistributedStore`` API, and a nemesis that kills, pauses and cuts them off (see
mooncake_lab/chaos/nemesis.py for the kinds; the network ones run the clients in network namespaces
joined by veth pairs on a bridge, where this machine allows it -- probed at start, and a
kind the kernel refuses is skipped with its reason). Every value is self-describing, every
operation logged; afterwards the checker classifies every read (latest / in flight / stale /
miss / error / foreign bytes), counts hangs, and measures recovery after each fault.

    python3 -m bench.robustness.chaos --duration 60                  # ours, single master
    python3 -m bench.robustness.chaos --duration 60 --ha             # ours, HA pair on 3 etcd members
    python3 -m bench.robustness.chaos --duration 60 --ha --ha-backend redis   # HA pair electing on Redis
    python3 -m bench.robustness.chaos --impl both --duration 600     # ours, then the original 0.3.13
    python3 -m bench.robustness.chaos --json out.json                # the full report as JSON too

Exit code: 0 clean; 1 when this project (``ours``) served foreign bytes or hung -- the
original's figures are reported, not judged; 2 when the run itself could not be set up.
Network namespaces and tc need root (CAP_NET_ADMIN); without them the network faults are
skipped (logged and listed in the report) and the clients share the loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

from mooncake_lab.chaos import checker, netlab, report
from mooncake_lab.chaos.cluster import Cluster, ClusterConfig, Impl
from mooncake_lab.chaos.nemesis import ALL_KINDS, Nemesis, NemesisConfig, enabled_kinds
from mooncake_lab.chaos.oplog import read_records
from mooncake_lab.chaos.stallwatch import StallWatch
from mooncake_core.utils.log import get_logger, setup_logging

log = get_logger("mooncake.chaos")
S = 1_000_000_000


def _span(text: str, what: str) -> tuple[float, float]:
    try:
        a, _, b = text.partition(",")
        lo, hi = float(a), float(b or a)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: expected 'MIN,MAX' seconds, got {text!r}") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"{what}: need 0 <= MIN <= MAX, got {text!r}")
    return lo, hi


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("what to run")
    g.add_argument("--impl", choices=["ours", "ref", "both"], default="ours",
                   help="this project, the original Mooncake 0.3.13 (from --ref-venv), or both in turn")
    g.add_argument("--ref-venv", default="/work/venvs/mooncake-ref",
                   help="venv with PyPI mooncake-transfer-engine-non-cuda==0.3.13 (its python and mooncake_master)")
    g.add_argument("--duration", type=float, default=60.0, help="seconds of load, warm-up included")
    g.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the first fault")
    g.add_argument("--ha", action="store_true", help="two masters with --enable_ha on an etcd cluster")
    g.add_argument("--etcd-members", type=int, default=3, help="etcd cluster size with --ha")
    g.add_argument("--ha-backend", choices=["etcd", "redis"], default="etcd",
                   help="with --ha: where the masters elect their leader (redis: one redis-server, which also "
                        "holds the TE metadata; ours only)")
    g.add_argument("--clients", type=int, default=4, help="store client processes (each contributes a segment)")
    g.add_argument("--threads", type=int, default=2, help="load threads per client")
    g.add_argument("--seed", type=int, default=1, help="seed of the nemesis and the workload")
    g = p.add_argument_group("workload")
    g.add_argument("--keys", type=int, default=1000, help="key space shared by all clients")
    g.add_argument("--min-value", type=int, default=1 << 10, help="smallest value, bytes")
    g.add_argument("--max-value", type=int, default=256 << 10, help="largest value, bytes (sizes log-uniform)")
    g.add_argument("--segment", type=int, default=32 << 20, help="bytes each client contributes")
    g.add_argument("--local-buffer", type=int, default=16 << 20, help="local_buffer_size of each client")
    g.add_argument("--mix", default="", help="op weights, e.g. get_into=40,get=10,upsert=25,put=15,remove=10")
    g.add_argument("--rate", type=float, default=0.0, help="ops/s per load thread (0: as fast as possible)")
    g.add_argument("--transport", choices=["tcp", "auto"], default="tcp",
                   help="tcp: MC_FORCE_TCP=1 for ours so every byte crosses the (faulty) network; "
                        "auto: let ours pick shared memory between local processes")
    g.add_argument("--metadata", choices=["auto", "master", "etcd", "redis", "p2p"], default="auto",
                   help="TE metadata: auto = the master's HTTP server (single master) or the HA backend (--ha)")
    g = p.add_argument_group("timeouts")
    g.add_argument("--lease-ttl-ms", type=int, default=1000, help="--default_kv_lease_ttl of the master(s)")
    g.add_argument("--client-ttl", type=int, default=5, help="--client_ttl of the master(s), seconds")
    g.add_argument("--transfer-timeout", type=float, default=10.0, help="MC_TRANSFER_TIMEOUT of the clients, s")
    g.add_argument("--rpc-timeout", type=float, default=5.0, help="MC_STORE_RPC_TIMEOUT of our clients, s")
    g.add_argument("--hang-after", type=float, default=0.0,
                   help="an op longer than this (own SIGSTOP time excluded) is a hang; "
                        "default transfer timeout + 2 x RPC timeout")
    g = p.add_argument_group("faults")
    g.add_argument("--faults", default="all",
                   help=f"comma-separated kinds, 'all' or 'none' (kinds: {', '.join(ALL_KINDS)})")
    g.add_argument("--net", choices=["auto", "netns", "none"], default="auto",
                   help="netns: clients in network namespaces (required); auto: when the machine allows; "
                        "none: all on loopback, no network faults")
    g.add_argument("--gap", type=lambda s: _span(s, "--gap"), default=(1.0, 3.0),
                   help="MIN,MAX seconds between a fault's recovery and the next fault")
    g.add_argument("--pause", type=lambda s: _span(s, "--pause"), default=(0.5, 12.0),
                   help="MIN,MAX seconds a client stays SIGSTOPped (beyond --client-ttl and "
                        "--transfer-timeout now and then)")
    g.add_argument("--master-pause", type=lambda s: _span(s, "--master-pause"), default=(0.5, 4.0),
                   help="MIN,MAX seconds a master stays SIGSTOPped")
    g.add_argument("--net-fault", type=lambda s: _span(s, "--net-fault"), default=(1.0, 12.0),
                   help="MIN,MAX seconds a network fault lasts (beyond --transfer-timeout now and then)")
    g = p.add_argument_group("output")
    g.add_argument("--json", default="", help="write the full report (every run) to this file")
    g.add_argument("--workdir", default="", help="keep logs and op logs here (default: a temp dir, "
                                                 "removed after a clean run)")
    g.add_argument("--recheck", default="", metavar="DIR",
                   help="only run the checker again on a kept run (DIR = <workdir>/<impl>) and print its JSON")
    g.add_argument("--progress-every", type=float, default=5.0, help="seconds between progress lines")
    return p


def _progress(cluster: Cluster, nem: Nemesis, t0: int, duration: float, every: float,
              stop: threading.Event, impl: str) -> None:
    last_ops, last_t = 0, time.monotonic()
    while not stop.wait(every):
        ops = sum(c.progress.get("p", 0) for c in cluster.clients)
        errs = sum(c.progress.get("e", 0) for c in cluster.clients)
        now = time.monotonic()
        rate = max(0, ops - last_ops) / max(1e-9, now - last_t)
        last_ops, last_t = ops, now
        el = (time.monotonic_ns() - t0) / S
        print(f"[{impl} {el:5.0f}/{duration:.0f}s] ops {ops} (~{rate:.0f}/s, counters reset on restart), "
              f"errors {errs}, faults {len(nem.rec.faults)}" + (f", now: {nem.current}" if nem.current else ""),
              flush=True)


def run_one(impl: Impl, args: argparse.Namespace, workdir: str, caps: netlab.Capabilities | None) -> dict[str, Any]:
    requested = list(ALL_KINDS) if args.faults == "all" else (
        [] if args.faults == "none" else [k.strip() for k in args.faults.split(",") if k.strip()])
    kinds, skipped = enabled_kinds(requested, args.ha, caps if caps and caps.netns else None, args.ha_backend)
    if caps and not caps.netns:
        skipped.update({k: caps.reasons[k] for k in requested if k in netlab.NET_KINDS})
    for k, why in skipped.items():
        log.warning("fault kind skipped", extra={"kind": k, "why": why})
    ccfg = ClusterConfig(clients=args.clients, threads=args.threads, ha=args.ha, ha_backend=args.ha_backend,
                         etcd_members=args.etcd_members,
                         segment=args.segment, local_buffer=args.local_buffer, keys=args.keys,
                         min_value=args.min_value, max_value=args.max_value, mix=args.mix, rate=args.rate, seed=args.seed,
                         lease_ttl_ms=args.lease_ttl_ms, client_ttl_s=args.client_ttl,
                         transfer_timeout_s=args.transfer_timeout, rpc_timeout_s=args.rpc_timeout,
                         force_tcp=args.transport == "tcp", metadata=args.metadata)
    hang_after = args.hang_after or (args.transfer_timeout + 2 * args.rpc_timeout)
    ncfg = NemesisConfig(kinds=kinds, gap_s=args.gap, pause_s=args.pause, master_pause_s=args.master_pause,
                         net_s=args.net_fault)
    lab = netlab.NetLab(args.clients, caps) if caps and caps.netns else None
    print(f"== {impl.name}: {args.duration:.0f}s, {args.clients} clients x {args.threads} threads, "
          f"{('HA (2 masters, %d etcd)' % args.etcd_members if args.ha_backend == 'etcd' else 'HA (2 masters, Redis)') if args.ha else 'single master'}, "
          f"net {'netns' if lab else 'loopback'}; faults: {', '.join(kinds) or 'none'} (logs in {workdir})",
          flush=True)
    t_setup = time.monotonic()
    if lab:
        lab.__enter__()
    cluster = Cluster(impl, ccfg, workdir, host_ip=lab.host_ip if lab else "127.0.0.1",
                      client_ips=lab.ips if lab else None, exec_prefix=lab.exec_prefix if lab else None)
    nem = Nemesis(cluster, lab, ncfg, random.Random(args.seed))
    stop = threading.Event()
    stalls = StallWatch().start()
    try:
        cluster.start()
        setup_s = time.monotonic() - t_setup
        t0 = time.monotonic_ns()
        prog = threading.Thread(target=_progress, daemon=True,
                                args=(cluster, nem, t0, args.duration, args.progress_every, stop, impl.name))
        prog.start()
        time.sleep(min(args.warmup, args.duration))
        cluster.sample()
        t_before = time.monotonic_ns()
        if kinds:
            nem.run(t0 + int(args.duration * S), stop.is_set)
        left = (t0 + int(args.duration * S) - time.monotonic_ns()) / S
        if left > 0:
            time.sleep(left)
        if lab:
            lab.heal_all()
        time.sleep(1.0)
        cluster.sample()
        t_load_end = time.monotonic_ns()
        stop.set()
        cluster.stop_clients()
        t_end = time.monotonic_ns()
    finally:
        stop.set()
        stalls.stop()
        cluster.stop()
        if lab:
            lab.__exit__(None, None, None)

    deaths = {(c.index, life.incarnation): life.t_end or t_end for c in cluster.clients for life in c.lives}
    # when a master's state was lost: the nemesis's kills/pauses that changed the master, the
    # supervisor's view of exits, and (ours) the moment a leader stopped serving
    failures = (list(nem.rec.master_failures) + [e["t"] for e in cluster.events if e["slot"].startswith("master")]
                + cluster.leader_losses)
    tl = checker.Timeline(t_start=t0, t_end=t_end, faults=nem.rec.faults, deaths=deaths,
                          pauses=nem.rec.pauses, deaf=nem.rec.deaf, master_failures=sorted(failures),
                          master_failure_spans=sorted(cluster.leader_loss_spans),
                          stalls=stalls.spans)
    cfg = checker.Config(hang_after_ns=int(hang_after * S), transfer_timeout_ns=int(args.transfer_timeout * S))
    with open(os.path.join(workdir, "timeline.json"), "w") as f:
        json.dump({"timeline": checker.timeline_to_dict(tl), "config": vars(cfg)}, f)
    t_chk = time.monotonic()
    ops = checker.load_ops(read_records(cluster.oplog_dir))
    result = checker.check(ops, tl, cfg)
    lives = {s.name: s.lives for s in cluster.etcd + cluster.masters + cluster.clients}
    faults_by_kind: dict[str, int] = {}
    for f in nem.rec.faults:
        faults_by_kind[f.kind] = faults_by_kind.get(f.kind, 0) + 1
    return {
        "impl": impl.name,
        "run": {"t0_ns": t0, "duration_s": args.duration, "load_s": round((t_load_end - t0) / S, 1), "setup_s": round(setup_s, 1),
                "check_s": round(time.monotonic() - t_chk, 1), "ha": args.ha, "clients": args.clients,
                "threads": args.threads, "keys": args.keys, "seed": args.seed, "hang_after_s": hang_after,
                "transfer_timeout_s": args.transfer_timeout, "net": "netns" if lab else "loopback",
                "metadata": cluster.metadata.split(":")[0] if "://" in cluster.metadata else cluster.metadata,
                "load_average": _loadavg(), "harness_stalls": stalls.summary()},
        "faults_enabled": kinds,
        "faults_skipped": skipped,
        "faults": faults_by_kind,
        "fault_errors": nem.rec.errors,
        "check": result,
        "procs": report.process_summary(cluster.samples, lives, t_before, t_load_end, cluster.events, t0),
    }


def _loadavg() -> list[float]:
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return []


def recheck(workdir: str) -> int:
    """Run the checker again on a kept run directory (op logs + timeline.json)."""
    with open(os.path.join(workdir, "timeline.json")) as f:
        saved = json.load(f)
    ops = checker.load_ops(read_records(os.path.join(workdir, "ops")))
    result = checker.check(ops, checker.timeline_from_dict(saved["timeline"]), checker.Config(**saved["config"]))
    print(json.dumps(result, indent=1))
    return 1 if result["foreign_bytes"] or result["hangs"] else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(os.environ.get("MC_LOG_LEVEL", "WARNING"))
    if args.recheck:
        return recheck(args.recheck)
    impls: list[Impl] = []
    try:
        if args.impl in ("ours", "both"):
            impls.append(Impl.ours())
        if args.impl in ("ref", "both"):
            impls.append(Impl.ref(args.ref_venv))
    except FileNotFoundError as e:
        print(f"chaos: {e}", file=sys.stderr)
        return 2
    caps = None
    if args.net != "none":
        removed = netlab.cleanup_stale()
        if removed:
            print(f"removed namespaces/links left by earlier runs: {', '.join(removed)}", flush=True)
        caps = netlab.probe()
        if not caps.netns:
            why = next(iter(caps.reasons.values()), "unknown")
            if args.net == "netns":
                print(f"chaos: --net netns: {why}", file=sys.stderr)
                return 2
            print(f"network faults skipped: {why}", flush=True)
        else:
            print(f"network faults allowed here: {', '.join(caps.allowed)}"
                  + "".join(f"; {k} skipped: {v}" for k, v in caps.reasons.items()), flush=True)
    base = args.workdir or tempfile.mkdtemp(prefix="mc-chaos-")
    runs = []
    try:
        for impl in impls:
            wd = os.path.join(base, impl.name)
            os.makedirs(wd, exist_ok=True)
            try:
                runs.append(run_one(impl, args, wd, caps))
            except (RuntimeError, TimeoutError, OSError, ValueError, netlab.NetError) as e:
                print(f"chaos: the {impl.name} run could not be set up: {e} (logs in {wd})", file=sys.stderr)
                if impl.name == "ours":
                    return 2
    finally:
        pass
    print()
    print(report.render(runs))
    for r in runs:
        c = r["check"]
        for what, items in (("foreign", c["foreign"]), ("stale", c["stale"]), ("hang", c["hang_list"])):
            for it in items[:10]:
                print(f"  {r['impl']} {what}: {it}")
        if r["fault_errors"]:
            print(f"  {r['impl']} faults that could not be injected: {r['fault_errors'][:5]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "net": caps.as_dict() if caps else None,
                       "argv": sys.argv[1:] if argv is None else argv}, f, indent=1)
        print(f"report written to {args.json}")
    ours = next((r for r in runs if r["impl"] == "ours"), None)
    bad = bool(ours and (ours["check"]["foreign_bytes"] or ours["check"]["hangs"]))
    if not bad and not args.workdir:
        shutil.rmtree(base, ignore_errors=True)
    elif bad:
        print(f"FAILED: ours served {ours['check']['foreign_bytes']} foreign reads and had "
              f"{ours['check']['hangs']} hangs (logs kept in {base})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
