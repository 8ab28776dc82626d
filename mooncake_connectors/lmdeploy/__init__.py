"""Mooncake connector for LMDeploy 0.18: PD migration on ``mooncake_core``, on any host.

``import mooncake_connectors.lmdeploy`` registers ``MooncakeCoreBackend`` under LMDeploy's
``--migration-backend Mooncake`` and installs the ``mooncake`` import alias (so LMDeploy's own
``MooncakeBackend`` and ``MooncakeStoreConnector`` run on this package). LMDeploy has no plugin
hook, hence the explicit import -- or the launcher, which registers and then runs LMDeploy's CLI
unchanged::

    python -m mooncake_connectors.lmdeploy serve proxy --server-port 8000 --serving-strategy DistServe
    python -m mooncake_connectors.lmdeploy serve api_server MODEL --role Prefill \\
        --proxy-url http://HOST:8000 --backend pytorch --migration-backend Mooncake

See docs/lmdeploy.md. Importing this package without LMDeploy installed does nothing.
"""

from mooncake_connectors.lmdeploy.registration import backend_class, chosen, register

register()

__all__ = ["backend_class", "chosen", "register"]
