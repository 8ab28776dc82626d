"""Mooncake connectors for vLLM (KV connector V1 API, vLLM 0.32).

``MooncakeCoreConnector`` (P2P prefill->decode hand-off) lives in ``p2p_connector`` and needs
vLLM; it is imported lazily so that this package (and its pure modules: ``layout``, ``leases``,
``tp``) import without vLLM. What the connectors and the proxy say to each other (``kv_transfer_params``,
block keys, hints, the workers' notifications) is ``mooncake_core.pd``.
``kv_connector_module_path: "mooncake_connectors.vllm"`` works because the class names resolve through ``__getattr__``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MooncakeCoreConnector", "MooncakeCoreStoreConnector", "register"]


def register() -> list[str]:
    from mooncake_connectors.vllm.plugin import register as _register

    return _register()


def __getattr__(name: str) -> Any:
    if name == "MooncakeCoreConnector":
        from mooncake_connectors.vllm.p2p_connector import MooncakeCoreConnector

        return MooncakeCoreConnector
    if name == "MooncakeCoreStoreConnector":
        from mooncake_connectors.vllm.store_connector import MooncakeCoreStoreConnector

        return MooncakeCoreStoreConnector
    raise AttributeError(f"module 'mooncake_connectors.vllm' has no attribute {name!r}")
