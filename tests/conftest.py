from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from blockbuster import blockbuster_ctx

if TYPE_CHECKING:
    from collections.abc import Iterator

    from blockbuster import BlockBuster

# Unit tests run on both event loops (anyio's own conftest does the same).
# Trio without an explicit clock; TTL tests ask for trio's MockClock themselves.


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def blockbuster() -> Iterator[BlockBuster]:
    """Fail any test that makes a blocking call on the event loop."""
    yield from _watch_for_blocking_calls()


def _watch_for_blocking_calls() -> Iterator[BlockBuster]:
    with blockbuster_ctx("coord") as bb:
        # connect() checks that TLS files exist, at the call (one stat of a local file).
        bb.functions["os.stat"].can_block_in("coord/backends/_common/tls.py", "_check_readable")
        yield bb


@pytest.fixture
def etcdctl() -> str:
    """Debian's ``etcdctl`` (package etcd-client), the Go peer of ``layout="etcd"``: a
    loud skip on a laptop without it, a failure in CI (``scripts/bootstrap`` installs it)."""
    found = shutil.which("etcdctl")
    if found is None:
        reason = "etcdctl not installed (Debian: apt-get install etcd-client)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set: a missing tool fails the run)", pytrace=False)
        pytest.skip(f"SKIPPED LOUDLY: {reason}")
    return found


@pytest.fixture
def guard_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Holds arm their guard watch at once (GUARD_DELAY 0), as soon as they exist.

    For tests that count server messages over a window: with the default delay a guard
    armed by a waiter registered a second earlier could land in the window (on a slow
    machine), and the count would depend on timing."""
    import coord._locks.hold

    monkeypatch.setattr(coord._locks.hold, "GUARD_DELAY", 0.0)


#: What ``pytest -m "not slow"`` (the quick loop) leaves out, relative to tests/: the
#: multi-process fault suite, the installs of the packaging test, subprocess-driven CLI,
#: example and docs runs, type checkers, and the integration tests that wait out TTLs,
#: restarts and outages. The conformance suite (tests/contract) on every store stays in.
SLOW = (
    "faults/",
    "packaging/",
    "cli/",
    "test_docs.py",
    "test_examples.py",
    "test_types.py",
    "contract/test_burst.py",
    "integration/test_election_restart.py",
    "integration/etcd/test_cluster.py",
    "integration/etcd/test_faults.py",
    "integration/etcd/test_proxy_faults.py",
    "integration/etcd/test_security.py",
    "integration/zookeeper/test_faults.py",
    "integration/zookeeper/test_load.py",
    "integration/zookeeper/test_proxy_faults.py",
    "integration/kafka/test_zombie.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of :data:`SLOW` ``slow``."""
    tests = Path(__file__).parent
    for item in items:
        if item.path.relative_to(tests).as_posix().startswith(SLOW):
            item.add_marker(pytest.mark.slow)


#: Tests that run one after another on one worker (nodeid prefix -> group): those that
#: share what a session fixture builds once (the packaging test's wheel and virtualenvs),
#: and those that may listen on the stores' standard ports (``coord dev``), which only
#: one of them can do at a time. The fault suite's runs are grouped too, one group per
#: store (:func:`group_of`): at most two fault runs (each several processes and a server
#: of its own) share the machine at once, so that their recovery deadlines measure coord,
#: not a crowded CPU.
GROUPS = {
    "tests/packaging/": "packaging",
    "tests/cli/test_dev.py": "standard-ports",
    "tests/cli/test_walkthrough.py": "standard-ports",
    "tests/cli/test_docs_output.py::test_shown_dev_output_is_printed": "standard-ports",
}


#: The words of a fault test's id that name its store (a layout names the store it runs on).
_FAULT_STORES = {
    "etcd": "etcd",
    "zookeeper": "zookeeper",
    "kazoo": "zookeeper",
    "curator": "zookeeper",
}


def group_of(nodeid: str) -> str | None:
    """The group of the test *nodeid* (see :data:`GROUPS`), or None."""
    if nodeid.startswith("tests/faults/"):
        words = nodeid.rpartition("[")[2].rstrip("]").split("-")
        store = next((w for w in words if w in _FAULT_STORES), words[-1])
        return f"faults-{_FAULT_STORES.get(store, store)}"
    for prefix, group in GROUPS.items():
        if nodeid.startswith(prefix):
            return group
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Schedule each test on its own, except the groups of :func:`group_of`, each of
    which runs on one worker (the largest first). xdist's own ``--dist loadgroup`` does
    this from ``xdist_group`` marks by renaming each test's nodeid, which pytest 9.2's
    nodes no longer take (the groups were silently spread over all workers)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or nodeid

    return GroupScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per core, at least 4 and at most 8 (or
    ``$PYTEST_XDIST_AUTO_NUM_WORKERS``). The suite mostly waits (TTLs, outages, servers
    answering), so it runs well above one worker per core: 4 on a 2-core machine. (6
    there took 426-448 s instead of 560-580, but under that load the crash test's 100 ms
    bound missed once, at 117 and 152 ms: tests/integration/test_queue_crash.py.)"""
    given = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if given:
        return int(given)
    return min(8, max(4, 2 * (os.cpu_count() or 1)))
