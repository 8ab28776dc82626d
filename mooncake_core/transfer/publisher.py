"""Publishing this engine's segment descriptor and rpc endpoint to the metadata service.

Keys as Mooncake's: ``mooncake/ram/<segment>`` (the descriptor) and
``mooncake/rpc_meta/<segment>`` (``{"ip_or_host_name", "rpc_port"}``). After every
(un)registration the descriptor is re-published; when the metadata service is down the local
change stands and a background loop re-publishes once it is back, and whenever the key
vanished or is stale (an HTTP metadata server restarted without persistence, say). Under
P2PHANDSHAKE there is no service: the rpc server hands the descriptor to whoever asks.
"""

from __future__ import annotations

import os
import threading
from typing import Callable

from mooncake_core import envs
from mooncake_core.metadata.base import MetadataBackend
from mooncake_core.transfer.descriptor import SegmentDescriptor, ram_key, rpc_meta_key
from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.te")

__all__ = ["DescriptorPublisher"]


class DescriptorPublisher:
    """Keeps ``meta`` in step with ``descriptor()`` for segment ``name``."""

    def __init__(self, meta: MetadataBackend, name: str, data_host: str, rpc_port: int,
                 descriptor: Callable[[], SegmentDescriptor]) -> None:
        self.meta = meta
        self.name = name
        self._endpoint = {"ip_or_host_name": data_host, "rpc_port": rpc_port}
        self._descriptor = descriptor
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Publish now (errors raise: start-up must not pretend) and keep it published."""
        self.meta.set(rpc_meta_key(self.name), self._endpoint)
        self.publish()
        self._thread = threading.Thread(target=self._loop, name="te-republish", daemon=True)
        self._thread.start()

    def publish(self) -> None:
        if not self._stop.is_set():
            self.meta.set(ram_key(self.name), self._descriptor().to_json())

    def publish_soft(self) -> None:
        """Publish after a (un)registration; if the metadata service is down the local change
        stands and the republish loop catches up once it is back."""
        try:
            self.publish()
        except Exception as e:
            log.warning("could not publish segment descriptor now; will re-publish when the metadata "
                        "service is reachable", extra={"segment": self.name, "error": str(e)})

    def _loop(self) -> None:
        """Re-publish when the key vanished or is not ours (the service lost it, or a
        predecessor's stale copy) -- checked every ``MC_METADATA_REFRESH_S`` seconds."""
        period = envs.MC_METADATA_REFRESH_S
        warned = False
        while not self._stop.wait(period):
            try:
                cur = self.meta.get(ram_key(self.name))
                desc = self._descriptor()
                if cur is None or cur.get("generation") != desc.generation or cur.get("pid") != os.getpid():
                    self.publish()
                    self.meta.set(rpc_meta_key(self.name), self._endpoint)
                    log.info("re-published segment descriptor", extra={"segment": self.name})
                warned = False
            except Exception as e:
                if not warned:
                    log.warning("metadata service unreachable, will retry", extra={"error": str(e)})
                    warned = True

    def stop(self, remove: bool) -> None:
        """Stop the loop; with ``remove``, delete both keys (best effort: we are going away)."""
        self._stop.set()
        if not remove:
            return
        for key in (ram_key(self.name), rpc_meta_key(self.name)):
            try:
                self.meta.remove(key)
            except Exception as e:
                log.debug("could not remove metadata key on close", extra={"key": key, "error": str(e)})
