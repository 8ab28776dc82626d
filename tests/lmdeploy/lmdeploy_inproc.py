"""LMDeploy's CacheEngine PD methods driving both backends in one process; print what happened.

Run by test_lmdeploy_backend.py as ``unshare -n <venv python> lmdeploy_inproc.py`` with
``MC_FORCE_TCP=1`` (every transfer crosses a socket, even to this process). Two real
``CacheEngine`` objects over CPU pools (lmdeploy_node.make_cache_engine) are connected the way
``PDConnectionPool.conn_worker`` does it (p2p_initialize on both, then p2p_connect on both) and
migrate with ``CacheEngine.migrate``. Facts, no verdicts:

* ours: 8 connection retries of one pair (links, engines, registrations), a migration, the errors
  of a bad assignment / an unknown or unconnected peer, the event loop's longest stall during a
  large migration, and what ``p2p_drop_connect`` releases;
* LMDeploy's own ``MooncakeBackend`` on our engine: its refusals without ``ibv_devices`` and without
  a default route, then (stand-in ``ibv_devices``, a route through lo) how many engines 8 retries
  leave behind, the event-loop stall of one migration, and whether ``LMDEPLOY_USE_ASYNC_MIGRATION``
  mode returns.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))  # fake_ibv

from mooncake_lab.lmdeploy_node import make_cache_engine  # noqa: E402  (imports the connector, then LMDeploy; the harness's PYTHONPATH shim)

import lmdeploy.pytorch.disagg.backend.mooncake as theirs_mod  # noqa: E402
from lmdeploy.pytorch.disagg.config import DistServeEngineConfig, EngineRole  # noqa: E402
from lmdeploy.pytorch.disagg.conn.protocol import DistServeInitRequest, MigrationProtocol  # noqa: E402
from lmdeploy.pytorch.disagg.messages import AssignmentInstruct, MigrationAssignment, MigrationExecutionBatch  # noqa: E402

from mooncake_connectors.lmdeploy.backend import MigrationError, _kv_location  # noqa: E402
from mooncake_connectors.lmdeploy.process_engine import PROCESS_ENGINE  # noqa: E402
from mooncake_core.engine import TransferEngine  # noqa: E402

P_URL, D_URL = "http://127.0.0.1:23333", "http://127.0.0.1:23334"
LAYERS, BLOCKS = 8, 64


def cfg(blocks: int) -> DistServeEngineConfig:
    return DistServeEngineConfig(tp_size=1, ep_size=1, dp_size=1, pp_size=None, dp_rank=0, block_size=16,
                                 num_cpu_blocks=0, num_gpu_blocks=blocks)


def connect(p_ce: Any, d_ce: Any) -> None:
    """What PDConnectionPool.conn_worker asks of both engines (without the HTTP in between)."""
    def init(local: str, remote: str) -> DistServeInitRequest:
        return DistServeInitRequest(protocol=MigrationProtocol.RDMA, local_engine_id=local, remote_engine_id=remote,
                                    local_engine_config=cfg(BLOCKS), remote_engine_config=cfg(BLOCKS))
    p_kv = p_ce.p2p_initialize(init(P_URL, D_URL))
    d_kv = d_ce.p2p_initialize(init(D_URL, P_URL))
    p_ce.p2p_connect(D_URL, [p_kv.model_validate_json(d_kv.model_dump_json())])
    d_ce.p2p_connect(P_URL, [d_kv.model_validate_json(p_kv.model_dump_json())])


def live_engines() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, TransferEngine) and o.get_rpc_port() > 0)


async def migrate_measuring_loop(d_ce: Any, pairs: list[tuple[int, int]], timeout: float) -> dict[str, Any]:
    """Run one migration; meanwhile a 5 ms ticker records the longest stall of the event loop."""
    stall = [0.0]
    stop = asyncio.Event()

    async def ticker() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            stall[0] = max(stall[0], now - last - 0.005)
            last = now

    t = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    t0 = time.monotonic()
    outcome = "ok"
    try:
        await asyncio.wait_for(d_ce.migrate(MigrationExecutionBatch(protocol=MigrationProtocol.RDMA,
                                                                    requests=[(P_URL, pairs)])), timeout)
    except asyncio.TimeoutError:
        outcome = "no return"
    except Exception as e:  # noqa: BLE001 - reported as a fact
        outcome = f"{type(e).__name__}: {e}"
    took = time.monotonic() - t0
    stop.set()
    await t
    return {"outcome": outcome, "seconds": took, "max_loop_stall": stall[0]}


def same(p_pool: Any, d_pool: Any, pairs: list[tuple[int, int]]) -> bool:
    return all(bool((p_pool[:, p, :] == d_pool[:, d, :]).all()) for p, d in pairs)


async def ours(facts: dict[str, Any]) -> None:
    entry = 256 << 10  # 8 layers x 64 blocks x 256 KiB = 128 MiB per pool
    p_ce, p_pool = make_cache_engine(EngineRole.Prefill, LAYERS, BLOCKS, entry, 1)
    d_ce, d_pool = make_cache_engine(EngineRole.Decode, LAYERS, BLOCKS, entry, 2)
    sessions = set()
    for _ in range(8):  # the proxy retries a failed connection 8 times; each re-initializes both sides
        connect(p_ce, d_ce)
        sessions.add(d_ce.migration_backend_impl.links[P_URL].session_id)
    be = d_ce.migration_backend_impl
    facts["ours_retries"] = {"links": len(be.links), "sessions": len(sessions), "engine_users": PROCESS_ENGINE.users,
                             "registered": len(PROCESS_ENGINE.registered()), "live_engines": live_engines()}
    pairs = [(p, d) for p, d in zip(range(0, 60, 2), range(63, 3, -2))]
    before = d_pool.clone()
    r = await migrate_measuring_loop(d_ce, pairs, 60)
    untouched = [b for b in range(BLOCKS) if b not in {d for _, d in pairs}]
    r.update(exact=same(p_pool, d_pool, pairs), untouched=bool((before[:, untouched, :] == d_pool[:, untouched, :]).all()))
    facts["ours_migrate"] = r

    errs = {}
    bad = MigrationAssignment(protocol=MigrationProtocol.RDMA, remote_engine_id=P_URL, batch=[
        AssignmentInstruct(mr_key=0, target_offset=p_pool.numel() - 8, source_offset=0, length=64)])
    for name, a in (("out_of_bounds", bad),
                    ("unknown_peer", bad.model_copy(update={"remote_engine_id": "http://10.9.9.9:1"}))):
        try:
            await be.p2p_migrate(a)
            errs[name] = "no error"
        except MigrationError as e:
            errs[name] = str(e)
    be.links[P_URL].remote, saved = None, be.links[P_URL].remote
    try:
        await be.p2p_migrate(bad)
    except MigrationError as e:
        errs["not_connected"] = str(e)
    be.links[P_URL].remote = saved
    facts["ours_errors"] = errs
    facts["kv_location"] = _kv_location()

    drops = [d_ce.migration_backend_impl.p2p_drop_connect(P_URL), p_ce.migration_backend_impl.p2p_drop_connect(D_URL),
             p_ce.migration_backend_impl.p2p_drop_connect(D_URL)]
    facts["ours_drop"] = {"returns": drops, "engine": PROCESS_ENGINE.engine is not None,
                          "registered": len(PROCESS_ENGINE.registered()), "live_engines": live_engines()}


async def theirs(facts: dict[str, Any]) -> None:
    entry = 256 << 10
    p_ce, p_pool = make_cache_engine(EngineRole.Prefill, LAYERS, BLOCKS, entry, 3)
    d_ce, d_pool = make_cache_engine(EngineRole.Decode, LAYERS, BLOCKS, entry, 4)
    refusals = {}
    ip = shutil.which("ip") or "/sbin/ip"
    # PATH without a real ibv_devices, should this host have rdma-core tools
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if d and not os.path.exists(os.path.join(d, "ibv_devices")))

    def attempt(name: str) -> None:
        p_ce.migration_backend_impl = theirs_mod.MooncakeBackend()
        try:
            connect(p_ce, d_ce)
            refusals[name] = "connected"
        except Exception as e:  # noqa: BLE001 - reported as a fact
            refusals[name] = f"{type(e).__name__}: {e}"

    os.environ["PATH"] = f"{os.path.join(HERE, 'fake_ibv')}:{path}"
    attempt("no_route")  # a NIC listed, but no default route (this namespace has only lo)
    subprocess.run([ip, "route", "add", "default", "dev", "lo", "src", "127.0.0.1"], check=True)
    os.environ["PATH"] = path
    attempt("no_ibv_devices")  # a route now, but no ibv_devices
    os.environ["PATH"] = f"{os.path.join(HERE, 'fake_ibv')}:{path}"
    facts["theirs_refusals"] = refusals
    base = live_engines()
    p_ce.migration_backend_impl, d_ce.migration_backend_impl = theirs_mod.MooncakeBackend(), theirs_mod.MooncakeBackend()
    for _ in range(8):
        connect(p_ce, d_ce)
    facts["theirs_retries"] = {"links": len(d_ce.migration_backend_impl.links), "live_engines": live_engines() - base}
    pairs = [(p, d) for p, d in zip(range(0, 60, 2), range(63, 3, -2))]
    r = await migrate_measuring_loop(d_ce, pairs, 60)
    r["exact"] = same(p_pool, d_pool, pairs)
    facts["theirs_migrate"] = r
    theirs_mod.LMDEPLOY_USE_ASYNC_MIGRATION = "1"  # as if the variable had been set at import
    facts["theirs_async"] = await migrate_measuring_loop(d_ce, pairs[:2], 3)


def main() -> int:
    facts: dict[str, Any] = {"force_tcp": os.environ.get("MC_FORCE_TCP")}
    subprocess.run([shutil.which("ip") or "/sbin/ip", "link", "set", "lo", "up"], check=True)
    asyncio.run(ours(facts))
    asyncio.run(theirs(facts))
    print(json.dumps({"facts": facts}), flush=True)
    os._exit(0)  # LMDeploy's backend leaves engines and a never-resolved future behind; do not wait on them


if __name__ == "__main__":
    sys.exit(main())
