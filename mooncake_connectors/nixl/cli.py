"""``mooncake_nixl_plugin``: build and install the NIXL backend plugin ``MooncakeCore``.

    mooncake_nixl_plugin install     build with the system C++ compiler and place the plugin
                                     beside the installed nixl's bundled plugins (UCX stays)
    mooncake_nixl_plugin path        print where the installed plugin is

Both refuse a nixl release the plugin was not written for, naming both versions.
Run it with the Python of the environment that has nixl (each venv has its own copy).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mooncake_connectors.nixl import abi, build, locate


def _find_checked() -> locate.NixlInstall:
    inst = locate.find_nixl()
    inst.check_abi()
    return inst


def cmd_install(args: argparse.Namespace) -> int:
    if args.plugin_dir:
        insts = [_find_checked()]
        targets = [Path(args.plugin_dir) / locate.PLUGIN_FILE]
    else:  # every nixl build of this environment (see locate.find_all)
        insts = locate.find_all()
        for inst in insts:
            inst.check_abi()
        targets = [inst.plugin_path for inst in insts]
    for inst, target in zip(insts, targets):
        print(f"[mooncake_nixl_plugin] nixl {inst.version} ({inst.package}), engine ABI checked "
              f"({inst.vtable_words()} words); plugin directory {target.parent}", flush=True)
        want = build.build_id()
        have = build.installed_build_id(target)
        if have == want and not args.force:
            print(f"[mooncake_nixl_plugin] {target} is up to date (build {want})")
            continue
        print(f"[mooncake_nixl_plugin] compiling {build.SOURCE.name} with {build.find_compiler(args.cxx)} ...",
              flush=True)
        try:
            bid = build.compile_plugin(target, args.cxx)
        except PermissionError as e:
            raise build.BuildFailed(f"cannot write {target}: {e}; run with a user that owns the environment, or "
                                    "pass --plugin-dir (then NIXL_PLUGIN_DIR must name it, which hides the "
                                    "bundled backends)") from None
        print(f"[mooncake_nixl_plugin] installed {target} (build {bid}); select it with backends=['MooncakeCore']")
    return 0


def cmd_path(args: argparse.Namespace) -> int:
    inst = _find_checked()
    p = inst.plugin_path
    if not p.is_file():
        print(f"[mooncake_nixl_plugin] not installed in {inst.plugin_dir}; run `mooncake_nixl_plugin install`",
              file=sys.stderr)
        return 1
    have, want = build.installed_build_id(p), build.build_id()
    if have != want:
        print(f"[mooncake_nixl_plugin] {p} is build {have}, this mooncake-core ships build {want}; "
              "run `mooncake_nixl_plugin install` to rebuild", file=sys.stderr)
    print(p)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mooncake_nixl_plugin", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    ins = sub.add_parser("install", help="build the plugin and put it beside nixl's bundled plugins")
    ins.add_argument("--cxx", help="C++ compiler to use (default: $CXX, else g++, else c++)")
    ins.add_argument("--force", action="store_true", help="rebuild even if the installed plugin is up to date")
    ins.add_argument("--plugin-dir", help="install here instead of the bundled plugin directory (NIXL then only "
                                          "finds it with NIXL_PLUGIN_DIR set, which hides UCX and the others)")
    ins.set_defaults(fn=cmd_install)
    pth = sub.add_parser("path", help="print the installed plugin's path (exit 1 if not installed)")
    pth.set_defaults(fn=cmd_path)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (abi.NixlAbiMismatch, locate.NixlNotFound, build.CompilerMissing, build.BuildFailed) as e:
        print(f"[mooncake_nixl_plugin] error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
