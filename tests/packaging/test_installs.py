"""The wheel installed as users install it, in a fresh virtualenv per extra (and with all,
and with none): it imports, each feature works where its extra is installed and names the
extra to install where it is not, and a mutex works on the store the extra brings."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .conftest import extras, optional_dependencies, output, run, with_extra

if TYPE_CHECKING:
    from .conftest import Venv

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

# The modules that need more than coord's own dependency (each with those under it).
_NEEDS = {
    "coord.backends.etcd": "etcd",
    "coord.backends.zookeeper": "zookeeper",
    "coord.kafka": "kafka",
    "coord.kafka._log": "kafka",  # coord.kafka's own (aiokafka's log records)
    "coord.otel": "otel",
    "coord.cli": "cli",
    "coord.testing.pytest_plugin": "pytest",  # loaded by pytest only (entry point pytest11)
}


def _needs(module: str) -> str | None:
    for prefix, extra in _NEEDS.items():
        if module == prefix or module.startswith(f"{prefix}."):
            return extra
    return None


def _distributions(extras: frozenset[str] | set[str]) -> set[str]:
    """The distributions that these extras name (not coord itself)."""
    names: set[str] = {
        canonicalize_name(Requirement(spec).name)
        for extra in extras
        for spec in optional_dependencies()[extra]
    }
    return names - {"coord"}


def _hint(extra: str, message: str) -> None:
    assert f"pip install 'coord[{extra}]'" in message, message
    assert len(message.strip().splitlines()) == 1, message


def test_coord_imports_from_the_virtualenv(venv: Venv) -> None:
    assert Path(venv.report["coord_file"]).is_relative_to(venv.path)
    assert venv.report["version"] == venv.report["metadata_version"] == "0.1.0"


def test_only_what_the_extras_bring_is_installed(venv: Venv) -> None:
    installed = {canonicalize_name(name) for name in venv.report["distributions"]}
    brought = _distributions(venv.extras)
    assert brought <= installed
    assert not installed & (_distributions(set(optional_dependencies())) - brought)
    if venv.name == "none":  # coord must work without what the dev venv has
        assert not installed & {"pytest", "trio", "sniffio"}


def test_every_module_imports_where_its_extra_is_installed(venv: Venv) -> None:
    modules: dict[str, dict[str, str] | None] = venv.report["modules"]
    assert {"coord", "coord.backends.memory", "coord.testing", "coord.cli.lock"} <= set(modules)
    broken = {
        module: error["message"]
        for module, error in modules.items()
        if error is not None and _needs(module) in {None, *venv.extras}
    }
    assert broken == {}


def test_a_feature_without_its_extra_names_the_extra(venv: Venv) -> None:
    for extra, error in venv.report["entry_points"].items():
        if extra in venv.extras:
            assert error is None, f"{extra} in coord[{venv.name}]: {error}"
        else:
            _hint(extra, error["message"])


def test_the_coord_command_runs_or_names_its_extra(venv: Venv) -> None:
    result = run(venv.bin("coord"), "--help")
    if "cli" in venv.extras:
        assert result.returncode == 0, output(result)
        assert result.stdout.startswith("Usage: coord"), output(result)
    else:
        assert (result.returncode, result.stdout) == (1, ""), output(result)
        _hint("cli", result.stderr)


@pytest.mark.parametrize(
    "venv", [name for name in with_extra("cli") if "etcd" not in extras(name)], indirect=True
)
def test_the_coord_command_names_the_extra_of_a_store(venv: Venv) -> None:
    for url, extra in [("etcd://127.0.0.1:9/x", "etcd"), ("zk://127.0.0.1:9/x", "zookeeper")]:
        result = run(venv.bin("coord"), "lock", "--url", url, "demo", "--", "true")
        assert (result.returncode, result.stdout) == (1, ""), output(result)
        _hint(extra, result.stderr)


@pytest.mark.parametrize("venv", with_extra("dev"), indirect=True)
def test_coord_dev_comes_with_the_dev_extra(venv: Venv) -> None:
    result = run(venv.bin("coord"), "dev", "--help")
    assert result.returncode == 0, output(result)


def test_a_mutex_round_trip_on_memory(venv: Venv) -> None:
    first, second = venv.report["memory_fences"]
    assert first < second


@pytest.mark.etcd
@pytest.mark.parametrize("venv", with_extra("etcd"), indirect=True)
def test_a_mutex_round_trip_on_etcd(venv: Venv, etcd_url: str) -> None:
    first, second = venv.probe("mutex", etcd_url)["fences"]
    assert first < second


@pytest.mark.zookeeper
@pytest.mark.parametrize("venv", with_extra("zookeeper"), indirect=True)
def test_a_mutex_round_trip_on_zookeeper(venv: Venv, zookeeper_url: str) -> None:
    first, second = venv.probe("mutex", zookeeper_url)["fences"]
    assert first < second
