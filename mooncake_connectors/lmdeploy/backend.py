"""``MooncakeCoreBackend``: LMDeploy's ``Mooncake`` migration backend on our Transfer Engine.

Targets LMDeploy 0.18.0, ``lmdeploy/pytorch/disagg/backend/base.py`` ``MigrationBackendImpl``
(``p2p_initialize``, ``register_memory_region``, ``endpoint_info``, ``p2p_connect``,
``async p2p_migrate``, ``store``, ``load``) and the attribute ``CacheEngine.p2p_connect`` reads
(``links[remote_engine_id].remote_engine_config.num_gpu_blocks``). Registered under the name
``Mooncake`` by ``mooncake_connectors.lmdeploy.register`` (see that module for why and how).

What it does differently from LMDeploy's own ``MooncakeBackend`` (same interface, same
``endpoint_info`` fields, so either side of a pair may run either backend):

* **Any host.** No ``ibv_devices``, no route to a public address: the engine listens on
  ``MOONCAKE_LOCAL_HOSTNAME`` or the host of the engine's own DistServe URL (``endpoint.local_host``)
  and picks the transport per peer itself (same host: cross-memory attach; else tcp).
* **The migration protocol is honoured.** ``--migration-protocol RDMA`` starts the engine with
  protocol ``rdma`` (one-sided over UCX) on ``MOONCAKE_LMDEPLOY_DEVICE`` as given, else on the
  RDMA device LMDeploy's own backend would pick (rank modulo the device count); on a host with
  no RDMA device (where LMDeploy's backend refuses to start) with tcp and a warning. ``TCP``
  (and ``NVLINK``: CUDA IPC is the engine's own choice on one host) starts it with tcp
  (``process_engine.engine_transport``).
* **One batched read per migration.** The whole assignment (one entry per layer per block) is
  validated and merged into contiguous ranges (``plan.build_plan``) and moved with one
  ``batch_transfer_sync_read``, instead of one blocking ``transfer_sync_read`` per entry.
* **Never blocks LMDeploy's event loop, never hangs.** The transfer runs on a worker thread and
  ``p2p_migrate`` awaits it, whatever ``LMDEPLOY_USE_ASYNC_MIGRATION`` says (LMDeploy's backend
  either blocks the loop, or with that variable set awaits a future nothing ever resolves).
* **A deadline on every migration** (the engine's ``MC_TRANSFER_TIMEOUT``, default 30 s, plus 1 s
  per GiB; our wait gives up 5 s after that even if the engine did not) and a ``MigrationError``
  that names the peer (its DistServe URL and engine session) and the engine's reason.
* **One engine per process** (``process_engine.PROCESS_ENGINE``), however many peers and
  connection retries; a link re-initialized for the same peer replaces the old one, and the
  engine is closed with the last link (``p2p_drop_connect``).

KV pool location: LMDeploy migrates its device pools. On a host where ``torch.cuda.is_available()``
the pools are registered as ``cuda:N`` (the current device), which the engine's cuda plugin serves
(CUDA IPC on one host, pinned staging over tcp: docs/gpu.md); without cuda-python the engine
refuses them with a clear error at ``p2p_initialize`` rather than reading device pointers as host
memory. CPU pools (tests, CPU builds) are ``cpu:0``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lmdeploy.pytorch.disagg.backend.base import MigrationBackendImpl

from mooncake_connectors.lmdeploy.endpoint import Endpoint, EndpointError, local_host, parse_endpoint
from mooncake_connectors.lmdeploy.plan import PlanError, RegionInfo, TransferPlan, build_plan
from mooncake_connectors.lmdeploy.process_engine import (PROCESS_ENGINE, EngineTransport, ProcessEngine,
                                                         engine_transport)
from mooncake_core import envs
from mooncake_core.transfer.ucx.transport import rdma_devices
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.lmdeploy")

#: seconds our wait outlasts the engine's own deadline before giving up on a stuck transfer
WAIT_GRACE_S = 5.0
_GIB = float(1 << 30)


class MigrationError(RuntimeError):
    """A KV migration that did not happen; the message names the peer and the reason."""


def _kv_location() -> str:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return f"cuda:{torch.cuda.current_device()}"
    except Exception:  # a broken CUDA install: treat as CPU, the engine checks bounds anyway
        pass
    return "cpu:0"


class MooncakeLink:
    """State of one prefill<->decode link, as LMDeploy's ``MooncakeMigrationManagement`` keeps it.

    Attribute names follow LMDeploy's class where they mean the same thing (``rank``,
    ``local_engine_config``, ``remote_engine_config``, ``local_engine_id``, ``remote_engine_id``,
    ``local_kv_table``, ``remote_kv_table``, ``remote_url``), so LMDeploy code and logs read alike.
    """

    def __init__(self, init_request: Any, holder: ProcessEngine):
        self.rank = init_request.rank
        self.local_engine_id: str = init_request.local_engine_id
        self.remote_engine_id: str = init_request.remote_engine_id
        self.local_engine_config = init_request.local_engine_config
        self.remote_engine_config = init_request.remote_engine_config
        self.protocol = init_request.protocol
        host, why = local_host(self.local_engine_id)
        self._holder = holder
        self.engine = holder.acquire(host, self._transport(init_request))
        self.session_id: str = self.engine.get_local_segment_name()
        self.local_kv_table: dict[str, RegionInfo] = {}
        self.remote: Endpoint | None = None
        self._lock = threading.Lock()
        self._busy = 0
        self._released = False
        self._freed = False
        log.info("lmdeploy link initialized", extra={"remote_engine_id": self.remote_engine_id,
                                                     "session_id": self.session_id, "host_from": why})

    @staticmethod
    def _transport(init_request: Any) -> EngineTransport:
        """LMDeploy's migration protocol and our device setting, as the engine takes them."""
        proto = getattr(init_request.protocol, "name", str(init_request.protocol))
        try:
            return engine_transport(proto, init_request.rank, envs.MOONCAKE_LMDEPLOY_DEVICE, sorted(rdma_devices()))
        except ValueError as e:
            raise MigrationError(str(e)) from None

    @property
    def remote_url(self) -> str:
        return self.remote.session_id if self.remote else ""

    @property
    def remote_kv_table(self) -> dict[str, RegionInfo]:
        return self.remote.mr_info if self.remote else {}

    def register(self, mr_key: int, addr: int, length: int, offset: int) -> None:
        key = str(mr_key)
        old = self.local_kv_table.pop(key, None)
        if old is not None:
            self._holder.unregister(old.addr)
        self._holder.register(addr, length, _kv_location())
        self.local_kv_table[key] = RegionInfo(addr, length, offset)

    def endpoint(self) -> Endpoint:
        return Endpoint(session_id=self.session_id, mr_info=dict(self.local_kv_table))

    # in-flight accounting: a link dropped mid-migration keeps its engine until the read returns
    def enter(self) -> bool:
        with self._lock:
            if self._released:
                return False
            self._busy += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._busy -= 1
            free = self._released and self._busy == 0
        if free:
            self._free()

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
            free = self._busy == 0
        if free:
            self._free()

    def _free(self) -> None:
        with self._lock:
            if self._freed:
                return
            self._freed = True
        for region in self.local_kv_table.values():
            self._holder.unregister(region.addr)
        self.local_kv_table = {}
        self._holder.release()
        log.info("lmdeploy link released", extra={"remote_engine_id": self.remote_engine_id})


