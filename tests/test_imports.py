"""Dependencies point one way: down the layers that the folders of coord/ are, and in no
circle.

The layers, lowest first (ARCHITECTURE.md draws them):

* ``_core``: data types and helpers with no behaviour above them (exceptions, checks,
  the key layout, URLs, retry, statistics, background tasks);
* ``abc``: the backend contract;
* ``backends`` and ``_sessions``: the stores, and the sessions on them (peers: neither
  imports the other; a session knows a backend only through ``abc``);
* ``_locks``: the wait queue every recipe shares, holds, mutex, semaphore, rwlock;
* ``_election``, ``_membership``, ``_jobs``: the higher recipe families (peers);
* ``_client``: the client, the recipes' factory;
* the top: ``coord`` itself (the public API) and what is built on it: ``kafka``,
  ``otel``, the ``cli``, ``testing`` (one layer: they may use each other).

A module imports its own layer's folder and the layers below, never a layer above nor a
peer. Every import counts: at module level, inside a function, or under
``TYPE_CHECKING`` (a hidden circle is still a circle). The structure drawn from the
imports once showed two circles (the job queue, its claims and their endings for
``Job``; the hold, the session and the waiters' identity for ``fence_of``).
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


#: The layers, lowest first; the packages of one tuple are peers.
LAYERS: list[tuple[str, ...]] = [
    ("coord._core",),
    ("coord.abc",),
    ("coord.backends", "coord._sessions"),
    ("coord._locks",),
    ("coord._election", "coord._membership", "coord._jobs"),
    ("coord._client",),
    ("coord",),  # the API and what is built on it: kafka, otel, cli, testing
]


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, the package of that layer) of *module*: the longest prefix."""
    best: tuple[int, str] = (-1, "")
    for index, packages in enumerate(LAYERS):
        for package in packages:
            if (module == package or module.startswith(package + ".")) and len(package) > len(
                best[1]
            ):
                best = (index, package)
    assert best[0] >= 0, f"{module} is in no layer"
    return best


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a higher layer or a peer, as ``importer -> imported``."""
    found = []
    for module, imported_ in sorted(graph.items()):
        level, package = layer_of(module)
        for other in sorted(imported_):
            other_level, other_package = layer_of(other)
            if other_level > level or (other_level == level and other_package != package):
                found.append(f"{module} -> {other}")
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = import_graph()
    assert circles(graph) == []


def test_no_module_imports_a_higher_layer_or_a_peer() -> None:
    assert upward(import_graph()) == []


def test_at_most_8_modules_at_the_top_of_coord() -> None:
    """The rest sit in folders named for their layer."""
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= 8, top


def test_the_layer_check_sees_an_upward_import() -> None:
    graph = import_graph()
    graph["coord._locks.mutex"].add("coord._jobs.queue")  # a lock that knew the job queue
    graph["coord._sessions.session"].add("coord.backends.memory")  # a session naming a store
    graph["coord._membership.owner"].add("coord._jobs.records")  # a peer
    assert upward(graph) == [
        "coord._locks.mutex -> coord._jobs.queue",
        "coord._membership.owner -> coord._jobs.records",
        "coord._sessions.session -> coord.backends.memory",
    ]


def test_the_check_sees_a_circle_hidden_under_type_checking() -> None:
    graph = import_graph()
    assert "coord._jobs.records" in graph["coord._jobs.endings"]  # Job with the job encoding
    assert "coord._core.keys" in graph["coord._sessions.identity"]  # fence_of with the keys
    # What the circle once looked like: the endings typed Job from the queue.
    graph["coord._jobs.endings"].add("coord._jobs.queue")
    assert any({"coord._jobs.endings", "coord._jobs.queue"} <= set(c) for c in circles(graph))


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
