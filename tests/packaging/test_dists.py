"""The sdist and the wheel: metadata as PyPI reads it, and the files each one holds."""

from __future__ import annotations

import sys
import tarfile
import zipfile
from typing import TYPE_CHECKING

import pytest
from packaging.metadata import Metadata
from packaging.requirements import Requirement

from .conftest import optional_dependencies, output, run

if TYPE_CHECKING:
    from pathlib import Path

    from .conftest import Dists

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _package_files(source: Path) -> set[str]:
    """The files of the ``coord`` package in the source tree, as paths in a wheel."""
    return {
        path.relative_to(source).as_posix()
        for path in (source / "coord").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def _wheel_metadata(dists: Dists) -> Metadata:
    with zipfile.ZipFile(dists.wheel) as wheel:
        text = wheel.read("coord-0.1.0.dist-info/METADATA").decode()
    return Metadata.from_email(text, validate=True)


def test_twine_check_passes(dists: Dists) -> None:
    result = run(sys.executable, "-m", "twine", "check", "--strict", dists.sdist, dists.wheel)
    assert result.returncode == 0, output(result)


def test_the_wheel_metadata_is_what_pyproject_says(dists: Dists) -> None:
    metadata = _wheel_metadata(dists)
    assert (metadata.name, str(metadata.version)) == ("coord", "0.1.0")
    assert metadata.license_expression == "Apache-2.0"
    assert str(metadata.requires_python) == ">=3.11"
    assert metadata.description_content_type == "text/markdown"
    assert metadata.description == (dists.source / "README.md").read_text()
    assert metadata.classifiers is not None
    assert "Typing :: Typed" in metadata.classifiers


def test_each_extra_requires_what_pyproject_lists(dists: Dists) -> None:
    metadata = _wheel_metadata(dists)
    extras = optional_dependencies()
    assert {str(extra) for extra in metadata.provides_extra or []} == set(extras)
    by_extra: dict[str, set[str]] = {}
    for requirement in metadata.requires_dist or []:
        marker = requirement.marker
        requirement.marker = None
        owner = next((e for e in extras if marker and marker.evaluate({"extra": e})), "")
        by_extra.setdefault(owner, set()).add(str(requirement))
    assert by_extra.pop("") == {"anyio>=4.4"}
    expected = {extra: {str(Requirement(s)) for s in specs} for extra, specs in extras.items()}
    assert by_extra == expected


def test_the_wheel_holds_the_whole_package_and_nothing_else(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as wheel:
        names = set(wheel.namelist())
        entry_points = wheel.read("coord-0.1.0.dist-info/entry_points.txt").decode()
    info = {name for name in names if name.startswith("coord-0.1.0.dist-info/")}
    assert names - info == _package_files(dists.source)
    assert "coord/py.typed" in names
    assert {"coord/backends/etcd/__init__.py", "coord/cli/__init__.py"} <= names
    assert "coord = coord.cli:main" in entry_points
    assert "coord = coord.testing.pytest_plugin" in entry_points


def test_the_sdist_holds_the_source_without_the_tests(dists: Dists) -> None:
    with tarfile.open(dists.sdist) as sdist:
        names = {name.partition("/")[2] for name in sdist.getnames()}
    assert {"pyproject.toml", "README.md", "PKG-INFO", "coord/py.typed"} <= names
    assert _package_files(dists.source) <= names
    assert not {name for name in names if name.startswith("tests")}
