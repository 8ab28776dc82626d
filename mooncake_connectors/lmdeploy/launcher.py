"""``python -m mooncake_connectors.lmdeploy``: register our backend, then run LMDeploy's own CLI.

Usage (every argument after the program name goes to ``lmdeploy`` unchanged)::

    python -m mooncake_connectors.lmdeploy serve proxy --server-port 8000 --serving-strategy DistServe
    python -m mooncake_connectors.lmdeploy serve api_server MODEL --role Prefill \\
        --proxy-url http://HOST:8000 --backend pytorch --migration-backend Mooncake
    python -m mooncake_connectors.lmdeploy check      # where Mooncake resolves, here and in a spawned child

Why the launcher exists: LMDeploy has no plugin hook, and ``lmdeploy serve api_server`` runs its
engine (where ``CacheEngine`` instantiates the migration backend) in a child started with
multiprocessing's ``spawn``. A spawned child re-imports the parent's main module -- except when
that module is a package's ``__main__``, which multiprocessing skips. So before handing over, the
launcher names ``mooncake_connectors.lmdeploy.spawn_main`` as the main module's spec: every
spawned child then imports it (and with it the registration) before it unpickles its target.
Ray workers (``--distributed-executor-backend ray``) are not spawned that way; there, add
``import mooncake_connectors.lmdeploy`` to the worker set-up (docs/lmdeploy.md).
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import sys
import tempfile
from typing import Any

HELP = __doc__.split("Why the launcher", 1)[0].strip() + """

Environment:
  MOONCAKE_LMDEPLOY_BACKEND  core (default): our MooncakeCoreBackend under --migration-backend Mooncake;
                             lmdeploy: keep LMDeploy's own MooncakeBackend (it still runs on mooncake_core
                             through the `mooncake` alias, but needs `ibv_devices` and a default route)
  MOONCAKE_LOCAL_HOSTNAME    address peers use to reach this process's Transfer Engine (default: the host
                             of the engine's DistServe URL, i.e. --server-name, else the default route's
                             source address, else 127.0.0.1)
  MC_TRANSFER_TIMEOUT        deadline of one migration in seconds (default 30, plus 1 s per GiB)
  MC_FORCE_TCP=1             use tcp even between processes of one host
"""

SPAWN_MAIN = "mooncake_connectors.lmdeploy.spawn_main"

# Runs in a spawned child through builtins.exec, so that nothing of ours is imported by unpickling
# the target: only the spawn preparation (our main-module spec) can have registered the backend.
_CHILD_PROBE = """
import json
from lmdeploy.pytorch.disagg.backend.backend import MIGRATION_BACKENDS
cls = MIGRATION_BACKENDS.module_dict.get('Mooncake')
with open({path!r}, 'w') as f:
    json.dump({{'backend': cls.__module__ + '.' + cls.__qualname__ if cls else None}}, f)
"""


def make_spawned_children_register() -> None:
    """Point the main module's spec at ``spawn_main`` so multiprocessing's spawn re-imports it."""
    main = sys.modules.get("__main__")
    spec = importlib.util.find_spec(SPAWN_MAIN)
    if main is not None and spec is not None:
        main.__spec__ = spec


def _qualname(cls: type | None) -> str | None:
    return f"{cls.__module__}.{cls.__qualname__}" if cls is not None else None


def check() -> dict[str, Any]:
    """Where ``Mooncake`` resolves in this process and in a child spawned the way LMDeploy does."""
    from mooncake_connectors.lmdeploy import backend_class, chosen
    from mooncake_connectors.lmdeploy.endpoint import local_host
    from mooncake_core import compat

    out: dict[str, Any] = {"pid": os.getpid(), "choice": chosen(), "backend": _qualname(backend_class()),
                           "mooncake_alias": compat.is_installed()}
    try:
        import lmdeploy

        out["lmdeploy"] = lmdeploy.__version__
    except ImportError:
        out["lmdeploy"] = None
        return out
    host, why = local_host(None)
    out["local_host"], out["local_host_from"] = host, why
    with tempfile.TemporaryDirectory(prefix="mc-lmdeploy-check-") as d:
        path = os.path.join(d, "child.json")
        proc = multiprocessing.get_context("spawn").Process(target=exec, args=(_CHILD_PROBE.format(path=path),))
        proc.start()
        proc.join(120)
        if proc.is_alive():
            proc.kill()
            out["spawned_child_backend"] = "timeout"
        elif os.path.exists(path):
            with open(path) as f:
                out["spawned_child_backend"] = json.load(f)["backend"]
        else:
            out["spawned_child_backend"] = f"child exited {proc.exitcode}"
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(HELP)
        return 0 if args else 2
    from mooncake_connectors.lmdeploy import register

    if register() is None:
        print("mooncake_connectors.lmdeploy: LMDeploy is not installed in this interpreter "
              "(see scripts/install_lmdeploy.sh)", file=sys.stderr)
        return 2
    make_spawned_children_register()
    if args[0] == "check":
        print(json.dumps(check(), indent=1))
        return 0
    from lmdeploy.cli import run

    sys.argv = ["lmdeploy", *args]
    run()
    return 0
