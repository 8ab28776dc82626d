"""Instance health probing (the I/O side of ``health_state``).

One background task probes each instance's ``/health`` when ``health_state`` says it is due:
at once when it is added, then with fast back-off until it first answers, then every
``--health-interval``. Each instance has at most one probe in flight; the request path joins it
(``ensure_up``) instead of starting another, so a burst of requests arriving while every engine
is still booting costs one probe per engine, not one per request.

Every probe has its own short timeout, so one dead host never delays the others, and results are
reported through ``on_result`` (the server updates the scheduler's view and the metrics).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, NamedTuple

import aiohttp

from mooncake_core.utils.log import get_logger

from .health_state import ProbePolicy, next_due
from .registry import Instance, Registry

log = get_logger("mooncake_proxy.health")

# Longest the background loop sleeps without looking again (instances may be added meanwhile).
_MAX_SLEEP = 1.0


class ProbeResult(NamedTuple):
    ok: bool
    why: str = ""            # why not ok (empty when ok)
    timed_out: bool = False  # no answer within the timeout (busy or gone: health_state decides)


class HealthChecker:
    def __init__(self, registry: Registry, session: aiohttp.ClientSession, policy: ProbePolicy,
                 timeout: float, on_result: Callable[[Instance, ProbeResult], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.session = session
        self.policy = policy
        self.timeout = timeout
        self.on_result = on_result
        self.clock = clock
        self._task: asyncio.Task | None = None
        self._probes: dict[str, asyncio.Task] = {}  # instance id -> probe in flight
        self._wake = asyncio.Event()
        self._stopping = False

    async def probe(self, inst: Instance) -> ProbeResult:
        """One ``GET /health``. Never raises for network errors."""
        try:
            async with self.session.get(inst.url + "/health",
                                        timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
                await r.read()
                if r.status == 200:
                    return ProbeResult(True)
                return ProbeResult(False, f"/health returned HTTP {r.status}")
        except asyncio.TimeoutError:
            return ProbeResult(False, f"/health timed out after {self.timeout}s", timed_out=True)
        except aiohttp.ClientError as e:
            return ProbeResult(False, f"/health failed: {type(e).__name__}: {e}")

    def probe_now(self, inst: Instance) -> asyncio.Task:
        """The probe in flight for ``inst``, or a new one; its result is applied when it ends."""
        t = self._probes.get(inst.instance_id)
        if t is None or t.done():
            t = asyncio.create_task(self._probe_and_apply(inst), name=f"probe {inst.instance_id}")
            self._probes[inst.instance_id] = t
        return t

    async def _probe_and_apply(self, inst: Instance) -> bool:
        try:
            res = await self.probe(inst)
        except Exception as e:  # a bug in probing must not kill the checker
            res = ProbeResult(False, f"probe error: {type(e).__name__}: {e}")
        finally:
            if self._probes.get(inst.instance_id) is asyncio.current_task():
                del self._probes[inst.instance_id]
            self._wake.set()
        if self.registry.get(inst.instance_id) is inst:  # not removed meanwhile
            self.on_result(inst, res)
        return res.ok

    async def ensure_up(self, role: str, budget: float) -> bool:
        """Probe every ``role`` instance that is not up (joining probes in flight) and return as
        soon as one is up, or False after ``budget`` seconds / when all probes failed."""
        if any(i.healthy for i in self.registry.all(role)):
            return True
        tasks = {self.probe_now(i) for i in self.registry.all(role)}
        deadline = self.clock() + budget
        while tasks:
            left = deadline - self.clock()
            if left <= 0:
                break
            done, tasks = await asyncio.wait(tasks, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if any(i.healthy for i in self.registry.all(role)):
                return True
            if not done:
                break
        return any(i.healthy for i in self.registry.all(role))

    def wake(self) -> None:
        """Look at the schedule again now (an instance was added or failed)."""
        self._wake.set()

    async def _loop(self) -> None:
        # A flag as well as cancel(): Python 3.11's wait_for can swallow a cancellation that
        # races with the awaited event being set (seen here as a shutdown that never ended).
        while not self._stopping:
            self._wake.clear()
            try:
                now = self.clock()
                idle = [i for i in self.registry.all() if i.instance_id not in self._probes]
                for inst in idle:
                    if inst.health.next_probe_at <= now:
                        self.probe_now(inst)
                idle = [i for i in idle if i.instance_id not in self._probes]
                sleep = min(_MAX_SLEEP, max(0.0, next_due([i.health for i in idle]) - self.clock()))
            except Exception:  # never let the checker die silently
                log.exception("health check round failed")
                sleep = _MAX_SLEEP
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=sleep)
            except asyncio.TimeoutError:
                pass

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="health-checker")

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        tasks = [t for t in (self._task, *self._probes.values()) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._task = None
        self._probes.clear()
