"""The original master's HTTP admin routes, beside our dashboard on the metrics port.

Same paths, methods and JSON fields as the original's admin server, so its scripts and
operators' tooling work unchanged:

* ``POST /api/v1/drain_jobs`` ``{"segments": [...], "target_segments": [...],
  "max_concurrency": n}`` -> ``{"success", "job_id", "status": "CREATED"}``;
  ``GET /api/v1/drain_jobs/query?job_id=`` -> the job (status_name, succeeded/failed/
  blocked/active units, migrated bytes); ``POST /api/v1/drain_jobs/cancel?job_id=``.
* ``GET /api/v1/segments/status?segment=`` -> ``{"success", "segment", "status", "status_name"}``.
* ``GET /query_key?key=`` -> the memory replicas' buffer descriptors; ``GET /get_all_segments``
  and ``GET /get_all_keys`` -> one name per line; ``GET /metrics/summary`` -> a short text
  summary of capacity, objects and clients.

Errors are ``{"success": false, "error_code": <Mooncake code>, "error_message": ...}`` with
the original's HTTP statuses (400 bad request, 404 not found). Every call takes the master's
lock for the few microseconds it reads or plans (``master_tasks`` does the work on ticks).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from mooncake_core.errors import ErrorCode, MooncakeError
from mooncake_core.store.master_tasks import SEGMENT_STATUS

if TYPE_CHECKING:
    from mooncake_core.store.master_server import MasterServer

__all__ = ["admin_routes"]

Reply = tuple[int, dict[str, str], bytes]
JSON = {"Content-Type": "application/json; charset=utf-8", "Cache-Control": "no-store"}
TEXT = {"Content-Type": "text/plain; version=0.0.4", "Cache-Control": "no-store"}
#: largest request body read (a drain request names a few segments)
MAX_BODY = 1 << 20


def _json(status: int, body: dict[str, Any]) -> Reply:
    return status, JSON, json.dumps(body, separators=(",", ":")).encode()


def _error(code: int, message: str) -> Reply:
    status = 404 if code in (ErrorCode.OBJECT_NOT_FOUND, ErrorCode.SEGMENT_NOT_FOUND) else 400
    return _json(status, {"success": False, "error_code": int(code), "error_message": message})


def _query(environ: dict[str, Any], name: str) -> str:
    return (parse_qs(environ.get("QUERY_STRING", "")).get(name) or [""])[0]


def _method(environ: dict[str, Any], want: str) -> Reply | None:
    got = environ.get("REQUEST_METHOD", "GET")
    if got != want:
        return 405, {"Content-Type": "text/plain; charset=utf-8", "Allow": want}, \
            f"{environ.get('PATH_INFO')}: use {want}, not {got}\n".encode()
    return None


def _body(environ: dict[str, Any]) -> dict[str, Any]:
    try:
        n = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        n = 0
    if n > MAX_BODY:
        raise ValueError(f"request body of {n} bytes is over {MAX_BODY}")
    raw = environ["wsgi.input"].read(n) if n > 0 else b""
    data = json.loads(raw or b"{}")
    if not isinstance(data, dict):
        raise ValueError("the body must be a JSON object")
    return data


def admin_routes(server: MasterServer) -> dict[str, Callable[[dict[str, Any]], Reply]]:
    """The routes above for ``utils.metrics.start_metrics_server`` (``server``'s state)."""
    st = server.state

    def guarded(fn: Callable[[dict[str, Any]], Reply], method: str = "GET") -> Callable[[dict[str, Any]], Reply]:
        def route(environ: dict[str, Any]) -> Reply:
            bad = _method(environ, method)
            if bad is not None:
                return bad
            try:
                return fn(environ)
            except MooncakeError as e:
                return _error(e.code, e.message)
            except (ValueError, KeyError, TypeError) as e:
                return _error(ErrorCode.INVALID_PARAMS, f"invalid request: {e}")
        return route

    def create_drain(environ: dict[str, Any]) -> Reply:
        req: dict[str, Any] = _body(environ)
        segments: Any = req.get("segments")
        with server.lock:
            job = st.tasks.create_drain(segments, req.get("target_segments") or [],
                                        req.get("max_concurrency") or 0)
        return _json(200, {"success": True, "job_id": job.job_id, "status": "CREATED"})

    def query_drain(environ: dict[str, Any]) -> Reply:
        job_id = _query(environ, "job_id")
        if not job_id:
            return _error(ErrorCode.INVALID_PARAMS, "Missing or invalid job_id")
        with server.lock:
            return _json(200, st.tasks.query_drain(job_id).describe())

    def cancel_drain(environ: dict[str, Any]) -> Reply:
        job_id = _query(environ, "job_id")
        if not job_id:
            return _error(ErrorCode.INVALID_PARAMS, "Missing or invalid job_id")
        with server.lock:
            st.tasks.cancel_drain(job_id)
        return _json(200, {"success": True, "job_id": job_id, "status": "CANCELED"})

    def segment_status(environ: dict[str, Any]) -> Reply:
        name = _query(environ, "segment")
        if not name:
            return _error(ErrorCode.INVALID_PARAMS, "Missing segment query parameter")
        with server.lock:
            status = st.tasks.segment_status(name)
        return _json(200, {"success": True, "segment": name, "status": status,
                           "status_name": SEGMENT_STATUS[status]})

    def query_key(environ: dict[str, Any]) -> Reply:
        key = _query(environ, "key")
        with server.lock:
            meta = st.objects.get(key)
            reps = [] if meta is None else [st.desc(r, meta.size) for r in meta.reps()]
        if meta is None:
            return _error(ErrorCode.OBJECT_NOT_FOUND, f"no such object {key!r}")
        return _json(200, {"success": True, "data": [
            {"size_": r.size, "buffer_address_": r.addr, "transport_endpoint_": r.segment_name} for r in reps]})

    def all_segments(_environ: dict[str, Any]) -> Reply:
        with server.lock:
            names = sorted(st.segments)
        return 200, TEXT, "".join(n + "\n" for n in names).encode()

    def all_keys(_environ: dict[str, Any]) -> Reply:
        with server.lock:
            keys = list(st.objects)
        return 200, TEXT, "".join(k + "\n" for k in keys).encode()

    def summary(_environ: dict[str, Any]) -> Reply:
        with server.lock:
            cap, used, n_obj, n_seg, n_cli = st.capacity, st.used, len(st.objects), len(st.segments), len(st.clients)
        pct = 100.0 * used / cap if cap else 0.0
        text = (f"Mooncake master: {n_seg} segments, {n_cli} clients, {n_obj} objects; "
                f"memory {used} of {cap} bytes used ({pct:.1f}%)\n")
        return 200, {"Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-store"}, text.encode()

    return {
        "/api/v1/drain_jobs": guarded(create_drain, "POST"),
        "/api/v1/drain_jobs/query": guarded(query_drain),
        "/api/v1/drain_jobs/cancel": guarded(cancel_drain, "POST"),
        "/api/v1/segments/status": guarded(segment_status),
        "/query_key": guarded(query_key),
        "/get_all_segments": guarded(all_segments),
        "/get_all_keys": guarded(all_keys),
        "/metrics/summary": guarded(summary),
    }
