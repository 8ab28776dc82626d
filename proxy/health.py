"""Periodic instance health checks.

An instance whose ``/health`` fails (or times out) is taken out of scheduling at once
(``ClusterState.set_healthy(id, False)``) and probed again every interval; the first success
puts it back. The probe has its own short timeout so one dead host never delays the others.
"""

from __future__ import annotations

import asyncio
from typing import Callable

import aiohttp

from mooncake_core.utils.log import get_logger

from .registry import Instance, Registry

log = get_logger("mooncake_proxy.health")


class HealthChecker:
    def __init__(self, registry: Registry, session: aiohttp.ClientSession, interval: float,
                 timeout: float, on_change: Callable[[Instance, bool, str], None]) -> None:
        self.registry = registry
        self.session = session
        self.interval = interval
        self.timeout = timeout
        self.on_change = on_change
        self._task: asyncio.Task | None = None

    async def probe(self, inst: Instance) -> tuple[bool, str]:
        try:
            async with self.session.get(inst.url + "/health",
                                        timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
                await r.read()
                if r.status == 200:
                    return True, ""
                return False, f"/health returned HTTP {r.status}"
        except asyncio.TimeoutError:
            return False, f"/health timed out after {self.timeout}s"
        except aiohttp.ClientError as e:
            return False, f"/health failed: {type(e).__name__}: {e}"

    async def check_all(self) -> None:
        insts = self.registry.all()
        results = await asyncio.gather(*(self.probe(i) for i in insts))
        for inst, (ok, why) in zip(insts, results):
            if self.registry.get(inst.instance_id) is None:
                continue  # removed meanwhile
            if ok != inst.healthy:
                self.on_change(inst, ok, why)

    async def _loop(self) -> None:
        while True:
            try:
                await self.check_all()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the checker die silently
                log.exception("health check round failed")
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        if self.interval > 0 and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="health-checker")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
