"""Relaying to the engines: one POST read as JSON (a prefill), one streamed through (a decode).

Why a module of its own: this is the proxy's byte path, with its own rules -- every call is
bounded (``--request-timeout`` / ``--connect-timeout``), the client's response is started only at
the first decode byte (so a failure before it is a proper 502/504 JSON error, after it a cut
connection), a refused connection marks the instance unreachable (retryable elsewhere), a 4xx is
the client's fault and passed on verbatim. The server (``server.py``) decides *where* to send;
this module only moves the bytes, through the collaborators it is given.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp
import msgspec
from aiohttp import web

from mooncake_core.utils.log import get_logger

from .metrics import ProxyMetrics
from .registry import Instance

log = get_logger("mooncake_proxy.relay")

__all__ = ["Relay", "RelayTimeouts", "StreamTiming", "UpstreamError", "forward_headers"]

_dec = msgspec.json.Decoder()
_enc = msgspec.json.Encoder()

_SSE = "text/event-stream; charset=utf-8"
_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding",
                "date", "server"}


class UpstreamError(Exception):
    """An upstream call failed; carries the HTTP status the client should get."""

    def __init__(self, status: int, message: str, err_type: str, inst: Instance,
                 body: bytes | None = None, content_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.inst = inst
        self.body = body
        self.content_type = content_type
        # True when the instance could not even be reached: nothing was processed, so the
        # request can safely go to another instance.
        self.retryable = False


@dataclass(slots=True)
class StreamTiming:
    """When a decode stream's first and last chunks came (perf_counter), how many there were and
    the gaps between them: the server's online calibration (``--calibrate``) reads the stream's
    p90 chunk gap from it."""

    first: float = 0.0
    last: float = 0.0
    chunks: int = 0
    #: called when the first chunk arrives (the hand-off queue's first-token event, while the stream goes on)
    on_first: Callable[[], object] | None = None
    #: the first MAX_GAPS gaps between chunks (seconds)
    gaps: list[float] = field(default_factory=list)
    MAX_GAPS: ClassVar[int] = 1024

    def gap_quantile(self, q: float = 0.9) -> float | None:
        """The ``q`` quantile of the gaps between chunks (linear interpolation, as numpy's
        percentile), None below two gaps. Why the p90 and not the mean: the TBT SLO is a p90 of a
        request's token gaps (the paper's SLOs are P90s, and the replay's attainment judges each
        request's own p90), and on a shared box a few long gaps miss it while the mean does not."""
        g = sorted(self.gaps)
        if len(g) < 2:
            return None
        pos = q * (len(g) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(g) - 1)
        return g[lo] + (g[hi] - g[lo]) * (pos - lo)


@dataclass(frozen=True)
class RelayTimeouts:
    request_s: float = 300.0   # --request-timeout: a whole prefill, or a decode's silence
    connect_s: float = 5.0     # --connect-timeout


def forward_headers(request: web.Request, request_id: str) -> dict[str, str]:
    # identity: we relay bytes verbatim (auto_decompress off), so never ask for compression.
    h = {"Content-Type": "application/json", "X-Request-Id": request_id, "Accept-Encoding": "identity"}
    auth = request.headers.get("Authorization")
    if auth:
        h["Authorization"] = auth
    return h


