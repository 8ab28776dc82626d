"""Run an LMCache program with ``import mooncake.*`` resolving to this package.

Why: LMCache's ``mooncake_te`` transfer channel (``--p2p-transfer-engine mooncake_te`` of its
multiprocess server) and its ``mooncakestore://`` adapter import ``mooncake.engine`` /
``mooncake.store``. Inside vLLM and SGLang our plugins install that alias; LMCache's own
server processes load no plugin of ours, so this launcher installs it first and then runs
the program in the same interpreter::

    python -m mooncake_connectors.lmcache.run -m lmcache.v1.multiprocess.server --p2p-transfer-engine mooncake_te ...
    python -m mooncake_connectors.lmcache.run lmcache server ...        # a console script
    python -m mooncake_connectors.lmcache.run my_script.py --flag       # a script

When the original Mooncake is installed the alias stays off (it never shadows a real install)
unless ``MOONCAKE_CORE_COMPAT=1``.
"""

from __future__ import annotations

import os
import runpy
import sys

USAGE = ("usage: python -m mooncake_connectors.lmcache.run (-m MODULE | SCRIPT.py | CONSOLE_SCRIPT) [ARGS...]\n"
         "Installs the `mooncake` alias (mooncake_core.compat), then runs the program with ARGS.")


def _console_script(name: str):
    from importlib.metadata import entry_points

    found = list(entry_points(group="console_scripts", name=name))
    if not found:
        raise SystemExit(f"mooncake_connectors.lmcache.run: no console script named {name!r} "
                         f"(and no file of that name)\n{USAGE}")
    return found[0].load()


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or (args[0] == "-m" and len(args) < 2):
        print(USAGE, file=sys.stderr if args else sys.stdout)
        raise SystemExit(0 if args else 2)
    from mooncake_core import compat

    if not compat.install():
        print("mooncake_connectors.lmcache.run: the original Mooncake is installed, so `mooncake` stays the "
              "original (set MOONCAKE_CORE_COMPAT=1 to use mooncake_core)", file=sys.stderr)
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif os.path.isfile(args[0]):
        sys.argv = args
        sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
        runpy.run_path(args[0], run_name="__main__")
    else:
        fn = _console_script(args[0])
        sys.argv = args
        raise SystemExit(fn())


if __name__ == "__main__":
    main()
