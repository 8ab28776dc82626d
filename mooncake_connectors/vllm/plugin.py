"""vLLM plugin entry point (``vllm.general_plugins`` group): registers our connectors.

vLLM calls every general plugin in every process it starts (API server, engine core, workers),
possibly more than once, so ``register`` is idempotent. It registers

* ``MooncakeCoreConnector`` -- P2P prefill->decode KV hand-off over our Transfer Engine;
* ``MooncakeCoreStoreConnector`` -- KV blocks saved to / loaded from the Mooncake Store
  (registered only when its module is present),

and installs the ``mooncake`` import alias (``mooncake_core.compat``) so vLLM's built-in
``MooncakeConnector`` / ``MooncakeStoreConnector`` (which ``import mooncake.engine`` /
``mooncake.store``) run on this project's engine and store when the original wheel is absent.

Without the entry point (e.g. the package is not installed in vLLM's environment), use
``"kv_connector": "MooncakeCoreConnector", "kv_connector_module_path":
"mooncake_connectors.vllm"`` in ``--kv-transfer-config`` instead.
"""

from __future__ import annotations

import importlib.util
import logging

log = logging.getLogger("mooncake.vllm.plugin")

#: registry name -> (module, class). The built-in names MooncakeConnector/MooncakeStoreConnector are vLLM's.
CONNECTORS: dict[str, tuple[str, str]] = {
    "MooncakeCoreConnector": ("mooncake_connectors.vllm.p2p_connector", "MooncakeCoreConnector"),
    "MooncakeCoreStoreConnector": ("mooncake_connectors.vllm.store_connector", "MooncakeCoreStoreConnector"),
}


def _cpu_accelerator_shim() -> None:
    """Opt-in (env ``MOONCAKE_VLLM_CPU_SHIM=1``): let vLLM's built-in MooncakeConnector start on a
    CPU-only torch.

    That connector calls ``torch.accelerator.current_device_index()`` in its worker constructor,
    which raises "Cannot access accelerator device when none is available" on CPU builds -- a
    vLLM-on-CPU limitation, not a Mooncake one. With the shim the call returns device 0 when no
    accelerator exists (vLLM's CPU platform ignores the index). Nothing changes on machines with
    an accelerator, and nothing is patched unless the env var is set.
    """
    from mooncake_core import envs

    if not envs.MOONCAKE_VLLM_CPU_SHIM:
        return
    import torch

    acc = getattr(torch, "accelerator", None)
    if acc is None or acc.is_available() or getattr(acc.current_device_index, "_mooncake_shim", False):
        return
    orig = acc.current_device_index

    def current_device_index() -> int:
        try:
            return orig()
        except RuntimeError:
            return 0

    current_device_index._mooncake_shim = True  # type: ignore[attr-defined]
    acc.current_device_index = current_device_index
    log.info("MOONCAKE_VLLM_CPU_SHIM: torch.accelerator.current_device_index returns 0 on this CPU-only torch")


def register() -> list[str]:
    """Register our connectors with vLLM's ``KVConnectorFactory``; returns the names newly registered."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    except ImportError:  # vLLM absent: nothing to plug into
        return []
    done = []
    for name, (module, cls) in CONNECTORS.items():
        if name in KVConnectorFactory._registry:
            continue
        if importlib.util.find_spec(module) is None:
            continue
        KVConnectorFactory.register_connector(name, module, cls)
        done.append(name)
    _cpu_accelerator_shim()
    try:
        from mooncake_core import compat

        compat.install()
    except Exception as e:  # the alias is a convenience; never break vLLM start-up over it
        log.warning("could not install the mooncake import alias: %s", e)
    return done
