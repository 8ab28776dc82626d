"""Make ``--migration-backend Mooncake`` mean our backend, and ``mooncake.*`` mean our package.

Why a registration on import (and a launcher) and not a plugin: LMDeploy 0.18 has no plugin or
entry-point mechanism. Its migration backends live in an mmengine ``Registry``
(``lmdeploy.pytorch.disagg.backend.backend.MIGRATION_BACKENDS``), filled when the package
``lmdeploy.pytorch.disagg.backend`` is imported; ``CacheEngine.p2p_initialize`` instantiates
``MIGRATION_BACKENDS.module_dict[name]()`` lazily, on the first connection. So whatever sits
under ``"Mooncake"`` in that registry by then is what LMDeploy uses, and the one way in is code
that runs in the engine's process first:

* ``register()`` (run by ``import mooncake_connectors.lmdeploy``) imports LMDeploy's backend
  package -- so LMDeploy's own registrations have happened and can never run after ours (a
  second plain ``register_module("Mooncake")`` would raise) -- then replaces the entry with
  ``register_module("Mooncake", force=True)``. Safe in any import order and idempotent.
* ``python -m mooncake_connectors.lmdeploy serve ...`` (``launcher``) calls it and then runs
  LMDeploy's own CLI with the same arguments, and makes the processes LMDeploy spawns (its engine
  runs in a ``spawn`` child) register as well.

It also installs the ``mooncake`` import alias (``mooncake_core.compat``), so LMDeploy's *own*
``MooncakeBackend`` and its ``MooncakeStoreConnector`` run on this package; the alias is never
forced over an installed original Mooncake wheel. ``MOONCAKE_LMDEPLOY_BACKEND=lmdeploy`` keeps
LMDeploy's own backend class under ``Mooncake`` (alias only); the default, ``core``, is ours.
Nothing happens where LMDeploy is not installed.
"""

from __future__ import annotations

import os

from mooncake_core.utils.log import get_logger

log = get_logger("mooncake.lmdeploy")

BACKEND_NAME = "Mooncake"
CHOICES = ("core", "lmdeploy")
_state: dict[str, str] = {}


def chosen() -> str:
    """Which class ``MOONCAKE_LMDEPLOY_BACKEND`` asks for ("core" unless set to "lmdeploy")."""
    v = os.environ.get("MOONCAKE_LMDEPLOY_BACKEND", "core").strip().lower() or "core"
    if v not in CHOICES:
        raise ValueError(f"MOONCAKE_LMDEPLOY_BACKEND={v!r}: expected one of {', '.join(CHOICES)}")
    return v


def register() -> str | None:
    """Register; returns what ``Mooncake`` resolves to now ("core" / "lmdeploy"), None without LMDeploy."""
    if "result" in _state:
        return _state["result"] or None
    import importlib.util

    spec = importlib.util.find_spec("lmdeploy")
    if spec is None or spec.origin is None:  # absent, or only a directory of that name (a namespace)
        _state["result"] = ""
        return None
    from mooncake_core import compat

    alias = compat.install(force=False)
    # LMDeploy's package registers DLSlime and its own MooncakeBackend at import: let it do so first.
    import lmdeploy.pytorch.disagg.backend  # noqa: F401
    from lmdeploy.pytorch.disagg.backend.backend import MIGRATION_BACKENDS

    choice = chosen()
    if choice == "core":
        from mooncake_connectors.lmdeploy.backend import MooncakeCoreBackend

        MIGRATION_BACKENDS.register_module(BACKEND_NAME, force=True, module=MooncakeCoreBackend)
    _state["result"] = choice
    log.info("lmdeploy: migration backend registered", extra={
        "name": BACKEND_NAME, "backend": choice, "mooncake_alias": alias, "pid": os.getpid()})
    return choice


def backend_class() -> type | None:
    """The class LMDeploy will instantiate for ``--migration-backend Mooncake`` (None without LMDeploy)."""
    if register() is None:
        return None
    from lmdeploy.pytorch.disagg.backend.backend import MIGRATION_BACKENDS

    return MIGRATION_BACKENDS.module_dict.get(BACKEND_NAME)