class MooncakeCoreBackend(MigrationBackendImpl):
    """LMDeploy migration backend on ``mooncake_core`` (see module docstring)."""

    def __init__(self, holder: ProcessEngine | None = None) -> None:
        self.links: dict[str, MooncakeLink] = {}
        # a link replaced by a re-initialization, released once its successor is connected (so the
        # pool is never unregistered between the two and an in-flight read is never cut short)
        self._superseded: dict[str, MooncakeLink] = {}
        self._holder = holder or PROCESS_ENGINE
        self._pool: ThreadPoolExecutor | None = None
        if os.environ.get("LMDEPLOY_USE_ASYNC_MIGRATION"):
            log.info("LMDEPLOY_USE_ASYNC_MIGRATION is set; this backend never blocks the event loop "
                     "either way, so it changes nothing here")

    # ------------------------------------------------------------------ connection set-up
    def p2p_initialize(self, init_request: Any) -> None:
        """Create (or replace, on a proxy retry) the link to ``init_request.remote_engine_id``."""
        peer = init_request.remote_engine_id
        new = MooncakeLink(init_request, self._holder)  # acquire first: a replaced link keeps the engine up
        old = self.links.get(peer)
        self.links[peer] = new
        if old is not None:
            older = self._superseded.pop(peer, None)
            self._superseded[peer] = old
            if older is not None:
                older.release()

    def register_memory_region(self, register_mr_request: Any) -> None:
        link = self._link(register_mr_request.remote_engine_id, "register_memory_region")
        r = register_mr_request
        link.register(r.mr_key, r.addr, r.length, r.offset)

    def endpoint_info(self, remote_engine_id: str, protocol: Any) -> dict[str, Any]:
        """LMDeploy's endpoint fields: ``{"mr_info": {...}, "session_id": "host:port"}``."""
        return self._link(remote_engine_id, "endpoint_info").endpoint().to_json()

    def p2p_connect(self, remote_engine_id: str, conn_req: Any) -> None:
        link = self._link(remote_engine_id, "p2p_connect")
        try:
            link.remote = parse_endpoint(conn_req.endpoint_info, peer=remote_engine_id)
        except EndpointError as e:
            raise MigrationError(str(e)) from None
        missing = sorted(set(link.local_kv_table) - set(link.remote.mr_info))
        if missing:
            log.warning("peer advertises fewer memory regions than this engine; migrations touching "
                        "them will be refused", extra={"remote_engine_id": remote_engine_id,
                                                       "missing_mr_keys": ",".join(missing)})
        old = self._superseded.pop(remote_engine_id, None)
        if old is not None:
            old.release()
        log.info("lmdeploy link connected", extra={"remote_engine_id": remote_engine_id,
                                                   "remote_session_id": link.remote.session_id,
                                                   "regions": len(link.remote.mr_info)})

    def p2p_drop_connect(self, remote_engine_id: str) -> bool:
        """Forget the link and release what it holds (the engine goes with the last link).

        LMDeploy 0.18's ``EngineP2PConnection.p2p_drop_connect`` does not call the backend yet
        (its TODO); a re-``p2p_initialize`` of the same peer releases the old link as well."""
        old = self._superseded.pop(remote_engine_id, None)
        if old is not None:
            old.release()
        link = self.links.pop(remote_engine_id, None)
        if link is None:
            return old is not None
        link.release()
        return True

    def _link(self, remote_engine_id: str, what: str) -> MooncakeLink:
        link = self.links.get(remote_engine_id)
        if link is None:
            raise MigrationError(f"{what}: no link to remote engine {remote_engine_id!r} (p2p_initialize was "
                                 f"not called for it, or it was dropped); links: {sorted(self.links) or 'none'}")
        return link

    # ------------------------------------------------------------------ migration
    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="mc-lmdeploy-migrate")
        return self._pool

    def plan(self, assignment: Any) -> tuple[MooncakeLink, TransferPlan]:
        """Validate an assignment against the link's regions and merge it (no I/O)."""
        peer = assignment.remote_engine_id
        link = self._link(peer, "p2p_migrate")
        if link.remote is None:
            raise MigrationError(f"p2p_migrate: remote engine {peer!r} is initialized but not connected "
                                 "(p2p_connect has not been called for it)")
        try:
            return link, build_plan(assignment.batch, link.local_kv_table, link.remote.mr_info, peer=peer)
        except PlanError as e:
            raise MigrationError(f"KV migration from {peer} refused: {e}") from None

    @staticmethod
    def _read(link: MooncakeLink, plan: TransferPlan) -> tuple[int, str, float]:
        t0 = time.monotonic()
        eng = link.engine
        # int64 arrays go straight to the engine's vectorised batch path (no per-range Python objects)
        rc = eng.batch_transfer_sync_read(link.remote_url, plan.local, plan.remote, plan.length)
        return rc, (eng.last_error if rc != 0 else ""), time.monotonic() - t0

    async def p2p_migrate(self, assignment: Any, async_op: bool = False) -> None:
        """Read the assignment's bytes from the peer; returns once they are in place, raises
        ``MigrationError`` (naming the peer) on failure or at the deadline."""
        link, plan = self.plan(assignment)
        if len(plan) == 0:
            return
        peer, session = link.remote_engine_id, link.remote_url
        if not link.enter():
            raise MigrationError(f"KV migration from {peer}: the link was dropped")
        deadline = link.engine.timeout + plan.nbytes / _GIB
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._executor(), self._read, link, plan)
        fut.add_done_callback(lambda _f: link.leave())
        try:
            rc, err, took = await asyncio.wait_for(asyncio.shield(fut), deadline + WAIT_GRACE_S)
        except asyncio.TimeoutError:
            log.error("KV migration wait gave up; the engine did not finish by its deadline",
                      extra={"remote_engine_id": peer, "remote_session_id": session, "deadline_s": deadline})
            raise MigrationError(f"KV migration from {peer} (mooncake session {session}) did not finish within "
                                 f"{deadline + WAIT_GRACE_S:.0f} s ({plan.nbytes} bytes in {len(plan)} ranges)"
                                 ) from None
        if rc != 0:
            log.error("KV migration failed", extra={"remote_engine_id": peer, "remote_session_id": session,
                                                    "error": err, "seconds": round(took, 3)})
            raise MigrationError(f"KV migration from {peer} (mooncake session {session}) failed after {took:.1f} s "
                                 f"(deadline {deadline:.0f} s): {err or 'transfer failed'}")
        log.debug("KV migration done", extra={"remote_engine_id": peer, "bytes": plan.nbytes,
                                              "entries": plan.entries, "ranges": len(plan),
                                              "seconds": round(took, 4)})

    def store(self, assignment: Any, async_op: bool = False) -> None:
        raise NotImplementedError("MooncakeCoreBackend.store: LMDeploy 0.18 does not use it (nor does its own "
                                  "Mooncake backend)")

    def load(self, assignment: Any, async_op: bool = False) -> None:
        raise NotImplementedError("MooncakeCoreBackend.load: LMDeploy 0.18 does not use it (nor does its own "
                                  "Mooncake backend)")
