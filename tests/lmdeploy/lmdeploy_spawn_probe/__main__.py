"""``python -m lmdeploy_spawn_probe [--launcher-fix]``: does a spawned child see our backend?

The control for the launcher's spawn handling: a parent run as a package's ``__main__`` (as
``python -m mooncake_connectors.lmdeploy`` is) registers, then spawns a child the way LMDeploy
starts its engine process, with a target that imports nothing of ours. Without the launcher's
fix the child keeps LMDeploy's own class; with it the child registers ours.
"""

import json
import multiprocessing
import os
import sys
import tempfile

import mooncake_connectors.lmdeploy  # noqa: F401  (registers in this process)
from mooncake_connectors.lmdeploy.launcher import _CHILD_PROBE, make_spawned_children_register

if __name__ == "__main__":
    if "--launcher-fix" in sys.argv:
        make_spawned_children_register()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "child.json")
        p = multiprocessing.get_context("spawn").Process(target=exec, args=(_CHILD_PROBE.format(path=path),))
        p.start()
        p.join(120)
        with open(path) as f:
            print(json.dumps({"child": json.load(f)["backend"]}))
