"""Open the store client both LMCache integrations use (the remote connector and the
multiprocess mode's L2 adapter): one place that turns a failed ``setup`` into an error naming
the key to fix, logged before it is raised (LMCache's remote-backend path swallows it)."""

from __future__ import annotations

import os
from typing import Any

from mooncake_connectors.lmcache.settings import ConnectorSettings, setup_error
from mooncake_core.store import MooncakeDistributedStore

__all__ = ["open_store"]


def open_store(settings: ConnectorSettings, where: str, logger: Any) -> MooncakeDistributedStore:
    """A set-up store client; RuntimeError naming the key (``where``: who asked) otherwise."""
    if settings.storage_root_dir:
        os.environ["MOONCAKE_STORAGE_ROOT_DIR"] = settings.storage_root_dir
    store = MooncakeDistributedStore()
    rc = store.setup(dict(settings.setup))
    if rc != 0:
        msg = setup_error(settings, rc)
        logger.error("%s: %s", where, msg)
        raise RuntimeError(f"{where}: {msg}")
    return store
