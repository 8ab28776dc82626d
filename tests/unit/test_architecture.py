"""Structure rules of the code base (docs/architecture.md): no import cycle between modules of
mooncake_core, mooncake_proxy and mooncake_connectors, and the proxy imports no connector
module. (There is no size limit per module any more: it pushed cohesive parts to be cut into
files that import each other; cohesion is the goal, not size.)

The import graph is read from the source (module-level imports only: an import inside a
function or under ``if TYPE_CHECKING:`` runs late or never, so it cannot make a cycle at
import time); an import names the module it says, not its parent packages."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"mooncake_core": ROOT / "mooncake_core", "mooncake_proxy": ROOT / "mooncake_proxy",
            "mooncake_connectors": ROOT / "mooncake_connectors"}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg, base in PACKAGES.items():
        for p in base.rglob("*.py"):
            rel = p.relative_to(base).with_suffix("")
            parts = [pkg, *rel.parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for n in nodes:
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                found.append(n)
            elif isinstance(n, ast.If):
                test = ast.unparse(n.test)
                if "TYPE_CHECKING" not in test:
                    visit(n.body)
                visit(n.orelse)
            elif isinstance(n, ast.Try):
                visit(n.body)
                for h in n.handlers:
                    visit(h.body)
                visit(n.orelse)
                visit(n.finalbody)
    visit(tree.body)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in _top_level_imports(ast.parse(path.read_text())):
            for t in _targets(node, name, path, mods):
                if t in mods and t != name:
                    graph[name].add(t)
    return graph


def _targets(node: ast.Import | ast.ImportFrom, name: str, path: Path, mods: dict[str, Path]) -> list[str]:
    """The modules an import statement of module ``name`` (file ``path``) names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        anchor = here.split(".")
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles() -> None:
    cycles = _cycles(_graph())
    assert not cycles, f"import cycles (move the shared part into a leaf module): {cycles}"


def test_cycle_detector_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _all_imports(path: Path) -> set[str]:
    """Every module a file names in an import, wherever the import stands (function bodies and
    ``if TYPE_CHECKING:`` blocks too: a dependency is a dependency even when it loads late)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def test_the_proxy_imports_no_connector() -> None:
    """The router speaks the PD contract (mooncake_core.pd), not one framework's adapter."""
    bad = {str(p.relative_to(ROOT)): sorted(m for m in _all_imports(p) if m.split(".")[0] == "mooncake_connectors")
           for p in (ROOT / "mooncake_proxy").rglob("*.py")}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"mooncake_proxy imports connector modules (move the shared part to mooncake_core.pd): {bad}"


# ---------------------------------------------------------------- parts held to the stricter rules
#: every shipped package is held to them: no import cycle of any kind (an import under
#: ``TYPE_CHECKING`` or inside a function counts: it still says one module needs the other),
#: and no private attribute of another module's object read or written (``x._name`` where
#: ``_name`` is not this module's own) -- a new module starts held to them
STRICT_PARTS = ("mooncake_core", "mooncake_proxy", "mooncake_connectors")
#: deliberate exceptions, (module, attribute): each says why
PRIVATE_ALLOWED: set[tuple[str, str]] = {
    # vLLM's connector factory has no public "is this name registered" query
    ("mooncake_connectors.vllm.plugin", "_registry"),
    # vLLM's Request has no public way to drop the prompt's last token before scheduling; vLLM's
    # own Mooncake, MoRIIO and NIXL connectors pop it from the same list
    ("mooncake_connectors.vllm.p2p_scheduler", "_all_token_ids"),
    # our own marker on the function we wrap (of torch), so a second patch is skipped
    ("mooncake_connectors.vllm.plugin", "_mooncake_shim"),
}


def _strict(name: str) -> bool:
    return name.startswith(STRICT_PARTS)


def _all_import_graph(names: set[str]) -> dict[str, set[str]]:
    """The import graph among ``names`` counting every import (module level, under
    TYPE_CHECKING, inside functions)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in names}
    for name in names:
        path = mods[name]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name].update(t for t in _targets(node, name, path, mods) if t in names and t != name)
    return graph


def _foreign_private_access(path: Path) -> list[tuple[int, str]]:
    """(line, ``x._name``) for each private attribute this module reads or writes on an
    object other than ``self``/``cls`` whose name this module does not define itself."""
    tree = ast.parse(path.read_text())
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            own.add(node.attr)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    own.add(t.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)  # a dataclass field (or annotated name) this module declares
        elif isinstance(node, ast.ClassDef):
            pass
    for node in ast.walk(tree):  # __slots__ names are the module's own attributes too
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            for elt in getattr(node.value, "elts", []):
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                    own.add(elt.value)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        a = node.attr
        if not a.startswith("_") or a.startswith("__") or a in own:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        out.append((node.lineno, f"{ast.unparse(node.value)}.{a}"))
    return out


def test_strict_parts_have_no_import_cycle_of_any_kind() -> None:
    names = {m for m in _modules() if _strict(m)}
    assert names, "STRICT_PARTS names no module"
    cycles = _cycles(_all_import_graph(names))
    assert not cycles, (f"import cycles among {STRICT_PARTS} (TYPE_CHECKING and function-level imports "
                        f"count): give the shared interface a leaf module: {cycles}")


def test_strict_parts_touch_no_other_modules_private_state() -> None:
    mods = _modules()
    bad = {}
    for name, path in mods.items():
        if _strict(name):
            found = [f"{line}: {expr}" for line, expr in _foreign_private_access(path)
                     if (name, expr.rpartition(".")[2]) not in PRIVATE_ALLOWED]
            if found:
                bad[name] = found
    assert not bad, f"private attributes of other modules' objects (make it a public method): {bad}"


def test_the_strict_checks_see_what_they_forbid(tmp_path) -> None:
    p = tmp_path / "m.py"
    p.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\n"
                 "class A:\n    def __init__(self):\n        self._mine = 1\n"
                 "def f(st, a: A):\n    import y\n    st._last_version += 1\n    return a._mine\n")
    assert _foreign_private_access(p) == [(9, "st._last_version")]
    assert _cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
