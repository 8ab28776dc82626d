"""Register one of the proxy's built-in hook implementations with mooncake_core's plugin manager.

mooncake_core never imports the proxy, so the proxy hands its built-ins (hand-off protocols,
scheduling policies) to the manager with ``add_builtins`` the first time a table is needed.
Each built-in lives beside the classes it lists (``handoff/``, ``scheduling/policies.py``), so
this leaf is all they share.
"""

from __future__ import annotations

import threading

import pluggy

from mooncake_core.plugins import add_builtins


class BuiltinPlugin:
    """A hook implementation registered under ``name`` once per process, on first use."""

    def __init__(self, name: str, plugin: object) -> None:
        self.name = name
        self.plugin = plugin
        self._done = threading.Event()
        self._lock = threading.Lock()

    def ensure(self) -> None:
        """Hand the plugin to the manager (now, or when the manager is created)."""
        if self._done.is_set():
            return
        with self._lock:
            if not self._done.is_set():
                add_builtins(self._register)
                self._done.set()

    def _register(self, pm: pluggy.PluginManager) -> None:
        if pm.get_plugin(self.name) is None and not pm.is_blocked(self.name):
            pm.register(self.plugin, name=self.name)
