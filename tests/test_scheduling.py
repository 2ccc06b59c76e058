"""The suite's own scheduling (tests/conftest.py): which tests share a worker."""

from __future__ import annotations

from pathlib import Path

from .conftest import GROUPS, group_of

ROOT = Path(__file__).parent.parent


def test_each_group_names_tests_that_exist() -> None:
    """A renamed file or test would silently leave its group (and run beside the others)."""
    for prefix in GROUPS:
        path, _, test = prefix.partition("::")
        assert (ROOT / path).exists(), prefix
        if test:
            assert f"def {test}(" in (ROOT / path).read_text(), prefix


def test_groups_of_tests() -> None:
    faults = "tests/faults/test_faults.py::test_holder_killed"
    assert group_of(f"{faults}[queue-etcd]") == "faults-etcd"
    assert group_of(f"{faults}[cohort-zookeeper]") == "faults-zookeeper"
    assert group_of("tests/packaging/test_dists.py::test_twine_check") == "packaging"
    assert group_of("tests/cli/test_dev.py::test_x[single]") == "standard-ports"
    assert group_of("tests/cli/test_docs_output.py::test_shown_output_is_printed[x]") is None
    assert group_of("tests/contract/test_mutex.py::test_x[etcd-strict]") is None
