"""Main module of processes spawned under the launcher: importing it registers the backend.

multiprocessing's ``spawn`` re-imports the parent's main module in every child (as
``__mp_main__``) before unpickling the child's target; the launcher names this module as that
main module (see ``launcher.make_spawned_children_register``), so LMDeploy's engine process,
started with ``spawn``, has our ``Mooncake`` backend registered like its parent.
"""

import mooncake_connectors.lmdeploy  # noqa: F401  (registers on import)
