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
from mooncake_connectors.vllm.kv_groups import FULL, STATE, WINDOW, GroupSpec, window_blocks

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

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
    #: the KV cache groups that move (vLLM's transfer groups), in order; one full group when unknown
    groups: tuple[GroupSpec, ...] = ()
    #: layer name -> index in ``groups``
    group_of_layer: tuple[tuple[str, int], ...] = ()
    #: index of each of ``groups`` among vLLM's KV cache groups (vLLM hands block ids of all of them)
    transfer_group_ids: tuple[int, ...] = (0,)

    @classmethod
    def from_vllm(cls, vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig | None" = None) -> "P2PConfig":
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
            groups=group_specs(kv_cache_config, vllm_config.cache_config.block_size),
            group_of_layer=tuple(sorted(
                (name, i) for i, g in enumerate(kv_cache_config.transfer_groups) for name in g.layer_names))
            if kv_cache_config is not None else (),
            transfer_group_ids=tuple(kv_cache_config.transfer_group_ids)
            if kv_cache_config is not None and kv_cache_config.kv_cache_groups else (0,),
        )

    @property
    def hybrid(self) -> bool:
        """vLLM's hybrid KV cache manager gives this model's groups block ids of their own."""
        return len(self.groups) > 1 or any(g.kind != FULL for g in self.groups)

    @property
    def has_state(self) -> bool:
        """A group holds a recurrent state (Mamba): the decode must compute the prompt's last token."""
        return any(g.kind == STATE for g in self.groups)

    @property
    def p2p_handshake(self) -> bool:
        """No metadata service: peers learn each other's segments from the params themselves."""
        return str(self.metadata_server).strip().upper() == "P2PHANDSHAKE"


def group_specs(kv_cache_config: "KVCacheConfig | None", block_size: int) -> tuple[GroupSpec, ...]:
    """vLLM's transfer groups as ``kv_groups.GroupSpec``; raises ``ValueError`` naming a group kind
    this connector cannot move (so the engine fails at start, not with wrong output later)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, MLAAttentionSpec, SlidingWindowSpec

    if kv_cache_config is None or not kv_cache_config.kv_cache_groups:
        return (GroupSpec(FULL, block_size),)
    out = []
    for i, g in zip(kv_cache_config.transfer_group_ids, kv_cache_config.transfer_groups):
        spec = g.kv_cache_spec
        if isinstance(spec, MambaSpec):
            out.append(GroupSpec(STATE, spec.block_size))
        elif isinstance(spec, SlidingWindowSpec):
            out.append(GroupSpec(WINDOW, spec.block_size, window_blocks(spec.sliding_window, spec.block_size)))
        elif type(spec) in (FullAttentionSpec, MLAAttentionSpec) or len(kv_cache_config.transfer_groups) == 1:
            out.append(GroupSpec(FULL, spec.block_size))  # (one group: its blocks are the request's, as ever)
        else:
            raise ValueError(f"MooncakeCoreConnector: KV cache group {i} ({', '.join(g.layer_names[:3])}...) is a "
                             f"{type(spec).__name__}; this connector moves full-attention, sliding-window and Mamba "
                             f"state groups only")
    return tuple(out) or (GroupSpec(FULL, block_size),)
