"""The public API: every name in coord.__all__ exists, is documented as coord.X, and the
top-level package never imports a backend (they load lazily, like anyio's)."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import TypeVar

import coord


def test_every_export_exists_and_lives_in_coord() -> None:
    for name in coord.__all__:
        obj = getattr(coord, name)
        assert getattr(obj, "__module__", "coord") == "coord", name


def test_exports_are_exactly_the_public_names() -> None:
    # (pytest's assertion rewriting adds "@py_..." names to the plugin's package)
    public = {n for n in dir(coord) if n[0] not in "_@" and n != "annotations"}
    modules = {"abc", "backends", "cli", "kafka", "otel", "testing"}
    assert set(coord.__all__) == public - modules


def test_what_public_calls_return_is_exported() -> None:
    """What an editor shows for ``election.campaign(...)``, ``queue.claim()`` or
    ``rw.read`` is a name the user can import from coord and find in the reference."""
    assert coord.Election.campaign.__annotations__["return"] == "Campaign"
    assert coord.Group.join.__annotations__["return"] == "Joining"
    assert coord.Queue.claim.__annotations__["return"] == "Claiming"
    assert coord.RWLock.__annotations__ == {"read": "RWLockSide", "write": "RWLockSide"}
    reference = (Path(__file__).parent.parent / "docs" / "reference.md").read_text()
    private = re.compile(r"(?<![\w.])_[A-Za-z]\w*")
    found = []
    for name in coord.__all__:
        obj = getattr(coord, name)
        assert f"::: coord.{name}\n" in reference, f"coord.{name} is not in docs/reference.md"
        if not inspect.isclass(obj):
            continue
        annotations = dict(getattr(obj, "__annotations__", {}))
        for attr, member in vars(obj).items():
            function = member.fget if isinstance(member, property) else member
            if (attr[0] != "_" or attr in ("__aenter__", "__aiter__", "__anext__")) and callable(
                function
            ):
                # (a private TypeVar, as in ``read(fn: Callable[..., _T]) -> _T``, is fine)
                typevars = {k for k, v in function.__globals__.items() if isinstance(v, TypeVar)}
                returns = function.__annotations__.get("return", "")
                if set(private.findall(returns)) - typevars:
                    found.append(f"{name}.{attr}() -> {returns}")
        found += [f"{name}.{a}: {t}" for a, t in annotations.items() if private.search(str(t))]
    assert found == []


def test_error_tree() -> None:
    assert issubclass(coord.LockLost, coord.SessionExpiredError)
    assert issubclass(coord.LeadershipLost, coord.LockLost)
    assert issubclass(coord.MembershipLost, coord.LockLost)
    assert issubclass(coord.ClaimLost, coord.LockLost)
    assert issubclass(coord.JobNotFound, LookupError)
    assert issubclass(coord.JobTimeout, TimeoutError)
    for exc in (
        coord.BackendError,
        coord.SessionExpiredError,
        coord.LockedError,
        coord.NotOwnerError,
        coord.ClosedError,
        coord.ConfigurationError,
        coord.OutcomeUnknown,
        coord.JobTimeout,
    ):
        assert issubclass(exc, coord.CoordError)
    assert issubclass(coord.NotOwnerError, RuntimeError)
    assert issubclass(coord.ConfigurationError, ValueError)
    assert issubclass(coord.BackendUnavailable, OSError)
    # Not a BackendUnavailable: code that reads that as "not applied" must not catch it.
    assert not issubclass(coord.OutcomeUnknown, coord.BackendError)


def test_importing_coord_imports_no_backend() -> None:
    code = (
        "import sys, coord; "
        "bad = [m for m in sys.modules if m.startswith(('coord.backends.', 'aetcd', 'kazoo', "
        "'grpc', 'aiokafka'))]; print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


#: The recipe layers: written once against coord.abc (tests/test_imports.py checks
#: their imports of coord's own modules; this, those of client libraries).
RECIPES = ["_locks", "_election", "_membership", "_jobs"]


def test_recipes_import_no_client_library() -> None:
    """Recipes never know which store runs them: none imports a store's client library
    (house style), at any level of the module."""
    import ast
    from pathlib import Path

    root = Path(coord.__file__).parent
    paths = [path for folder in RECIPES for path in sorted((root / folder).glob("*.py"))]
    assert len(paths) > 20
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
            elif isinstance(node, ast.Import):
                module = ",".join(alias.name for alias in node.names)
            else:
                continue
            for banned in ("aetcd", "kazoo", "grpc", "aiokafka", "hpack"):
                assert banned not in module, f"{path} imports {module}"
