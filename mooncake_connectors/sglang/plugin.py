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
    # SGLang advertises its engine as <local ip>:<rpc port>; our engine listens on the host of
    # its local_hostname by default (MC_TCP_BIND_ADDRESS overrides), so peers reach it there.
    log.info("sglang plugin: mooncake.* -> mooncake_core", extra={
        "pid": os.getpid()})
    return True
