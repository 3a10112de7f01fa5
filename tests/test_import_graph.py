"""The import graph: no module and no package imports itself through others, and the layers are leaves.

Every import counts, those inside functions too, except under `if TYPE_CHECKING:` (never run). A
package is the first name under tokenpath (`sim`, `engine`, `cli`); a module at the root is its own.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import rustworkx as rx

import tokenpath

SRC = pathlib.Path(tokenpath.__file__).parent
LAYERS = ("workload", "compute", "fabric", "delivery")
# What a layer may import besides itself: the ground floor (config, the embedded catalog, which
# imports only config) and the prefix keys that workload/ makes and engine/ reads.
BELOW_THE_LAYERS = ("config", "catalog", "prefixes")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(SRC.rglob("*.py"))}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(node: ast.AST, module: str) -> list[str]:
    """The tokenpath modules an import statement loads: `from a import b` loads `a.b` where that is a
    module, else `a` (b is a name in it)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the module's package, up level - 1
        package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
        parent = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parent + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]


def imports_of(module: str) -> set[str]:
    """The tokenpath modules `module` imports, anywhere in it but under `if TYPE_CHECKING:`."""
    found: set[str] = set()
    pending: list[ast.AST] = [ast.parse(MODULES[module].read_text(encoding="utf-8"))]
    while pending:
        node = pending.pop()
        if _is_type_checking(node):
            pending.extend(node.orelse)
            continue
        found.update(target for target in _imported(node, module) if target in MODULES and target != module)
        pending.extend(ast.iter_child_nodes(node))
    return found


def graph(edges: set[tuple[str, str]]) -> rx.PyDiGraph:
    g = rx.PyDiGraph()
    index = {name: g.add_node(name) for name in sorted({name for edge in edges for name in edge})}
    g.add_edges_from_no_data([(index[a], index[b]) for a, b in sorted(edges)])
    return g


def circles(g: rx.PyDiGraph, shown: int = 5) -> str:
    found = []
    for cycle in rx.simple_cycles(g):
        found.append(" -> ".join(g[i] for i in [*cycle, cycle[0]]))
        if len(found) == shown:
            break
    return "\n".join(found)


def file_edges() -> set[tuple[str, str]]:
    return {(module, target) for module in MODULES for target in imports_of(module)}


def test_no_module_imports_itself_through_others():
    g = graph(file_edges())
    assert rx.is_directed_acyclic_graph(g), f"import circles between modules:\n{circles(g)}"


def test_no_package_imports_itself_through_others():
    edges = {(package_of(a), package_of(b)) for a, b in file_edges() if package_of(a) != package_of(b)}
    g = graph(edges)
    assert rx.is_directed_acyclic_graph(g), f"import circles between packages:\n{circles(g)}"


def test_the_layers_import_only_the_ground_floor():
    above = sorted(f"{module} -> {target}" for module in MODULES if package_of(module) in LAYERS
                   for target in imports_of(module)
                   if package_of(target) not in (package_of(module), *BELOW_THE_LAYERS))
    assert not above, f"a layer imports from above the ground floor: {above}"
    ground = sorted(f"{module} -> {target}" for module in MODULES if package_of(module) in BELOW_THE_LAYERS
                    for target in imports_of(module) if package_of(target) not in (package_of(module), "config"))
    assert not ground, f"the ground floor imports from above it: {ground}"


def test_the_walk_sees_every_kind_of_import(tmp_path, monkeypatch):
    """The walk itself: imports at the top, in functions, relative and of names, but not under
    TYPE_CHECKING."""
    fake = {"tokenpath.a": tmp_path / "a.py", "tokenpath.b": tmp_path / "b.py", "tokenpath.c": tmp_path / "c.py",
            "tokenpath.pkg": tmp_path / "pkg" / "__init__.py", "tokenpath.pkg.d": tmp_path / "pkg" / "d.py"}
    monkeypatch.setattr(f"{__name__}.MODULES", fake)
    fake["tokenpath.a"].write_text(
        "from typing import TYPE_CHECKING\nimport json\nfrom tokenpath.b import thing\n"
        "if TYPE_CHECKING:\n    from tokenpath import c\nelse:\n    pass\n"
        "def f():\n    from .pkg import d\n    import tokenpath.pkg\n", encoding="utf-8")
    assert imports_of("tokenpath.a") == {"tokenpath.b", "tokenpath.pkg.d", "tokenpath.pkg"}
    assert circles(graph({("x", "y"), ("y", "x")})) in ("x -> y -> x", "y -> x -> y")


# Libraries some commands need and the command line's start-up does not: imported where they are used
# (scipy.special alone took a third of `tokenpath run`'s start-up).
NOT_AT_START_UP = ("scipy", "pandas", "pyarrow", "ray", "tokenizers", "matplotlib")


def test_the_command_line_starts_without_the_libraries_only_some_commands_need():
    code = f"import sys, tokenpath.cli; print(sorted(m for m in {NOT_AT_START_UP!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