class Relay:
    """Upstream calls of one proxy. ``session`` is read at call time (it exists once the app
    started); ``on_unreachable(inst, why)`` takes an instance out when it refused a connection;
    ``observe_ttft(route, seconds)`` records the time to the first decode byte."""

    def __init__(self, session: Callable[[], aiohttp.ClientSession | None], timeouts: RelayTimeouts,
                 metrics: ProxyMetrics, on_unreachable: Callable[[Instance, str], None],
                 observe_ttft: Callable[[str, float], None]) -> None:
        self._session = session
        self.timeouts = timeouts
        self.metrics = metrics
        self._on_unreachable = on_unreachable
        self._observe_ttft = observe_ttft
        self._tbt: dict[str, Any] = {}  # route -> histogram child (``.labels()`` is not free)

    def _tbt_of(self, route: str) -> Any:
        h = self._tbt.get(route)
        if h is None:
            h = self._tbt[route] = self.metrics.tbt.labels(route)
        return h

    def session(self) -> aiohttp.ClientSession:
        s = self._session()
        if s is None:
            raise RuntimeError("the proxy's HTTP client session is not open (app not started)")
        return s

    # ------------------------------------------------------------------ errors
    def timeout_error(self, inst: Instance, what: str) -> UpstreamError:
        self.metrics.upstream_errors.labels(inst.instance_id, "timeout").inc()
        return UpstreamError(504, f"{what} instance {inst.url} did not answer within "
                                  f"--request-timeout {self.timeouts.request_s}s", "timeout", inst)

    def conn_error(self, inst: Instance, what: str, e: BaseException) -> UpstreamError:
        self.metrics.upstream_errors.labels(inst.instance_id, "connection").inc()
        err = UpstreamError(502, f"{what} instance {inst.url} failed: {type(e).__name__}: {e}",
                            "upstream_error", inst)
        if isinstance(e, aiohttp.ClientConnectorError):
            # Could not even connect: take it out now; the health checker puts it back.
            self._on_unreachable(inst, f"connect failed: {e}")
            err.retryable = True
        return err

    async def status_error(self, inst: Instance, what: str, resp: aiohttp.ClientResponse) -> UpstreamError:
        body = await resp.read()
        self.metrics.upstream_errors.labels(inst.instance_id, f"http_{resp.status}").inc()
        if 400 <= resp.status < 500:
            # The client's request is at fault (e.g. prompt too long): pass the engine's answer on.
            return UpstreamError(resp.status, body.decode("utf-8", "replace")[:500], "invalid_request_error",
                                 inst, body, resp.headers.get("Content-Type"))
        return UpstreamError(502, f"{what} instance {inst.url} returned HTTP {resp.status}: "
                                  f"{body[:300].decode('utf-8', 'replace')}", "upstream_error", inst)

    # ------------------------------------------------------------------ calls
    async def post_json(self, inst: Instance, route: str, payload: dict[str, Any],
                        headers: dict[str, str], what: str) -> dict[str, Any]:
        """POST and read a JSON answer, bounded by --request-timeout; raises UpstreamError."""
        t = aiohttp.ClientTimeout(total=self.timeouts.request_s, sock_connect=self.timeouts.connect_s)
        try:
            async with self.session().post(inst.url + route, data=_enc.encode(payload),
                                           headers=headers, timeout=t) as resp:
                if resp.status >= 400:
                    raise await self.status_error(inst, what, resp)
                raw = await resp.read()
        except asyncio.TimeoutError:
            raise self.timeout_error(inst, what) from None
        except aiohttp.ClientError as e:
            raise self.conn_error(inst, what, e) from None
        try:
            out = _dec.decode(raw) if raw else {}
        except msgspec.DecodeError:
            # SSE (prefill asked to stream, SGLang style): nothing to read from it.
            return {}
        return out if isinstance(out, dict) else {}

    async def send_sse(self, request: web.Request, route: str, rid: str, t0: float, data: bytes) -> web.StreamResponse:
        """A whole SSE answer the proxy has already (``--prefill-first-token``: the prefill's one
        token was all the request asked for)."""
        out = await self._start_sse(request, route, rid, t0, data)
        await out.write_eof()
        return out

    async def _start_sse(self, request: web.Request, route: str, rid: str, t0: float,
                         data: bytes) -> web.StreamResponse:
        """Open the client's SSE response with bytes the proxy already has; TTFT is taken here."""
        out = web.StreamResponse(status=200, headers={"Content-Type": _SSE, "X-Request-Id": rid})
        await out.prepare(request)
        await out.write(data)
        self._observe_ttft(route, time.perf_counter() - t0)
        return out

    async def race_decode(self, request: web.Request, route: str, d: Instance, payload: dict[str, Any],
                          headers: dict[str, str], rid: str, t0: float,
                          ptask: asyncio.Task[dict[str, Any]],
                          timing: StreamTiming | None = None) -> web.StreamResponse:
        """Concurrent hand-off: stream the decode, but if the prefill fails before the client
        got a byte, stop waiting (the decode would wait for KV that never comes) and answer with
        the prefill's error."""
        started: list[bool] = []
        dtask = asyncio.create_task(self.stream_decode(request, route, d, payload, headers, rid, t0, started,
                                                              timing))
        try:
            await asyncio.wait({dtask, ptask}, return_when=asyncio.FIRST_COMPLETED)
            if not dtask.done() and not started and not ptask.cancelled():
                failure = ptask.exception()
                if failure is not None:
                    dtask.cancel()
                    try:
                        await dtask
                    except BaseException:
                        pass
                    raise failure
            return await dtask
        finally:
            if not dtask.done():
                dtask.cancel()
                try:
                    await dtask
                except BaseException:
                    pass

    async def stream_decode(self, request: web.Request, route: str, d: Instance, payload: dict[str, Any],
                            headers: dict[str, str], rid: str, t0: float,
                            started: list[bool] | None,
                            timing: StreamTiming | None = None, prefix: bytes | None = None,
                            rewrite: Callable[[bytes], bytes] | None = None) -> web.StreamResponse:
        """Stream the decode answer through; the client response starts at the first byte.

        ``prefix`` (``--prefill-first-token``): SSE bytes the client gets *before* the decode is
        even asked -- the response starts with them, so a decode failure after that can only cut
        the connection. ``rewrite`` maps each received piece to what is written (it may hold back
        an unfinished event; what it still holds at the end is written then).
        """
        t = aiohttp.ClientTimeout(total=None, sock_connect=self.timeouts.connect_s,
                                  sock_read=self.timeouts.request_s)
        out = await self._start_sse(request, route, rid, t0, prefix) if prefix is not None else None
        try:
            async with self.session().post(d.url + route, data=_enc.encode(payload),
                                           headers=headers, timeout=t) as resp:
                if resp.status >= 400:
                    err = await self.status_error(d, "decode", resp)
                    if out is None:
                        raise err
                    log.warning("decode refused the request after its first token was sent; aborting",
                                extra={"request_id": rid, "error": err.message})
                    return _abort(request, out)
                it = resp.content.iter_any().__aiter__()
                tbt = self._tbt_of(route)
                last = 0.0
                while True:
                    try:
                        chunk = await it.__anext__()
                    except StopAsyncIteration:
                        break
                    now = time.perf_counter()
                    if rewrite is not None:
                        chunk = rewrite(chunk)
                    if out is None:
                        if started is not None:
                            started.append(True)
                        out = _start_response(resp, rid)
                        await out.prepare(request)
                        self._observe_ttft(route, now - t0)
                    else:
                        tbt.observe(now - last)  # gap between streamed chunks (one token each in SSE)
                    last = now
                    if timing is not None:
                        if not timing.chunks:
                            timing.first = now
                            if timing.on_first is not None:
                                timing.on_first()
                        elif len(timing.gaps) < timing.MAX_GAPS:
                            timing.gaps.append(now - timing.last)
                        timing.chunks += 1
                        timing.last = now
                    await out.write(chunk)
        except ConnectionResetError as e:
            if request.transport is None or request.transport.is_closing():
                raise  # the *client* went away while we wrote to it
            if out is None:
                raise self.conn_error(d, "decode", e) from None
            return _abort(request, out)
        except asyncio.TimeoutError:
            if out is None:
                raise self.timeout_error(d, "decode") from None
            log.warning("decode stalled mid-stream; aborting", extra={"request_id": rid})
            return _abort(request, out)
        except aiohttp.ClientError as e:
            if out is None:
                raise self.conn_error(d, "decode", e) from None
            log.warning("decode failed mid-stream; aborting", extra={"request_id": rid, "error": str(e)})
            return _abort(request, out)
        if out is None:  # empty body
            if started is not None:
                started.append(True)
            out = _start_response(resp, rid)
            await out.prepare(request)
            self._observe_ttft(route, time.perf_counter() - t0)
        if rewrite is not None and (rest := rewrite(b"")):
            await out.write(rest)
        await out.write_eof()
        return out


def _start_response(resp: aiohttp.ClientResponse, rid: str) -> web.StreamResponse:
    out = web.StreamResponse(status=resp.status)
    for k, v in resp.headers.items():
        if k.lower() not in _HOP_HEADERS:
            out.headers[k] = v
    out.headers["X-Request-Id"] = rid
    return out


def _abort(request: web.Request, out: web.StreamResponse) -> web.StreamResponse:
    # Headers are gone already: the only honest signal left is cutting the connection, so the
    # client sees an incomplete chunked body rather than a silently short answer.
    if request.transport is not None:
        request.transport.close()
    return out
