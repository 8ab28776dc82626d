"""SGLang plugin entry point (group ``sglang.srt.plugins``): run SGLang's Mooncake code on us.

Why a plugin and not a new backend: SGLang's transfer backends are a fixed enum resolved by a
hard-coded ``get_kv_class``; a plugin cannot add a name. But SGLang's Mooncake backend (PD
transfer) and its HiCache ``MooncakeStore`` reach Mooncake only through
``from mooncake.engine import TransferEngine`` / ``from mooncake.store import ...``. Making those
imports resolve to ``mooncake_core`` is therefore enough for
``--disaggregation-transfer-backend mooncake`` and ``--hicache-storage-backend mooncake`` to run
on this package, with SGLang's own bootstrap server, ZMQ control messages and state machine
(and so with every fix SGLang makes there). We chose this over substituting our own
KVManager/Sender/Receiver through the hook registry: SGLang's classes already do per-peer
failure handling, heartbeats and timeouts, and our engine picks the same-host transport (cma)
by itself, so our own classes would add code without adding a transport.

SGLang loads every plugin of the group in every process it starts (scheduler, tokenizer,
detokenizer, data-parallel controller), so ``register`` must be cheap and idempotent.
"""

from __future__ import annotations

import os

from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.sglang")

_state: dict[str, bool] = {}


def _bridge_engine_gaps() -> list[str]:
    """Add, only where the core still lacks them, the engine methods SGLang calls.

    ``MooncakeTransferEngine.get_engine()`` in SGLang returns ``self.engine.get_engine()``; the
    original returns the native engine handle, which HiCache's ``MooncakeStore`` passes to
    ``store.setup(..., transfer_engine)`` to share one engine. Our store accepts our engine
    object itself, so the handle is the engine. Reported to the core owners; this shim is a
    no-op once ``mooncake_core.engine.TransferEngine.get_engine`` exists.
    """
    from mooncake_core.engine import TransferEngine

    added = []
    if not hasattr(TransferEngine, "get_engine"):
        def get_engine(self):
            """The engine handle other Mooncake objects accept (here: the engine itself)."""
            return self

        TransferEngine.get_engine = get_engine  # type: ignore[attr-defined]
        added.append("get_engine")
    return added


def register() -> bool:
    """Install the ``mooncake`` import alias; returns True when ``mooncake.*`` resolves to ours.

    The alias is forced only when the original Mooncake wheel is absent or the user sets
    ``MOONCAKE_CORE_COMPAT=1`` -- an installed original is never shadowed silently.
    Safe to call any number of times (SGLang may load plugins more than once per process).
    """
    if "active" in _state:
        return _state["active"]
    from mooncake_core import compat

    active = compat.install(force=False)
    _state["active"] = active
    if not active:
        log.info("sglang plugin: original mooncake package present; leaving it in place "
                 "(set MOONCAKE_CORE_COMPAT=1 to use mooncake_core)")
        return False
    added = _bridge_engine_gaps()
    # SGLang advertises its engine as <local ip>:<rpc port> (SGLANG_HOST_IP, or the NIC's IP);
    # our engine listens on MC_TCP_BIND_ADDRESS (default 127.0.0.1), so unless the user chose
    # an address, listen where SGLang tells peers to connect -- as the original engine does.
    if not os.environ.get("MC_TCP_BIND_ADDRESS"):
        os.environ["MC_TCP_BIND_ADDRESS"] = "0.0.0.0"
    log.info("sglang plugin: mooncake.* -> mooncake_core", extra={
        "pid": os.getpid(), "shimmed": added, "bind": os.environ["MC_TCP_BIND_ADDRESS"]})
    return True
