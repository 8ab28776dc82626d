"""The shipped packages never import the lab harness or the benches.

``mooncake_lab`` and ``bench`` exist only in a checkout (pyproject lists neither), so an import of
either from ``mooncake_core``, ``mooncake_proxy`` or ``mooncake_connectors`` would work in the repo
and fail in every installed wheel. Read from the source (imports at any depth, TYPE_CHECKING
included), not by importing it.
"""

from __future__ import annotations

import ast
import pathlib
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # requires-python is 3.10: tomllib is 3.11+, its backport comes with the test extra
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = ("mooncake_core", "mooncake_proxy", "mooncake_connectors")
CHECKOUT_ONLY = ("mooncake_lab", "bench")


def _imported_roots(path: pathlib.Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_shipped_packages_do_not_import_the_lab_or_the_benches() -> None:
    offenders = []
    for pkg in SHIPPED:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            bad = _imported_roots(path) & set(CHECKOUT_ONLY)
            if bad:
                offenders.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not offenders, "checkout-only packages imported by shipped code:\n" + "\n".join(offenders)


def test_the_lab_and_the_benches_are_not_in_the_wheel() -> None:
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert not [p for p in listed if p.split(".")[0] in CHECKOUT_ONLY]
