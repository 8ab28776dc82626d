"""The original's ``mooncake.http_metadata_server`` interface: ``KVBootstrapServer`` and ``KVPoll``.

Why: code written for the original (SGLang's and others' bootstrap helpers, its tests) starts
the HTTP metadata server in-process as ``KVBootstrapServer(port).run()``, checks ``poll()``,
stops it with ``close()`` and reads ``store``. This is that interface over our server
(:class:`~mooncake_core.metadata.http_server.HttpMetadataServer`, with its limits, metrics,
optional auth and persistence). Differences: ``run()`` returns once the port listens (the
original returns before it binds, so an early request could be refused) and raises OSError
naming the port when it is taken; ``port=0`` picks a free port, read back from ``.port``.
"""

from __future__ import annotations

import enum
import threading
from typing import Any

from aiohttp import web

from mooncake_core.metadata.http_server import HttpMetadataServer, main
from mooncake_core.metadata.kvstore import KVStore

__all__ = ["KVBootstrapServer", "KVPoll", "main"]


class KVPoll(enum.Enum):
    """Server status as the original reports it (only Failed and Success are used)."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class KVBootstrapServer:
    """An HTTP metadata server (``/metadata?key=K``) on a background thread."""

    def __init__(self, port: int, host: str = "0.0.0.0", **service_kwargs: Any) -> None:
        self.port = port
        self.host = host
        self._server = HttpMetadataServer(host, port, **service_kwargs)

    @property
    def store(self) -> KVStore:
        """The key/value table (``key in server.store``, ``len``, ``get``)."""
        return self._server.service.store

    @property
    def thread(self) -> threading.Thread | None:
        return self._server.thread

    async def _handle_metadata(self, request: web.Request) -> web.StreamResponse:
        """The ``/metadata`` handler (the original's name; callable without a running server)."""
        return await self._server.service.handle_metadata(request)

    def run(self) -> threading.Thread:
        """Serve on a background thread; returns it once the port listens."""
        self._server.start()
        self.port = self._server.port or self.port
        assert self._server.thread is not None
        return self._server.thread

    def close(self) -> None:
        """Stop serving (idempotent)."""
        self._server.stop()

    def poll(self) -> KVPoll:
        """Success while the server thread runs, Failed before ``run`` and after ``close``."""
        thread = self._server.thread
        return KVPoll.Success if thread is not None and thread.is_alive() else KVPoll.Failed
