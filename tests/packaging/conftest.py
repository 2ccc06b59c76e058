"""The package as users get it: the sdist and the wheel, built once per test session, and
fresh virtualenvs (no dev venv, no dependency groups) with the wheel installed as users
install it: ``coord[<extra>]`` for each extra alone, ``coord[all]``, and plain ``coord``.

Speed (this runs in CI on 2 cores next to the rest of the suite): the build runs without
build isolation (the backend comes from the test group); one ``pip download`` fetches every
dependency of every extra into a wheelhouse (pip's cache makes it quick); each virtualenv
is made without pip and filled by this venv's pip from the wheelhouse alone
(``--no-index``, no bytecode compiled), a few at a time; each then runs ``probe.py`` once.

Without the package index the download fails: a loud skip on a laptop, a failure in CI.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).parents[2]
PROBE = Path(__file__).with_name("probe.py")

#: The virtualenvs: ``coord[<name>]``; ``none`` is plain ``coord``.
VENVS = ("none", "etcd", "zookeeper", "kafka", "cli", "otel", "dev", "all")

# What a copy of the source tree leaves out: the tree as a fresh clone has it.
_NOT_SOURCE = (".git", ".venv*", "build", "dist", "site", "*.egg-info", "__pycache__", ".*cache")

# How pip says that it cannot reach the package index.
_OFFLINE = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "ConnectTimeoutError",
    "ProxyError",
)


@functools.cache
def optional_dependencies() -> dict[str, list[str]]:
    """pyproject.toml's extras."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        project: dict[str, Any] = tomllib.load(file)["project"]
    return dict(project["optional-dependencies"])


def extras(name: str) -> frozenset[str]:
    """The extras that ``coord[name]`` installs: itself and those it names (``coord[cli]``)."""
    if name == "none":
        return frozenset()
    found = {name}
    for spec in optional_dependencies()[name]:
        requirement = Requirement(spec)
        if canonicalize_name(requirement.name) == "coord":
            for extra in requirement.extras:
                found |= extras(extra)
    return frozenset(found)


def with_extra(extra: str) -> list[str]:
    """The virtualenvs that have *extra*."""
    return [name for name in VENVS if extra in extras(name)]


def clean_environment() -> dict[str, str]:
    """This process's environment without what would lead Python or coord elsewhere."""
    drop = ("PYTHON", "VIRTUAL_ENV", "COORD_", "CONDA_PREFIX")
    return {key: value for key, value in os.environ.items() if not key.startswith(drop)}


def run(*argv: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(arg) for arg in argv],
        capture_output=True,
        text=True,
        env=clean_environment(),
        timeout=timeout,
        check=False,
    )


def output(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


@dataclass(frozen=True)
class Dists:
    """The sdist and the wheel built from it, and the source tree they came from."""

    source: Path
    sdist: Path
    wheel: Path


@dataclass
class Venv:
    """A fresh virtualenv with ``coord[<name>]`` installed from the wheel."""

    name: str
    path: Path
    extras: frozenset[str]
    failure: str | None = None
    report: dict[str, Any] = field(default_factory=dict)  # probe.py's

    def bin(self, script: str) -> Path:
        return self.path / "bin" / script

    def probe(self, *args: str) -> dict[str, Any]:
        """Run ``probe.py`` here, in isolated mode (no script dir, no PYTHON* variables)."""
        result = run(self.bin("python"), "-I", PROBE, *args)
        if result.returncode != 0:
            raise AssertionError(f"probe.py {' '.join(args)} in {self.name}: {output(result)}")
        report: dict[str, Any] = json.loads(result.stdout)
        return report


@pytest.fixture(scope="session")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """``python -m build`` of a copy of the source tree: the sdist, then the wheel from
    the unpacked sdist (so the sdist is known to build)."""
    base = tmp_path_factory.mktemp("dists")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    out = base / "dist"
    result = run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, source)
    assert result.returncode == 0, output(result)
    [sdist] = out.glob("*.tar.gz")
    [wheel] = out.glob("*.whl")
    return Dists(source, sdist, wheel)


@pytest.fixture(scope="session")
def wheelhouse(dists: Dists, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every dependency of every extra, downloaded once (from pip's cache when it can)."""
    directory = tmp_path_factory.mktemp("wheelhouse")
    everything = ",".join(sorted(optional_dependencies()))
    requirement = f"coord[{everything}] @ {dists.wheel.as_uri()}"
    result = run(
        *(sys.executable, "-m", "pip", "download", "--quiet", "--retries", "1"),
        *("--timeout", "20", "--dest", directory, requirement),
        timeout=300,
    )
    if result.returncode != 0:
        offline = any(sign in result.stdout + result.stderr for sign in _OFFLINE)
        if offline and not os.environ.get("CI"):
            last = result.stderr.strip().splitlines()[-1:]
            pytest.skip(f"SKIPPED LOUDLY: the package index cannot be reached ({last})")
        pytest.fail(f"pip download of coord's dependencies failed: {output(result)}")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)  # 25 MB; pytest keeps 3 runs' temp dirs


@pytest.fixture(scope="session")
def venvs(
    dists: Dists, wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Venv]]:
    """Every virtualenv of :data:`VENVS`, made a few at a time, each with its report."""
    base = tmp_path_factory.mktemp("venvs")
    made = [Venv(name, base / name, extras(name)) for name in VENVS]
    with ThreadPoolExecutor(max_workers=3) as pool:
        list(pool.map(functools.partial(_make, wheel=dists.wheel, wheelhouse=wheelhouse), made))
    yield {venv.name: venv for venv in made}
    shutil.rmtree(base, ignore_errors=True)  # 150 MB


def _make(venv: Venv, wheel: Path, wheelhouse: Path) -> None:
    """Make *venv* and fill it; a step that fails is recorded in ``venv.failure``."""
    extra = "" if venv.name == "none" else f"[{venv.name}]"
    steps = [
        (sys.executable, "-m", "venv", "--without-pip", venv.path),
        (
            *(sys.executable, "-m", "pip", "--python", venv.bin("python"), "install"),
            *("--quiet", "--no-compile", "--no-index", "--find-links", wheelhouse),
            f"coord{extra} @ {wheel.as_uri()}",
        ),
    ]
    for step in steps:
        result = run(*step)
        if result.returncode != 0:
            venv.failure = f"{' '.join(map(str, step))}: {output(result)}"
            return
    try:
        venv.report = venv.probe("report")
    except AssertionError as exc:
        venv.failure = str(exc)


@pytest.fixture(params=VENVS)
def venv(request: pytest.FixtureRequest, venvs: dict[str, Venv]) -> Venv:
    """One virtualenv of :data:`VENVS` (parametrized; a test may narrow it, indirect)."""
    made = venvs[str(request.param)]
    if made.failure is not None:
        pytest.fail(f"making the {made.name} virtualenv failed: {made.failure}", pytrace=False)
    return made
