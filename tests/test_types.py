"""Types for users: a project of their own, outside this repository, sees coord's types.

mypy and pyright do not run setuptools' editable import hook: they find only packages on
a plain path. ``pyproject.toml`` declares ``package-dir`` so that ``pip install -e .``
writes a plain path entry instead of the hook; a regular install (a wheel, with
``py.typed``) needs nothing. pyright's ``--verifytypes`` checks
that the whole public API is typed (trio's ``check_type_completeness.py``).

The tools run in a temporary directory, as a user's project would. A missing pyright is
a skip on a laptop and a failure when ``CI`` is set.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

_USER_CODE = """\
from __future__ import annotations

import anyio
import coord


async def main() -> None:
    async with coord.connect("memory://") as client:
        async with client.mutex("orders/42") as hold:
            fence: int = hold.fence
            stats: coord.ClientStatistics = client.statistics()
            print(fence, stats.sessions_opened)
        oops: str = hold.fence  # the deliberate error: an int is not a str


anyio.run(main)
"""


def _user_project(tmp_path: Path) -> Path:
    project = tmp_path / "user-project"
    project.mkdir()
    (project / "app.py").write_text(_USER_CODE)
    return project


def _environment() -> dict[str, str]:
    """The user's environment: this virtualenv's tools first, no path hacks."""
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def _pyright() -> str:
    found = shutil.which("pyright", path=str(Path(sys.executable).parent))
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("pyright is not installed (it is in the lint group: ./scripts/bootstrap)")
        pytest.skip("pyright is not installed (pip install 'pyright[nodejs]')")
    return found


def test_mypy_in_a_user_project_finds_coord_and_its_types(tmp_path: Path) -> None:
    project = _user_project(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), "."],
        cwd=project,
        env=_environment(),
        capture_output=True,
        text=True,
    )
    out = result.stdout + result.stderr
    assert "import-not-found" not in out, out
    assert "app.py:13: error: Incompatible types in assignment" in out, out
    assert "Found 1 error in 1 file" in out, out


def test_pyright_in_a_user_project_finds_coord_and_its_types(tmp_path: Path) -> None:
    pyright = _pyright()
    project = _user_project(tmp_path)
    result = subprocess.run(
        [pyright, "--pythonpath", sys.executable, "--outputjson", "app.py"],
        cwd=project,
        env=_environment(),
        capture_output=True,
        text=True,
    )
    report = json.loads(result.stdout)
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    assert [(e["range"]["start"]["line"] + 1, e["rule"]) for e in errors] == [
        (13, "reportAssignmentType")
    ], errors


def test_pyright_verifytypes_reports_a_fully_typed_public_api(tmp_path: Path) -> None:
    pyright = _pyright()
    result = subprocess.run(
        [
            pyright,
            "--pythonpath",
            sys.executable,
            "--verifytypes",
            "coord",
            "--ignoreexternal",
            "--outputjson",
        ],
        cwd=tmp_path,
        env=_environment(),
        capture_output=True,
        text=True,
    )
    report = json.loads(result.stdout)["typeCompleteness"]
    problems = [
        f"{s['name']}: {d['message']}"
        for s in report["symbols"]
        for d in s["diagnostics"]
        if d["severity"] == "error"
    ]
    assert report["completenessScore"] == 1.0, problems
