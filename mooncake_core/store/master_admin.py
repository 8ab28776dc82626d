"""The original master's HTTP admin routes, beside our dashboard on the metrics port.

Same paths, methods and JSON fields as the original's admin server, so its scripts and
operators' tooling work unchanged:

* ``POST /api/v1/drain_jobs`` ``{"segments": [...], "target_segments": [...],
  "max_concurrency": n}`` -> ``{"success", "job_id", "status": "CREATED"}``;
  ``GET /api/v1/drain_jobs/query?job_id=`` -> the job (status_name, succeeded/failed/
  blocked/active units, migrated bytes); ``POST /api/v1/drain_jobs/cancel?job_id=``.
* ``GET /api/v1/segments/status?segment=`` -> ``{"success", "segment", "status", "status_name"}``.
* ``GET /query_key?key=`` -> the memory replicas' buffer descriptors; ``GET
  /batch_query_keys?keys=k1,k2`` -> per key ``{"ok", "values"|"error", "disk_values"}``
  (no read lease is granted: an operator's look changes nothing); ``GET /get_all_segments``
  and ``GET /get_all_keys`` -> one name per line; ``GET /query_segment?segment=`` -> its used
  and capacity bytes (text); ``GET /get_segments_detail`` -> every segment's owner, range,
  status and use; ``GET /metrics/summary`` -> a short text summary of capacity, objects and
  clients.
* ``POST /api/v1/remove_all?force=true`` -> ``{"success", "removed_count"}`` (leased objects
  stay unless ``force``, as the client's ``remove_all``).

Errors are ``{"success": false, "error_code": <Mooncake code>, "error_message": ...}`` with
the original's HTTP statuses (400 bad request, 404 not found). The routes that change state
(``POST``: drains, remove_all) need ``Authorization: Bearer <token>`` when the master has an
auth token (``--auth_token`` / ``MOONCAKE_AUTH_TOKEN``; else 401): the RPC port's secret must
not be bypassed through the metrics port. Reads stay open, as ``/metrics`` is. Every call takes the master's
lock for the few microseconds it reads or plans (``master_tasks`` does the work on ticks).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from mooncake_core import auth
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


def _memory(descs: list[Any]) -> list[dict[str, Any]]:
    """The original's buffer descriptors (``AllocatedBuffer::Descriptor``) of memory replicas."""
    return [{"size_": r.size, "buffer_address_": r.addr, "transport_endpoint_": r.segment_name} for r in descs]


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
            if method != "GET" and not auth.bearer_ok(server.auth_token, environ.get("HTTP_AUTHORIZATION")):
                return 401, {"Content-Type": "text/plain; charset=utf-8", "WWW-Authenticate": "Bearer"}, \
                    (f"{environ.get('PATH_INFO')}: this master has an auth token: send 'Authorization: Bearer "
                     f"<token>' (the MOONCAKE_AUTH_TOKEN its clients use)\n").encode()
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
        return _json(200, {"success": True, "data": _memory(reps)})

    def batch_query_keys(environ: dict[str, Any]) -> Reply:
        keys = [k for k in _query(environ, "keys").split(",") if k]
        if not keys:
            return _json(400, {"success": False, "error": "No keys provided. Use ?keys=key1,key2,..."})
        data: dict[str, Any] = {}
        with server.lock:
            for k in keys:
                meta = st.objects.get(k)
                if meta is None:
                    data[k] = {"ok": False, "error": ErrorCode.OBJECT_NOT_FOUND.name}
                    continue
                item: dict[str, Any] = {"ok": True, "values": _memory([st.desc(r, meta.size) for r in meta.reps()])}
                disk = meta.disk
                if disk is not None:
                    item["disk_values"] = [{"file_path": disk.path, "object_size": disk.size}]
                data[k] = item
        return _json(200, {"success": True, "data": data})

    def query_segment(environ: dict[str, Any]) -> Reply:
        name = _query(environ, "segment")
        with server.lock:
            seg = st.segments.get(name)
            used, cap = (seg.alloc.used, seg.size) if seg is not None else (0, 0)
        if seg is None:
            return _error(ErrorCode.SEGMENT_NOT_FOUND, f"segment {name!r} is not mounted")
        return 200, TEXT, f"{name}\nUsed(bytes): {used}\nCapacity(bytes) : {cap}\n".encode()

    def segments_detail(_environ: dict[str, Any]) -> Reply:
        with server.lock:
            rows = [(key, s.name, s.seg_id, s.client_id, s.base, s.size, s.status, s.alloc.used)
                    for key, s in st.segments.items()]
        return _json(200, {"total_segments": len(rows), "segments": [
            {"segment_name": key, "segment_id": str(seg_id), "client_id": client, "base_address": hex(base),
             "size_bytes": size, "size_human": f"{size / (1 << 30):g} GiB", "te_endpoint": name,
             "protocol": "", "status": SEGMENT_STATUS[status], "allocator_used_bytes": used,
             "allocator_capacity_bytes": size, "allocator_usage_percent": 100.0 * used / size if size else 0.0}
            for key, name, seg_id, client, base, size, status, used in sorted(rows)]})

    def remove_all(environ: dict[str, Any]) -> Reply:
        force = _query(environ, "force") in ("true", "1")
        with server.lock:
            n = st.remove_all(force)
        return _json(200, {"success": True, "removed_count": n})

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
        "/batch_query_keys": guarded(batch_query_keys),
        "/query_segment": guarded(query_segment),
        "/get_segments_detail": guarded(segments_detail),
        "/api/v1/remove_all": guarded(remove_all, "POST"),
        "/get_all_segments": guarded(all_segments),
        "/get_all_keys": guarded(all_keys),
        "/metrics/summary": guarded(summary),
    }
