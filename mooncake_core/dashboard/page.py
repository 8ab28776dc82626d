"""The dashboard page of a service as one self-contained HTML document.

The stylesheet and script ship inside the package (``static/``) and are inlined into the page
when it is served: one request, nothing fetched from a CDN, so the page works on an
air-gapped cluster and behind any reverse proxy that forwards the service's port.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

SERVICES = ("master", "proxy")
#: the page fetches ``<page path>/data.json``; both live under this path on the service's port
DASHBOARD_PATH = "/dashboard"
DATA_PATH = DASHBOARD_PATH + "/data.json"
#: sent with the page: it may only run its own inlined script and talk to its own origin
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
       "connect-src 'self'; img-src data:")


def _static(name: str) -> str:
    return resources.files("mooncake_core.dashboard").joinpath("static").joinpath(name).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def page_html(service: str) -> bytes:
    """The page of ``service`` ("master" or "proxy"), CSS and JS inlined."""
    if service not in SERVICES:
        raise ValueError(f"dashboard: unknown service {service!r} (expected one of {SERVICES})")
    html = _static("page.html").replace("{{SERVICE}}", service)
    html = html.replace("/*STYLE*/", _static("dashboard.css")).replace("/*SCRIPT*/", _static("dashboard.js"))
    return html.encode("utf-8")


def page_headers() -> dict[str, str]:
    return {"Content-Security-Policy": CSP, "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
