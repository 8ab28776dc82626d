"""The engine's control channel: descriptor fetch, notifications and probes to a peer's rpc port.

Why not the tcp transport: these exchanges are needed whatever transport moves the data (a
same-host cma peer still gets its notifications, an RDMA peer its P2P descriptor fetch), so
they have a client of their own -- one pooled connection per peer (``conn.PeerPool``), the
rpc port's wire format (``GET_DESC`` / ``NOTIFY`` / ``PROBE``, unchanged from the previous
release), every wait bounded by the caller's deadline.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from mooncake_core.errors import ErrorCode
from mooncake_core.transfer.base import TransferError
from mooncake_core.transfer.conn import Conn, PeerPool
from mooncake_core.transfer.wire import Op, Status

__all__ = ["ControlChannel"]


class ControlChannel:
    """Control requests to peers' rpc ports (thread-safe)."""

    def __init__(self) -> None:
        self._pools: dict[tuple[str, int], PeerPool[Conn]] = {}
        self._lock = threading.Lock()

    def _pool(self, host: str, port: int, name: str) -> PeerPool[Conn]:
        key = (host, port)
        with self._lock:
            p = self._pools.get(key)
            if p is None:
                p = self._pools[key] = PeerPool(host, port, name, 1, Conn)
            return p

    def request(self, host: str, port: int, name: str, op: Op, aux: bytes, deadline: float) -> tuple[int, bytes]:
        """One control exchange: (status, reply aux). TransferError when the peer cannot be
        reached or does not answer before ``deadline``."""
        return self._pool(host, port, name).use(lambda c: c.control(op, aux, deadline), deadline)

    def fetch_descriptor(self, host: str, port: int, name: str, deadline: float) -> Any:
        """The peer's segment descriptor as JSON (P2PHANDSHAKE: no metadata service)."""
        status, aux = self.request(host, port, name, Op.GET_DESC, b"", deadline)
        if status != Status.OK:
            raise TransferError(f"segment {name!r}: descriptor request refused: {aux.decode(errors='replace')}",
                                ErrorCode.SEGMENT_NOT_FOUND)
        try:
            return json.loads(aux)
        except ValueError as e:
            raise TransferError(f"segment {name!r}: descriptor reply is not JSON: {e}") from None

    def notify(self, host: str, port: int, name: str, notify_name: str, msg: str, deadline: float) -> None:
        aux = json.dumps({"name": notify_name, "msg": msg}).encode()
        status, raux = self.request(host, port, name, Op.NOTIFY, aux, deadline)
        if status != Status.OK:
            raise TransferError(f"segment {name!r} refused notify: {raux.decode(errors='replace')}")

    def probe(self, host: str, port: int, name: str, deadline: float) -> bool:
        status, _ = self.request(host, port, name, Op.PROBE, b"", deadline)
        return status == Status.OK

    def drop_peer(self, host: str, port: int) -> None:
        with self._lock:
            p = self._pools.pop((host, port), None)
        if p is not None:
            p.close()

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            p.close()
