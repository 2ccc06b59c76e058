"""Dependencies point one way: no module of coord imports one that imports it back.

The structure drawn from the imports once showed two circles (``_queue`` → ``_claiming``
→ ``_settle`` → ``_queue`` for ``Job``; ``_hold`` → ``_session`` → ``_waiters`` →
``_hold`` for ``fence_of``). Every import counts here: at module level, inside a
function, or under ``TYPE_CHECKING`` (a hidden circle is still a circle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import coord

ROOT = Path(coord.__file__).parent


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, modules: set[str], root: Path = ROOT) -> set[str]:
    """The coord modules that *path* imports, wherever the import statement is."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            source = ".".join(base) if node.level else ""
            source = ".".join(p for p in (source, node.module or "") if p)
            submodules = {f"{source}.{a.name}" for a in node.names} & modules
            found |= submodules
            if source in modules and len(submodules) < len(node.names):
                found.add(source)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = sorted(ROOT.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imported(p, modules) for p in paths}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            component.append(node)
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = import_graph()
    assert circles(graph) == []


def test_the_check_sees_a_circle_hidden_under_type_checking() -> None:
    graph = import_graph()
    assert "coord._jobs" in graph["coord._settle"]  # Job lives with the job encoding
    assert "coord._keys" in graph["coord._waiters"]  # fence_of with the key layout
    # What the circle of issue 18 looked like: settle typed Job from the queue.
    graph["coord._settle"].add("coord._queue")
    assert ["coord._claiming", "coord._queue", "coord._settle"] in circles(graph)


def test_imports_are_read_at_every_level(tmp_path: Path) -> None:
    package = tmp_path / "coord"
    package.mkdir()
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import x\n"
    )
    (package / "b.py").write_text("def f():\n    from . import a\n")
    modules = {"coord.a", "coord.b"}
    assert imported(package / "a.py", modules, package) == {"coord.b"}
    assert imported(package / "b.py", modules, package) == {"coord.a"}
