"""Admin API: add, remove and list instances while the proxy runs.

``GET /admin/instances``; ``POST /admin/instances {"role", "url"[, "bootstrap_port"]}`` (the new
instance is probed at once; it enters rotation when its /health answers, which the answer's
``state`` shows);
``DELETE /admin/instances?id=ROLE@URL`` or ``?role=...&url=...`` (at once: requests on it fail);
``POST /admin/instances/<id>/drain[?wait=S]`` (id ``ROLE@URL``, percent-encoded or not): the instance
gets no new requests, those on it finish; the answer -- and ``GET`` on the same path -- says
``safe_to_stop`` once none is left (``wait`` holds the answer up to S seconds for that). Scale in
with drain, wait until safe, stop the engine, then DELETE;
``POST /admin/prefix[?route=/v1/chat/completions]`` with a request body answers what the scheduler
sees for that prompt: its tokens and full blocks, and how many leading blocks each prefill
instance (and the store) holds in the proxy's index -- to check the index against an engine's
cache, or to see why a prompt went where it went. With ``--admin-key K`` every call
needs ``Authorization: Bearer K`` or ``X-Admin-Key: K``; without the flag the deployment's
``MOONCAKE_AUTH_TOKEN`` is the key (see ``mooncake_core.auth``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncio
import time
import urllib.parse

import msgspec
from aiohttp import web

from mooncake_core import auth
from mooncake_core.utils.log import get_logger

from .errors import error_response
from .registry import Instance, Registry

_dec = msgspec.json.Decoder()
log = get_logger("mooncake_proxy.admin")


class AdminApi:
    """The admin routes, given what they act on (no reference to the server): the registry
    (listing, ids), how to add and remove an instance, how to probe a new one at once, the key."""

    def __init__(self, registry: Registry, add: Callable[[str, str, int | None], Instance],
                 remove: Callable[[str], Instance], probe_now: Callable[[Instance], Awaitable[None]],
                 admin_key: str | None,
                 prefix_view: Callable[[dict[str, Any], str], dict[str, Any]] | None = None,
                 drain: Callable[[str], Instance] | None = None) -> None:
        self.registry = registry
        self._drain = drain
        self._prefix_view = prefix_view
        self._add = add
        self._remove = remove
        self._probe_now = probe_now
        self.admin_key = admin_key

    def register(self, app: web.Application) -> None:
        app.router.add_get("/admin/instances", self.list)
        app.router.add_post("/admin/instances", self.add)
        app.router.add_delete("/admin/instances", self.remove)
        if self._prefix_view is not None:
            app.router.add_post("/admin/prefix", self.prefix)
        if self._drain is not None:
            app.router.add_post("/admin/instances/{id:.+}/drain", self.drain)
            app.router.add_get("/admin/instances/{id:.+}/drain", self.drain_status)

    def _refused(self, request: web.Request) -> web.Response | None:
        """None when the request carries the admin key (or none is set), else the 401 answer."""
        h = request.headers
        if auth.bearer_ok(self.admin_key, h.get("Authorization"), h.get("X-Admin-Key")):
            return None
        given = "a wrong key" if (h.get("Authorization") or h.get("X-Admin-Key")) else "no key"
        log.warning("refused admin request", extra={"peer": request.remote, "method": request.method,
                                                    "presented": given})
        return error_response(401, f"admin API: {request.method} {request.path} refused, {given} presented; send "
                                   f"'Authorization: Bearer <key>' or 'X-Admin-Key: <key>' (--admin-key or "
                                   f"MOONCAKE_AUTH_TOKEN of the proxy)", "authentication_error")

    async def list(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        return web.json_response({"instances": [i.to_json() for i in self.registry.all()]})

    async def add(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        try:
            data = _dec.decode(await request.read())
            if not isinstance(data, dict):
                raise ValueError("body must be a JSON object {role, url[, bootstrap_port]}")
            inst = self._add(str(data.get("role")), data.get("url", ""), data.get("bootstrap_port"))
        except (ValueError, TypeError, msgspec.DecodeError) as e:
            return error_response(400, f"admin add instance: {e}", "invalid_request_error")
        # The answer says whether it is in rotation yet (bounded by --health-timeout).
        await self._probe_now(inst)
        return web.json_response(inst.to_json(), status=201)

    async def remove(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        q = request.query
        iid = q.get("id")
        try:
            if not iid:
                role, url = q.get("role"), q.get("url")
                if not role or not url:
                    raise ValueError("give ?id=ROLE@URL or ?role=prefill|decode&url=http://host:port")
                iid = self.registry.make_id(role, url)
            inst = self._remove(iid)
        except ValueError as e:
            return error_response(400, f"admin remove instance: {e}", "invalid_request_error")
        except KeyError as e:
            return error_response(404, f"admin remove instance: {e.args[0]}", "not_found_error")
        return web.json_response({"removed": inst.to_json()})

    #: longest ``?wait=`` a drain call holds its answer (a preStop hook's budget is the pod's grace period)
    MAX_DRAIN_WAIT_S = 600.0
    DRAIN_POLL_S = 0.05

    def _drain_target(self, request: web.Request) -> tuple[str, float]:
        """(instance id, seconds to wait) of a drain call; ValueError names the bad value."""
        iid = urllib.parse.unquote(request.match_info["id"])
        raw = request.query.get("wait", "0")
        try:
            wait = float(raw)
        except ValueError:
            raise ValueError(f"?wait={raw!r}: expected seconds (a number)") from None
        if not 0 <= wait <= self.MAX_DRAIN_WAIT_S:
            raise ValueError(f"?wait={raw}: expected 0..{self.MAX_DRAIN_WAIT_S:g} seconds")
        return iid, wait

    async def _answer_drain(self, inst: Instance, wait: float, status: int) -> web.Response:
        deadline = time.monotonic() + wait
        while inst.draining and inst.active > 0 and time.monotonic() < deadline:
            await asyncio.sleep(self.DRAIN_POLL_S)
        return web.json_response(inst.drain_status(time.monotonic()), status=status)

    async def drain(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        assert self._drain is not None
        try:
            iid, wait = self._drain_target(request)
            inst = self._drain(iid)
        except ValueError as e:
            return error_response(400, f"admin drain: {e}", "invalid_request_error")
        except KeyError as e:
            return error_response(404, f"admin drain: {e.args[0]}", "not_found_error")
        return await self._answer_drain(inst, wait, 202)

    async def drain_status(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        try:
            iid, wait = self._drain_target(request)
        except ValueError as e:
            return error_response(400, f"admin drain status: {e}", "invalid_request_error")
        inst = self.registry.get(iid)
        if inst is None:
            return error_response(404, f"admin drain status: no instance {iid!r}; known: "
                                       f"{sorted(i.instance_id for i in self.registry.all())}", "not_found_error")
        return await self._answer_drain(inst, wait, 200)

    async def prefix(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        assert self._prefix_view is not None
        route = request.query.get("route", "/v1/completions")
        try:
            data = _dec.decode(await request.read())
            if not isinstance(data, dict):
                raise ValueError("body must be a JSON object: a completion or chat request")
            return web.json_response(self._prefix_view(data, route))
        except (ValueError, TypeError, msgspec.DecodeError) as e:  # BadRequest is a ValueError
            return error_response(400, f"admin prefix: {e}", "invalid_request_error")
