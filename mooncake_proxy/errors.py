"""OpenAI-shaped error responses: ``{"error": {"message", "type", "code"}}``.

Clients (the OpenAI SDK, vLLM's benchmark) parse this shape; a bare text body would surface as
an opaque decoding error on their side.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

_enc = msgspec.json.Encoder()


def error_response(status: int, message: str, err_type: str, *, request_id: str | None = None,
                   retry_after: float | None = None) -> web.Response:
    """A JSON error response; ``retry_after`` (s) becomes the Retry-After header (integer, ≥1)."""
    headers: dict[str, str] = {}
    if request_id:
        headers["X-Request-Id"] = request_id
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, int(round(retry_after + 0.499))))
    body = _enc.encode({"error": {"message": message, "type": err_type, "code": status}})
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)
