"""Engine ids of prefill instances, from vLLM MooncakeConnector's bootstrap server.

With the Mooncake-vLLM hand-off the decode request must name the prefill engine it pulls KV
from (``remote_engine_id``, one per data-parallel rank). The prefill's bootstrap server
(``http://host:VLLM_MOONCAKE_BOOTSTRAP_PORT``) answers ``GET /query`` with
``{dp_rank: {"engine_id": ...}, ...}``. This module asks once per instance (bounded by a
timeout), caches the answer, and hands out DP ranks round-robin. A bootstrap server without
``/query`` (404: older connectors, which pair by bootstrap host/port only) is remembered as
"no engine ids" so the hand-off still works for them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp

from mooncake_core.utils.log import get_logger

log = get_logger("mooncake_proxy.bootstrap")


class BootstrapError(Exception):
    """The prefill's bootstrap server could not be queried (message names it)."""


@dataclass
class EngineIds:
    by_rank: dict[int, str] = field(default_factory=dict)
    _next: int = 0

    def pick(self) -> tuple[int | None, str | None]:
        """Next (dp_rank, engine_id), round-robin over ranks; (None, None) if none known."""
        if not self.by_rank:
            return None, None
        ranks = sorted(self.by_rank)
        rank = ranks[self._next % len(ranks)]
        self._next += 1
        return rank, self.by_rank[rank]


class BootstrapDirectory:
    def __init__(self, session_getter, timeout: float) -> None:
        self._session_getter = session_getter
        self.timeout = timeout
        self._cache: dict[str, EngineIds] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def forget(self, bootstrap_url: str) -> None:
        """Drop a cached answer (instance removed or restarted: engine ids change)."""
        self._cache.pop(bootstrap_url, None)

    async def engine_ids(self, bootstrap_url: str) -> EngineIds:
        cached = self._cache.get(bootstrap_url)
        if cached is not None:
            return cached
        lock = self._locks.setdefault(bootstrap_url, asyncio.Lock())
        async with lock:
            cached = self._cache.get(bootstrap_url)
            if cached is not None:
                return cached
            ids = await self._query(bootstrap_url)
            self._cache[bootstrap_url] = ids
            return ids

    async def _query(self, bootstrap_url: str) -> EngineIds:
        session: aiohttp.ClientSession = self._session_getter()
        url = bootstrap_url + "/query"
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
                if r.status == 404:
                    log.warning("bootstrap server has no /query; sending no remote_engine_id",
                                extra={"bootstrap": bootstrap_url})
                    return EngineIds()
                if r.status != 200:
                    raise BootstrapError(f"bootstrap server {url} returned HTTP {r.status}")
                data = await r.json(content_type=None)
        except asyncio.TimeoutError:
            raise BootstrapError(f"bootstrap server {url} did not answer within {self.timeout}s") from None
        except aiohttp.ClientError as e:
            raise BootstrapError(f"bootstrap server {url} unreachable: {type(e).__name__}: {e}") from None
        except ValueError as e:
            raise BootstrapError(f"bootstrap server {url} sent invalid JSON: {e}") from None
        ids = EngineIds()
        if not isinstance(data, dict):
            raise BootstrapError(f"bootstrap server {url}: expected {{dp_rank: {{engine_id}}}}, got {data!r:.200}")
        for rank, entry in data.items():
            try:
                ids.by_rank[int(rank)] = str(entry["engine_id"])
            except (ValueError, TypeError, KeyError):
                raise BootstrapError(f"bootstrap server {url}: bad entry {rank!r}: {entry!r:.200} "
                                     "(expected {dp_rank: {\"engine_id\": ...}})") from None
        return ids
