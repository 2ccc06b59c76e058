"""The public dataclasses as the docs show them match the classes.

Wherever README.md, a page of docs/ or a docstring of coord (the API reference is made
from them) gives a dataclass's constructor shape, such as
``coord.Waiter(key, fence, holding, identity, since)`` (a call whose arguments are all
bare names), those names are its fields, all of them, in order; a trailing ``...``
stands for the rest. And every field is described in the class's docstring
(``:ivar name:``).

Classes of ``coord`` and ``coord.kafka`` are recognized by their bare names too;
those of ``coord.testing`` only with the module (``coord.testing.ServerTLS(...)``).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: Module -> whether its classes are recognized by their bare names in the docs.
MODULES = {"coord": True, "coord.kafka": True, "coord.testing": False}

_NAME = re.compile(r"[A-Za-z_]\w*\Z")


def _dataclasses() -> dict[str, type]:
    """``"coord.Waiter"`` (and ``"Waiter"`` for bare-name modules) -> the class."""
    found: dict[str, type] = {}
    for module_name, bare in MODULES.items():
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
                assert obj.__dataclass_params__.frozen, f"{name}: public dataclasses are frozen"  # type: ignore[attr-defined]
                found[f"{module_name}.{name}"] = obj
                if bare:
                    assert found.setdefault(name, obj) is obj, f"two public {name}"
    return found


CLASSES = _dataclasses()


def _shapes(text: str) -> list[tuple[int, str, list[str]]]:
    """(line, class name as written, argument names) of every constructor shape."""
    names = "|".join(sorted(map(re.escape, CLASSES), key=len, reverse=True))
    call = re.compile(rf"(?<![\w.])({names})\(([^()]*)\)")
    shapes = []
    for match in call.finditer(text):
        args = [a.strip(" \n`") for a in match[2].split(",")]
        if args and all(_NAME.match(a) or a == "..." for a in args):
            shapes.append((text.count("\n", 0, match.start()) + 1, match[1], args))
    return shapes


def test_the_docs_show_constructor_shapes() -> None:
    shown = {name for page in PAGES for _, name, _ in _shapes(page.read_text())}
    assert {"coord.Waiter", "Leader", "JobRef", "coord.Histogram"} <= shown


def _docstrings(path: Path) -> str:
    """The docstrings of a module, at their lines (the rest blank)."""
    lines = [""] * (path.read_text().count("\n") + 1)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):
                lines[node.lineno - 1] = node.value.value
    return "\n".join(lines)


def _wrong(where: str, text: str) -> list[str]:
    wrong = []
    for line, name, args in _shapes(text):
        fields = [f.name for f in dataclasses.fields(CLASSES[name])]
        shown = args[: args.index("...")] if "..." in args else args
        expected = fields[: len(shown)] if "..." in args else fields
        if shown != expected:
            wrong.append(f"{where}:{line}: {name}({', '.join(args)}): fields {fields}")
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_shapes_in_the_docs_are_the_fields(page: Path) -> None:
    assert _wrong(page.name, page.read_text()) == []


def test_shapes_in_the_docstrings_are_the_fields() -> None:
    sources = sorted((ROOT / "coord").rglob("*.py"))
    assert [w for p in sources for w in _wrong(str(p.relative_to(ROOT)), _docstrings(p))] == []


@pytest.mark.parametrize("name", sorted({c.__qualname__ for c in CLASSES.values()}))
def test_every_field_is_in_the_docstring(name: str) -> None:
    cls = next(c for c in CLASSES.values() if c.__qualname__ == name)
    doc = inspect.getdoc(cls) or ""
    missing = [f.name for f in dataclasses.fields(cls) if f":ivar {f.name}:" not in doc]
    assert missing == [], f"{name}'s docstring has no :ivar: for {missing}"
