"""No import cycles among the modules under services/.

The graph is read from the source with `ast`, so it holds every import a module makes: at the
top, inside functions (a lazy import is still a dependency), and under `if TYPE_CHECKING:`.
TYPE_CHECKING-only imports count: a module that needs another's types to be understood depends
on it as much as one that calls it, and a cycle hidden behind TYPE_CHECKING is still a cycle a
maintainer has to walk (the fix is to move the shared type down, or to state what is needed as
a Protocol in the lower module).

Edges: `import a.b` -> `a.b`; `from a import b` -> `a.b` when that is a module, else `a` (a
name the package's `__init__` defines); relative imports resolved against the importing
module's package. The implicit import of a module's parent packages is not an edge (every
submodule import runs them, and a package re-exporting its submodules is no cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def modules_under(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` (a directory under `root`) by dotted name."""
    found: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool) -> list[str]:
    """The dotted names an import statement of module `name` reaches (see the docstring)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = name.split(".") if is_package else name.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, *([node.module] if node.module else [])])
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def import_graph(modules: dict[str, Path]) -> nx.DiGraph:
    """module -> module it imports, among `modules` only (see the module docstring)."""
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            targets = _targets(node, name, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):  # `from a import b`: the module a.b, else a
                base = targets.pop()
                targets = [t if t in modules else base for t in targets]
            for target in targets:
                while target and target not in modules:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph.add_edge(name, target)
    return graph


def cycles(graph: nx.DiGraph) -> list[list[str]]:
    """Every elementary cycle, each as the modules on it, sorted."""
    found = []
    for component in nx.strongly_connected_components(graph):
        if len(component) > 1:
            found.extend(nx.simple_cycles(graph.subgraph(component)))
    return sorted(found)


def _write(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules_under(root, "pkg")


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param(
            {"pkg/__init__.py": "", "pkg/a.py": "import pkg.b\n", "pkg/b.py": "import pkg.a\n"},
            [["pkg.a", "pkg.b"]],
            id="top-level-imports",
        ),
        pytest.param(
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "from pkg.b import f\n",
                "pkg/b.py": "def f():\n    from pkg import a\n",
            },
            [["pkg.a", "pkg.b"]],
            id="import-inside-a-function",
        ),
        pytest.param(
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "from pkg.b import f\n",
                "pkg/b.py": "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pkg.a import A\n",
            },
            [["pkg.a", "pkg.b"]],
            id="type-checking-import-counts",
        ),
        pytest.param(
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "from . import b\n",
                "pkg/b.py": "from .a import x\n",
            },
            [["pkg.a", "pkg.b"]],
            id="relative-imports",
        ),
        pytest.param(
            {
                "pkg/__init__.py": "from pkg.a import x\n",
                "pkg/a.py": "import pkg.b\n",
                "pkg/b.py": "",
            },
            [],
            id="package-re-exporting-its-module-is-no-cycle",
        ),
        pytest.param(
            {"pkg/__init__.py": "from pkg.a import x\n", "pkg/a.py": "from pkg import y\n"},
            [["pkg", "pkg.a"]],
            id="module-importing-its-package-init",
        ),
    ],
)
def test_the_graph_sees_every_kind_of_import(
    tmp_path: Path, files: dict[str, str], expected: list[list[str]]
) -> None:
    assert [sorted(c) for c in cycles(import_graph(_write(tmp_path, files)))] == expected


def test_services_have_no_import_cycles() -> None:
    modules = modules_under(ROOT, "services")
    assert "services.allocator.core.solver" in modules
    found = cycles(import_graph(modules))
    assert found == [], "import cycles under services/:\n" + "\n".join(
        " -> ".join([*cycle, cycle[0]]) for cycle in found
    )
