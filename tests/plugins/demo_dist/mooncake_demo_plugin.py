"""Example third-party mooncake-core plugin (see docs/plugins.md).

* ``procmem`` transport: moves bytes to a process on the same host by ``pread``/``pwrite`` on
  its ``/proc/PID/mem`` -- a different mechanism from the built-in cma transport, preferred
  over it (priority 90 > 80) so a test can see it chosen. It publishes a descriptor section
  (``{"version": 1, "pid", "regions"}``, kept current by the region hooks) and reaches only
  peers that publish one too.
* ``dirkv://DIR`` metadata backend: one JSON file per key in a directory shared by the peers.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import tempfile
import threading
import time
from typing import Any, Mapping

from mooncake_core.metadata.base import MetadataBackend, check_key, decode_value, encode_value
from mooncake_core.metadata.conn_string import MetadataSpec
from mooncake_core.plugins import MetadataBackendPlugin, hookimpl
from mooncake_core.transfer.cma import pid_listens_on
from mooncake_core.transfer.base import Capabilities, Transport, TransferError, TransferOpcode, TransferRequest
from mooncake_core.transfer.descriptor import SegmentDescriptor, process_start_time
from mooncake_core.transfer.memory import memview


class ProcMemTransport(Transport):
    name = "procmem"
    priority = 90
    capabilities = Capabilities(locations=frozenset({"cpu"}))

    def __init__(self, ctx: Any = None) -> None:
        super().__init__(ctx)
        self._fds: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()
        self._regions = 0

    def register_region(self, region: Any) -> None:
        with self._lock:
            self._regions += 1

    def unregister_region(self, region: Any) -> None:
        with self._lock:
            self._regions -= 1

    def descriptor_section(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "regions": self._regions}

    def _fd(self, desc: SegmentDescriptor) -> int:
        key = (desc.pid, desc.start_time)
        with self._lock:
            fd = self._fds.get(key)
            if fd is None:
                if desc.start_time and process_start_time(desc.pid) != desc.start_time:
                    raise TransferError(f"segment {desc.name!r}: process {desc.pid} has exited", peer_down=True)
                fd = self._fds[key] = os.open(f"/proc/{desc.pid}/mem", os.O_RDWR)
            return fd

    def can_reach(self, desc: SegmentDescriptor) -> bool:
        ctx = self.ctx
        if ctx is None or not desc.same_host_as(ctx.boot_id, ctx.pidns) or desc.pid == os.getpid():
            return False
        sec = desc.section(self.name, self.section_version)
        if sec is None or sec.get("pid") != desc.pid:
            return False
        # a descriptor is the peer's word: write only into the process that serves its port
        if not pid_listens_on(desc.pid, desc.port):
            return False
        try:
            self._fd(desc)
            return True
        except (OSError, TransferError):
            return False

    def transfer(self, desc: SegmentDescriptor, reqs: list[TransferRequest], deadline: float) -> None:
        fd = self._fd(desc)
        for r in reqs:
            if time.monotonic() > deadline:
                raise TransferError(f"segment {desc.name!r}: deadline exceeded")
            done = 0
            while done < r.length:
                n = r.length - done
                try:
                    if r.opcode == TransferOpcode.WRITE:
                        got = os.pwrite(fd, memview(r.local_addr + done, n, writable=False), r.remote_addr + done)
                    else:
                        got = os.preadv(fd, [memview(r.local_addr + done, n)], r.remote_addr + done)
                except OSError as e:
                    raise TransferError(f"procmem {r.opcode.name.lower()} with pid {desc.pid}: {e}",
                                        peer_down=True) from None
                if got <= 0:
                    raise TransferError(f"procmem {r.opcode.name.lower()} with pid {desc.pid} made no progress")
                done += got

    def drop_peer(self, desc: SegmentDescriptor) -> None:
        with self._lock:
            fd = self._fds.pop((desc.pid, desc.start_time), None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)


@dataclasses.dataclass(frozen=True)
class DirSpec(MetadataSpec):
    """``dirkv:///abs/dir``: kind "dirkv", the directory in ``path``."""

    path: str = ""

    @property
    def endpoint_text(self) -> str:
        return self.path


class DirMetadataBackend(MetadataBackend):
    backend_name = "dirkv"

    def __init__(self, spec: DirSpec, timeout: float) -> None:
        super().__init__(spec.endpoint_text, timeout)
        self.dir = spec.endpoint_text
        os.makedirs(self.dir, exist_ok=True)

    def _file(self, key: str) -> str:
        return os.path.join(self.dir, base64.urlsafe_b64encode(check_key(key).encode()).decode() + ".json")

    def get(self, key: str) -> dict | None:
        try:
            with open(self._file(key), "rb") as f:
                return decode_value(self.backend_name, self.dir, key, f.read())
        except FileNotFoundError:
            return None

    def set(self, key: str, value: dict) -> None:
        data = encode_value(key, value)
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, self._file(key))

    def remove(self, key: str) -> None:
        try:
            os.unlink(self._file(key))
        except FileNotFoundError:
            pass

    def list(self, prefix: str) -> list[str]:
        keys = [base64.urlsafe_b64decode(n[:-5]).decode() for n in os.listdir(self.dir) if n.endswith(".json")]
        return sorted(k for k in keys if k.startswith(prefix))

    def close(self) -> None:
        pass


def _parse(conn: str, env: Mapping[str, str]) -> DirSpec:
    path = conn.strip().partition("://")[2]
    if not path.startswith("/"):
        raise ValueError(f"invalid metadata connection string {conn!r}: dirkv needs an absolute path "
                         "(dirkv:///some/dir)")
    return DirSpec(kind="dirkv", path=path)


@hookimpl
def mooncake_transports() -> list[type[Transport]]:
    return [ProcMemTransport]


@hookimpl
def mooncake_metadata_backends() -> list[MetadataBackendPlugin]:
    return [MetadataBackendPlugin(("dirkv",), _parse, lambda spec, timeout: DirMetadataBackend(spec, timeout),
                                  "dirkv:///abs/dir")]
