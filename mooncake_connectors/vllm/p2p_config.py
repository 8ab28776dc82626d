"""``MooncakeCoreConnector``'s settings, read once from vLLM's ``kv_connector_extra_config``.

Why one object: the scheduler side and the worker side (different processes) read the same keys
with the same defaults; reading them in one place keeps the two from drifting apart. Every key
is documented in ``p2p_connector.py``'s module docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mooncake_core import envs
from mooncake_connectors.vllm.idle import IDLE_WAIT_MS

if TYPE_CHECKING:
    from vllm.config import VllmConfig

#: A decode does not start a read this close to the prefill's lease expiry (the blocks may be
#: freed and reused mid-read); it recomputes or fails per policy instead.
LEASE_MARGIN_S = 2.0
#: Default ``kv_lease_s``: how long a prefill holds a finished request's blocks for a decode.
KV_LEASE_S = 30.0
#: Default ``sync_load_max_bytes``: a request's KV up to this size is read synchronously inside
#: the decode's step (about a millisecond over cross-memory attach; it delays that step's other
#: requests by as much), larger ones asynchronously while the engine keeps stepping.
SYNC_LOAD_MAX_BYTES = 4 << 20
#: Default ``prefill_wait_s``: how long a decode of the concurrent hand-off waits for the prefill's
#: ``ready`` before giving up on the transfer (then ``kv_load_failure_policy`` applies).
PREFILL_WAIT_S = 120.0
#: Default ``want_retry_s``: a decode of the concurrent hand-off that has no ``ready`` after this
#: long asks again. A ``ready`` can be lost: it is the prefill's first contact with the decode's
#: segment, which may fail on a loaded box, and nothing else would ever resend it.
WANT_RETRY_S = 5.0
#: Default ``clock_refresh_s``: a decode measures a prefill host's clock offset again once the last
#: measurement is this old (a host's clock may be stepped meanwhile); ``peer_clock.py``.
CLOCK_REFRESH_S = 30.0


@dataclass(frozen=True)
class P2PConfig:
    """One instance's connector settings (both roles: an instance may prefill and decode)."""

    engine_id: str
    block_size: int
    tp_size: int
    lease_s: float = KV_LEASE_S
    sync_load_max_bytes: int = SYNC_LOAD_MAX_BYTES
    prefill_wait_s: float = PREFILL_WAIT_S
    want_retry_s: float = WANT_RETRY_S
    clock_refresh_s: float = CLOCK_REFRESH_S
    idle_wait_ms: float = IDLE_WAIT_MS
    local_hostname: str = "127.0.0.1"
    metadata_server: str = "P2PHANDSHAKE"
    protocol: str = "tcp"
    device_name: str = ""

    @classmethod
    def from_vllm(cls, vllm_config: "VllmConfig") -> "P2PConfig":
        ktc = vllm_config.kv_transfer_config

        def extra(key: str, default: Any) -> Any:
            return ktc.get_from_extra_config(key, default)

        return cls(
            engine_id=ktc.engine_id or "mooncake",
            block_size=vllm_config.cache_config.block_size,
            tp_size=vllm_config.parallel_config.tensor_parallel_size,
            lease_s=float(extra("kv_lease_s", KV_LEASE_S)),
            sync_load_max_bytes=int(extra("sync_load_max_bytes", SYNC_LOAD_MAX_BYTES)),
            prefill_wait_s=float(extra("prefill_wait_s", PREFILL_WAIT_S)),
            want_retry_s=float(extra("want_retry_s", WANT_RETRY_S)),
            clock_refresh_s=float(extra("clock_refresh_s", CLOCK_REFRESH_S)),
            idle_wait_ms=float(extra("idle_wait_ms", IDLE_WAIT_MS)),
            local_hostname=extra("local_hostname", envs.MOONCAKE_LOCAL_HOSTNAME or "127.0.0.1"),
            metadata_server=extra("metadata_server", "P2PHANDSHAKE"),
            protocol=extra("protocol", "tcp"),
            device_name=extra("device_name", ""),
        )

    @property
    def p2p_handshake(self) -> bool:
        """No metadata service: peers learn each other's segments from the params themselves."""
        return str(self.metadata_server).strip().upper() == "P2PHANDSHAKE"
